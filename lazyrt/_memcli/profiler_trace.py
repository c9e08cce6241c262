"""``lazyrt-mem read``: lazyrt's computations out of a ``torch.profiler`` trace.

A trace exported by ``torch.profiler`` around tpu work (``export_chrome_trace``, or the
folder ``tensorboard_trace_handler`` wrote) holds each lazyrt flush and, with
``profile_memory=True``, each strict op as an event whose args are lazyrt's record of it
(``_torch.profiler``), and lazyrt's allocations as ``[memory]`` events of device type
PrivateUse1. This module turns them back into the records and summary ``lazyrt-mem run``
prints.
"""
from __future__ import annotations

import glob
import gzip
import json
import os

_PRIVATEUSE1 = 20
_FIELDS = ("index", "mode", "trace_hash", "num_ops", "cache_hit", "compile_seconds",
           "execute_seconds", "argument_bytes", "output_bytes", "temp_bytes", "alias_bytes",
           "live_bytes_before", "live_bytes_after", "hbm_peak_bytes", "source",
           "start_seconds", "name")


class TraceError(Exception):
    """The file is no profiler trace lazyrt can read; the message is for the user."""


def find(path: str) -> str:
    """``path`` itself, or the newest trace in the folder ``path``."""
    if os.path.isdir(path):
        files = [f for pat in ("*.json", "*.json.gz") for f in glob.glob(os.path.join(path, pat))]
        if not files:
            raise TraceError(f"no trace (*.json, *.json.gz) in folder {path!r}")
        return max(files, key=os.path.getmtime)
    if not os.path.isfile(path):
        raise TraceError(f"no such file: {path!r}")
    return path


def load(path: str) -> tuple[dict, list[dict]]:
    """``(summary, records)`` of the trace at ``path`` (a file or a folder of traces)."""
    path = find(path)
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise TraceError(f"cannot read {path!r} as a Chrome trace: {e}") from None
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise TraceError(f"{path!r} has no traceEvents")
    records, spans, live = [], [], []
    for e in sorted((e for e in events if isinstance(e, dict) and "ts" in e),
                    key=lambda e: float(e["ts"])):
        a = e.get("args") or {}
        if e.get("ph") == "X":
            spans.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))))
            if a.get("lazyrt") in ("flush", "op") and "hbm_peak_bytes" in a:
                r = {k: a.get(k) for k in _FIELDS}
                r["largest_tensors"] = []
                r["recorded_at"] = a.get("recorded_at", [])
                records.append(r)
        elif e.get("name") == "[memory]" and a.get("Device Type") == _PRIVATEUSE1:
            live.append(int(a.get("Total Allocated", 0)))
    if not records and not live:
        raise TraceError(f"{path!r} has no lazyrt events (was it recorded around tpu work, "
                         "with lazyrt imported?)")
    return summarize(path, records, live, spans), records


def summarize(path: str, records: list[dict], live: list, spans: list) -> dict:
    peak = max(records, key=lambda r: r["hbm_peak_bytes"], default=None)
    hits = sum(1 for r in records if r["cache_hit"])
    modes = sorted({r["mode"] for r in records})
    after = [r["live_bytes_after"] for r in records]
    return {
        "script": path, "argv": [], "mode": "/".join(modes) or "-", "exit_status": 0,
        "error": None,
        "wall_seconds": (max(t for _, t in spans) - min(s for s, _ in spans)) / 1e6
        if spans else 0.0,
        "peak_bytes": max([peak["hbm_peak_bytes"] if peak else 0, *live]),
        "peak_where": peak["source"] if peak else "",
        "peak_index": peak["index"] if peak else -1,
        "live_peak_bytes": max(live or after or [0]),
        "live_bytes_at_exit": (live or after or [0])[-1],
        "num_records": len(records),
        "num_flushes": sum(1 for r in records if r["mode"] == "defer"),
        "num_executions": len(records),
        "num_ops": sum(r["num_ops"] for r in records),
        "cache_hits": hits, "cache_misses": len(records) - hits,
        "cache_hit_rate": hits / len(records) if records else None,
        "compile_seconds": sum(r["compile_seconds"] for r in records),
        "execute_seconds": sum(r["execute_seconds"] for r in records),
        "pending_ops_at_exit": 0, "device_stats": None,
    }

"""The files ``lazyrt-mem run`` writes: JSON report, Chrome/Perfetto trace, PNG plot."""
from __future__ import annotations

import json
import os

from .report import SCHEMA


class OutputError(Exception):
    """An output file cannot be written; the message is for the user."""


def check_writable(path: str, what: str) -> None:
    """Fail early (before the script runs) when ``path`` cannot be written."""
    d = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise OutputError(f"cannot write {what} file {path!r}: it is a directory")
    if not os.path.isdir(d):
        raise OutputError(f"cannot write {what} file {path!r}: directory {d!r} does not exist")
    if os.path.exists(path):
        ok = os.access(path, os.W_OK)
    else:
        ok = os.access(d, os.W_OK | os.X_OK)
    if not ok:
        raise OutputError(f"cannot write {what} file {path!r}: permission denied")


def _write(path: str, what: str, data, binary: bool = False) -> None:
    try:
        with open(path, "wb" if binary else "w") as f:
            f.write(data)
    except OSError as e:
        raise OutputError(f"cannot write {what} file {path!r}: {e.strerror or e}") from None


def write_json(path: str, summary: dict, records: list[dict]) -> None:
    doc = {"schema": SCHEMA, "summary": summary, "records": records}
    _write(path, "--json", json.dumps(doc, indent=1, default=str) + "\n")


def _phases(r: dict) -> tuple[float, float]:
    """(compile start, execute start) in seconds. A defer record starts when its flush
    began (compile first); a strict record starts when it executed (compiled just before)."""
    t = r["start_seconds"]
    if r["mode"] == "defer":
        return t, t + r["compile_seconds"]
    return t - r["compile_seconds"], t


def trace_events(summary: dict, records: list[dict]) -> dict:
    """Chrome trace event format (opens in ui.perfetto.dev and chrome://tracing)."""
    pid = 1
    ev = [
        {"ph": "M", "pid": pid, "name": "process_name",
         "args": {"name": f"lazyrt-mem {summary['mode']}: {os.path.basename(summary['script'])}"}},
        {"ph": "M", "pid": pid, "tid": 1, "name": "thread_name", "args": {"name": "compile"}},
        {"ph": "M", "pid": pid, "tid": 2, "name": "thread_name", "args": {"name": "execute"}},
    ]
    us = 1e6
    t0 = min((_phases(r)[0] for r in records), default=0.0)
    for r in records:
        c0, x0 = _phases(r)
        args = {"index": r["index"], "mode": r["mode"], "source": r["source"], "name": r["name"],
                "num_ops": r["num_ops"], "cache": "hit" if r["cache_hit"] else "miss",
                "trace_hash": r["trace_hash"], "hbm_peak_bytes": r["hbm_peak_bytes"],
                "argument_bytes": r["argument_bytes"], "output_bytes": r["output_bytes"],
                "temp_bytes": r["temp_bytes"], "alias_bytes": r["alias_bytes"]}
        label = f"#{r['index']} {r['name'] or r['mode']}"
        if r["compile_seconds"]:
            ev.append({"ph": "X", "pid": pid, "tid": 1, "cat": "compile", "name": "compile " + label,
                       "ts": (c0 - t0) * us, "dur": r["compile_seconds"] * us, "args": args})
        x1 = x0 + r["execute_seconds"]
        ev.append({"ph": "X", "pid": pid, "tid": 2, "cat": "execute", "name": "execute " + label,
                   "ts": (x0 - t0) * us, "dur": r["execute_seconds"] * us, "args": args})
        for ts, v in ((c0, r["live_bytes_before"]), (x0, r["hbm_peak_bytes"]),
                      (x1, r["live_bytes_after"])):
            ev.append({"ph": "C", "pid": pid, "name": "HBM bytes", "ts": (ts - t0) * us,
                       "args": {"bytes": v}})
    ev.sort(key=lambda e: e.get("ts", -1.0))
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"schema": SCHEMA, "script": summary["script"], "mode": summary["mode"],
                          "peak_bytes": summary["peak_bytes"]}}


def write_trace(path: str, summary: dict, records: list[dict]) -> None:
    _write(path, "--trace", json.dumps(trace_events(summary, records)) + "\n")


PLOT_HINT = ("--plot needs matplotlib, which is not installed; install it with:\n"
             "    pip install 'lazyrt[plot]'    (or: pip install matplotlib)")


def plot_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write_plot(path: str, summary: dict, records: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mib = 1 / 2**20
    ts, live = [], []
    px, py = [], []
    for r in records:
        c0, x0 = _phases(r)
        x1 = x0 + r["execute_seconds"]
        ts += [c0, x1]
        live += [r["live_bytes_before"] * mib, r["live_bytes_after"] * mib]
        px.append(x0)
        py.append(r["hbm_peak_bytes"] * mib)
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.step(ts, live, where="post", label="live tensor bytes")
    ax.scatter(px, py, s=12, color="C3", label="computation HBM peak", zorder=3)
    ax.axhline(summary["peak_bytes"] * mib, color="C3", lw=0.8, ls="--",
               label=f"process peak {summary['peak_bytes'] * mib:.1f} MiB")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("MiB")
    ax.set_title(f"lazyrt-mem: {os.path.basename(summary['script'])} ({summary['mode']} mode)")
    ax.legend(loc="upper left")
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=100)
    except OSError as e:
        raise OutputError(f"cannot write --plot file {path!r}: {e.strerror or e}") from None
    finally:
        plt.close(fig)

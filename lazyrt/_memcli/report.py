"""What ``lazyrt-mem`` prints: the summary of a run, the top-N table, the comparison."""
from __future__ import annotations

import os

from .._base.memory import fmt_bytes

SCHEMA = "lazyrt-mem/1"


def fmt_s(s) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def short_source(src: str) -> str:
    """``/abs/path/x.py:12 in f`` -> ``x.py:12 in f`` relative to the working directory."""
    if not src:
        return "-"
    path, sep, rest = src.partition(":")
    if sep and os.path.isabs(path):
        try:
            rel = os.path.relpath(path)
            if not rel.startswith(".."):
                path = rel
        except ValueError:
            pass
    return path + sep + rest


def summarize(records: list[dict], *, mode: str, script: str, argv: list, exit_status: int,
              wall_seconds: float, error: str | None) -> dict:
    """The run's summary (a JSON-able dict) from the flush log and lazyrt's counters."""
    from .._base import memory
    from .._base.metrics import COUNTERS
    from .._exec import defer as _defer

    info = memory.peak_info()
    stats = memory.memory_stats()
    n = len(records)
    hits = sum(1 for r in records if r["cache_hit"])
    where = info["where"]
    return {
        "script": script,
        "argv": list(argv),
        "mode": mode,
        "exit_status": exit_status,
        "error": error,
        "wall_seconds": wall_seconds,
        "peak_bytes": info["peak_bytes"],
        "peak_where": where,
        "peak_index": info["index"],
        "live_peak_bytes": stats["active_bytes.all.peak"],
        "live_bytes_at_exit": memory.live_bytes(),
        "num_records": n,
        "num_flushes": int(COUNTERS["flushes"]),
        "num_executions": int(COUNTERS["executions"]),
        "num_ops": sum(r["num_ops"] for r in records),
        "cache_hits": hits,
        "cache_misses": n - hits,
        "cache_hit_rate": (hits / n) if n else None,
        "compile_seconds": sum(r["compile_seconds"] for r in records),
        "execute_seconds": sum(r["execute_seconds"] for r in records),
        "pending_ops_at_exit": _defer.pending_count(),
        "device_stats": memory.device_stats(),
    }


def table(records: list[dict], top: int) -> str:
    """The ``top`` computations by HBM peak, largest first."""
    rows = sorted(records, key=lambda r: (-r["hbm_peak_bytes"], r["index"]))[:top]
    head = ("#", "mode", "ops", "cache", "compile", "execute", "live before", "HBM peak", "what",
            "triggered at")
    body = []
    for r in rows:
        body.append((str(r["index"]), r["mode"], str(r["num_ops"]),
                     "hit" if r["cache_hit"] else "miss", fmt_s(r["compile_seconds"]),
                     fmt_s(r["execute_seconds"]), fmt_bytes(r["live_bytes_before"]),
                     fmt_bytes(r["hbm_peak_bytes"]), r.get("name") or "-",
                     short_source(r["source"])))
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
              for i, h in enumerate(head)]
    right = {0, 2, 4, 5, 6, 7}

    def line(cells):
        out = []
        for i, c in enumerate(cells):
            out.append(c.rjust(widths[i]) if i in right else c.ljust(widths[i]))
        return "  ".join(out).rstrip()

    title = f"top {len(rows)} of {len(records)} computations by HBM peak"
    lines = [title, line(head), line(["-" * w for w in widths])]
    lines += [line(b) for b in body]
    if not body:
        lines.append("(no computation ran on the tpu device)")
    return "\n".join(lines)


def summary_text(s: dict) -> str:
    where = short_source(s["peak_where"]) if s["peak_where"] else "-"
    if s["peak_index"] is not None and s["peak_index"] >= 0:
        where += f" (computation #{s['peak_index']})"
    rate = "-" if s["cache_hit_rate"] is None else f"{s['cache_hit_rate']:.1%}"
    lines = [
        f"summary ({s['mode']} mode)",
        f"  process HBM peak:    {fmt_bytes(s['peak_bytes'])}",
        f"  reached at:          {where}",
        f"  live tensors peak:   {fmt_bytes(s['live_peak_bytes'])}",
        f"  computations:        {s['num_records']} ({s['num_ops']} ops"
        + (f", {s['num_flushes']} defer flushes" if s["num_flushes"] else "") + ")",
        f"  cache hit rate:      {rate} ({s['cache_hits']} hits, {s['cache_misses']} misses)",
        f"  compile time:        {fmt_s(s['compile_seconds'])}",
        f"  execute time:        {fmt_s(s['execute_seconds'])}",
        f"  wall time:           {fmt_s(s['wall_seconds'])}",
        f"  live bytes at exit:  {fmt_bytes(s['live_bytes_at_exit'])}",
    ]
    if s["pending_ops_at_exit"]:
        lines.append(f"  pending at exit:     {s['pending_ops_at_exit']} ops never flushed "
                     "(no sync point after them)")
    dev = s["device_stats"]
    if dev:
        lines.append(f"  device (XLA's own):  bytes_in_use {fmt_bytes(dev.get('bytes_in_use'))}, "
                     f"peak_bytes_in_use {fmt_bytes(dev.get('peak_bytes_in_use'))}")
    else:
        lines.append("  device stats:        none on this backend; only lazyrt's accounting")
    if s["exit_status"]:
        lines.append(f"  script exit status:  {s['exit_status']}"
                     + (f" ({s['error']})" if s["error"] else ""))
    return "\n".join(lines)


_ROWS = [
    ("HBM peak", "peak_bytes", fmt_bytes),
    ("live tensors peak", "live_peak_bytes", fmt_bytes),
    ("live bytes at exit", "live_bytes_at_exit", fmt_bytes),
    ("computations", "num_records", str),
    ("ops", "num_ops", str),
    ("cache misses", "cache_misses", str),
    ("compile time", "compile_seconds", fmt_s),
    ("execute time", "execute_seconds", fmt_s),
    ("wall time", "wall_seconds", fmt_s),
]


def compare_text(results: dict) -> str:
    """``results``: mode -> summary dict (or None when that run wrote nothing)."""
    a, b = results.get("strict"), results.get("defer")
    head = ("", "strict", "defer", "defer/strict")
    body = []
    for label, key, f in _ROWS:
        va = a.get(key) if a else None
        vb = b.get(key) if b else None
        ratio = "-"
        if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va:
            ratio = f"{vb / va:.2f}x"
        body.append((label, "-" if va is None else f(va), "-" if vb is None else f(vb), ratio))
    rate = lambda s: "-" if not s or s["cache_hit_rate"] is None else f"{s['cache_hit_rate']:.1%}"
    body.append(("cache hit rate", rate(a), rate(b), ""))
    st = lambda s: "-" if not s else str(s["exit_status"])
    body.append(("exit status", st(a), st(b), ""))
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(head)]

    def line(cells):
        return "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i])
                         for i, c in enumerate(cells)).rstrip()

    lines = [line(head), line(["-" * w for w in widths])] + [line(r) for r in body]
    for mode, s in (("strict", a), ("defer", b)):
        if s:
            lines.append(f"{mode} peak reached at: {short_source(s['peak_where']) or '-'}")
    return "\n".join(lines)

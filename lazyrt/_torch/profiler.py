"""``torch.profiler`` on tpu: lazyrt's ranges, XLA's executions and lazyrt's memory.

The ``profiler_ranges`` patch (``patches``) calls ``started`` when a torch profiler starts
recording (``torch.autograd.profiler.profile._start_trace``: ``torch.profiler.profile``
and its ``schedule``'s record steps come through it), ``stopping`` before it stops
(``profile.__exit__``) and ``exported`` after it wrote a Chrome trace
(``profile.export_chrome_trace``, which ``torch.profiler.profile.export_chrome_trace`` and
``tensorboard_trace_handler`` call). While it records, lazyrt's executors open named
ranges (``_exec.profile``) and a ``jax.profiler`` trace runs into a temporary folder.

The exported trace then gets:

- ``args`` on each lazyrt flush (and logged strict op) event: its op count, cache hit or
  miss, compile and execute seconds, HBM peak, the sync point and every line that
  recorded its ops (``recorded_at``), from lazyrt's own record of it;
- a device track: XLA's executions from the JAX trace, aligned in time with the CPU ops
  (the device's kernel intervals on GPU/TPU: the ``/device:*`` processes; on the CPU the
  executing threads' intervals: events carrying an ``hlo_module``, plus one interval per
  program run, named by the lazyrt range it began in);
- with ``profile_memory=True``: each allocation and release lazyrt counts as a
  ``[memory]`` event in Kineto's format (device type PrivateUse1), and counters of the
  live bytes and of each computation's HBM peak.
"""
from __future__ import annotations

import atexit
import bisect
import glob
import gzip
import json
import os
import shutil
import tempfile
import time
import weakref

import jax

from .._base import memory
from .._exec import defer as _defer
from .._exec import profile as _profile

DEVICE_PID = 0x7A7A00  # the device track's process id in the exported trace
_PRIVATEUSE1 = 20  # c10::DeviceType::PrivateUse1
# JAX's host events: 1 keeps XLA's executions (the CPU's device track) and costs less per
# op than 2 (``python -m perf.profiler_cost``: strict 1.7x against 1.9x the unprofiled op)
HOST_TRACER_LEVEL = 1
# profile object -> its recorded windows (with ``acc_events`` one profile records several)
_windows: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_current: list = [None]
_dirs: list = []
KEEP_TRACES = 8  # the JAX traces of the last windows kept (for their exports)


class Window:
    """One recording of a profiler: lazyrt's entries, memory events, the JAX trace."""

    def __init__(self, profile_memory: bool):
        self.profile_memory = profile_memory
        self.start_ns = time.time_ns()
        self.perf_to_unix = self.start_ns - time.perf_counter_ns()
        self.end_ns = None
        self.entries: list = []
        self.mem_events = None
        self.jax_dir = None
        self.jax_marker_ns = None  # unix ns of the marker annotation
        self.jax_error = None


def _start_jax(w: Window) -> None:
    d = tempfile.mkdtemp(prefix="lazyrt-prof-")
    # NOTE: JAX's Python tracer (an event per Python call) tripled the profiled cost per
    # op; torch's ``with_stack`` gives the Python side
    opts = jax.profiler.ProfileOptions()
    opts.python_tracer_level = 0
    opts.host_tracer_level = HOST_TRACER_LEVEL
    try:
        jax.profiler.start_trace(d, profiler_options=opts)
    except Exception as e:  # another JAX trace is running (one at a time)
        w.jax_error = f"{type(e).__name__}: {e}"
        shutil.rmtree(d, ignore_errors=True)
        return
    _dirs.append(d)
    while len(_dirs) > KEEP_TRACES:  # (a long schedule: the oldest windows' traces go)
        shutil.rmtree(_dirs.pop(0), ignore_errors=True)
    w.jax_dir = d
    # NOTE: JAX's trace counts time from its start; this annotation ties it to the unix
    # clock that Kineto's timestamps count (within a microsecond or two)
    with jax.profiler.TraceAnnotation("lazyrt::clock"):
        w.jax_marker_ns = time.time_ns()


def started(prof) -> None:
    if _current[0] is not None:  # a second profiler inside a first: it records the first's
        return
    w = Window(bool(getattr(prof, "profile_memory", False)))
    _start_jax(w)
    with _defer.LOCK:
        _profile.begin(w.profile_memory, _defer.current())
    _current[0] = w
    _windows.setdefault(prof, []).append(w)


def stopping(prof) -> None:
    w = _current[0]
    if w is None or w not in _windows.get(prof, ()):
        return
    _current[0] = None
    # what was dispatched in the window runs to its end inside the JAX trace
    try:
        arrays = memory.live_arrays()
        if arrays:
            jax.block_until_ready(arrays)
    except Exception:
        pass
    w.entries, w.mem_events = _profile.finish()
    w.end_ns = time.time_ns()
    if w.jax_dir is not None:
        try:
            jax.profiler.stop_trace()
        except Exception as e:
            w.jax_error = f"{type(e).__name__}: {e}"


def _cleanup() -> None:
    for d in _dirs:
        shutil.rmtree(d, ignore_errors=True)


atexit.register(_cleanup)


# ---- the exported trace ---------------------------------------------------------------


def _load(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def _save(path: str, doc: dict) -> None:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt") as f:
        json.dump(doc, f)


def jax_events(w: Window) -> list:
    """The JAX trace's events, their ``ts`` moved onto the unix clock (microseconds)."""
    if w.jax_dir is None:
        return []
    files = sorted(glob.glob(os.path.join(w.jax_dir, "**", "*.trace.json.gz"), recursive=True))
    if not files:
        return []
    with gzip.open(files[-1], "rt") as f:
        events = json.load(f).get("traceEvents", [])
    marker = next((e for e in events if e.get("name") == "lazyrt::clock" and "ts" in e), None)
    if marker is None:
        return []
    shift_us = w.jax_marker_ns / 1e3 - float(marker["ts"])
    for e in events:
        if "ts" in e:
            e["ts"] = float(e["ts"]) + shift_us
    return events


def device_track(events: list, base_us: float) -> list:
    """The device track's events (Chrome format, ``ts`` relative to ``base_us``): the
    ``/device:*`` processes of the JAX trace if it has any (GPU/TPU), else XLA's executions
    on the host's threads (the CPU platform: events with an ``hlo_module``) with one
    interval per program run (``run_id``) on a thread of its own."""
    procs = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    dev = {p for p, n in procs.items() if str(n).startswith("/device:")}
    out = []
    tids: dict = {}

    def tid_of(key, label):
        if key not in tids:
            tids[key] = len(tids) + 1
            out.append({"ph": "M", "pid": DEVICE_PID, "tid": tids[key], "name": "thread_name",
                        "args": {"name": label}})
        return tids[key]

    runs: dict = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        args = e.get("args") or {}
        if dev:
            if e["pid"] not in dev:
                continue
            key = (e["pid"], e.get("tid"))
            label = f"{procs[e['pid']]} {threads.get(key, e.get('tid'))}"
        elif "hlo_module" in args:
            key = (e["pid"], e.get("tid"))
            label = f"XLA ops on {threads.get(key, e.get('tid'))}"
            run = (args["hlo_module"], args.get("run_id"))
            s, t = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
            r = runs.get(run)
            runs[run] = (s, t) if r is None else (min(r[0], s), max(r[1], t))
        else:
            continue
        out.append({**e, "pid": DEVICE_PID, "tid": tid_of(key, label), "cat": "lazyrt_device",
                    "ts": float(e["ts"]) - base_us})
    if runs:
        tid = tid_of("programs", "XLA programs (one interval per run)")
        for (module, run_id), (s, t) in runs.items():
            out.append({"ph": "X", "pid": DEVICE_PID, "tid": tid, "cat": "lazyrt_device",
                        "name": module, "ts": s - base_us, "dur": t - s,
                        "args": {"hlo_module": module, "run_id": run_id}})
    if out:
        where = "the device" if dev else "the CPU: XLA's executing threads"
        out.insert(0, {"ph": "M", "pid": DEVICE_PID, "name": "process_name",
                       "args": {"name": f"tpu device: XLA executions ({where}; jax.profiler)"}})
        out.insert(1, {"ph": "M", "pid": DEVICE_PID, "name": "process_sort_index",
                       "args": {"sort_index": -1}})
    return out


def _label_runs(dev: list, events: list) -> None:
    """A program run on the device track that began inside a ``lazyrt::op`` or
    ``lazyrt::execute`` range is named by it (XLA names every strict program alike:
    ``jit_prog_fn``). NOTE: only then: XLA:CPU runs programs asynchronously, and not in
    the order they were launched, so a run that began after its range ended is not
    attributed (in the strict demo about half began inside)."""
    launches = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e["name"])
                      for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"
                      and e.get("name", "").startswith(("lazyrt::op[", "lazyrt::execute")))
    starts = [t for t, _, _ in launches]
    for e in dev:
        if e.get("ph") != "X" or "run_id" not in e.get("args", {}):
            continue
        ts = float(e["ts"])
        i = bisect.bisect_right(starts, ts) - 1
        if i >= 0 and ts <= launches[i][1]:
            e["args"]["launched_by"] = launches[i][2]
            if "hlo_op" not in e["args"]:  # a program's interval (not one of its ops)
                e["name"] = f"{launches[i][2]} ({e['name']})"


def _entry_args(entry) -> dict:
    kind, _, _, info, rec = entry
    args = {"lazyrt": kind}
    if info:
        args["sync_at"] = info["sync_at"]
        args["recorded_at"] = [f"{line} ({n} ops)" for line, n in info["recorded_at"]]
    if rec is not None:
        d = dict(rec)
        d.pop("largest_tensors", None)
        d["cache"] = "hit" if d["cache_hit"] else "miss"
        args.update(d)
    return args


def _annotate(events: list, entries: list) -> None:
    """Each lazyrt flush (and logged strict op) event gets its entry's args: the n-th
    event of a name in time order is the n-th entry of that name."""
    by_name: dict = {}
    for en in entries:
        by_name.setdefault(en[1], []).append(en)
    seen: dict = {}
    for e in sorted((e for e in events if e.get("ph") == "X" and e.get("name") in by_name),
                    key=lambda e: float(e["ts"])):
        k = seen.get(e["name"], 0)
        seen[e["name"]] = k + 1
        lst = by_name[e["name"]]
        if k < len(lst):
            e.setdefault("args", {}).update(_entry_args(lst[k]))


def memory_events(w: Window, base_us: float, pid, tid) -> list:
    """Kineto-style ``[memory]`` events for lazyrt's allocations and releases, and
    counters: live bytes, and each computation's HBM peak (at its execution)."""
    out = []
    for ns, nb, live, addr in w.mem_events or ():
        ts = ns / 1e3 - base_us
        out.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                    "pid": pid, "tid": tid, "ts": ts,
                    "args": {"Total Reserved": live, "Total Allocated": live, "Bytes": nb,
                             "Addr": addr, "Device Type": _PRIVATEUSE1, "Device Id": 0}})
        out.append({"ph": "C", "pid": DEVICE_PID, "name": "lazyrt live bytes", "ts": ts,
                    "args": {"bytes": live}})
    for _, _, _, _, rec in w.entries if w.profile_memory else ():
        if rec is None:
            continue
        ts = (rec["start_seconds"] + memory._T0) * 1e6 + w.perf_to_unix / 1e3 - base_us
        ts += rec["compile_seconds"] * 1e6 if rec["mode"] == "defer" else 0.0
        out.append({"ph": "C", "pid": DEVICE_PID, "name": "lazyrt HBM peak", "ts": ts,
                    "args": {"bytes": rec["hbm_peak_bytes"]}})
        out.append({"ph": "C", "pid": DEVICE_PID, "name": "lazyrt HBM peak",
                    "ts": ts + rec["execute_seconds"] * 1e6,
                    "args": {"bytes": rec["live_bytes_after"]}})
    return out


def exported(prof, path: str) -> None:
    """``prof`` wrote its Chrome trace to ``path``: add lazyrt's part (see the module)."""
    ws = _windows.get(prof)
    if not ws or not os.path.isfile(path):
        return
    w = ws[-1]
    doc = _load(path)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    base_us = float(doc.get("baseTimeNanoseconds", 0)) / 1e3 if isinstance(doc, dict) else 0.0
    _annotate(events, w.entries)
    dev = device_track(jax_events(w), base_us)
    _label_runs(dev, events)
    lo, hi = w.start_ns / 1e3 - base_us, (w.end_ns or time.time_ns()) / 1e3 - base_us
    events += [e for e in dev if e.get("ph") == "M" or lo <= float(e["ts"]) <= hi]
    pid = next((e["pid"] for e in events if e.get("cat") == "cpu_op"), os.getpid())
    events += memory_events(w, base_us, pid, pid)
    if isinstance(doc, dict):
        doc.setdefault("lazyrt", {}).update(
            {"device_track": bool(dev), "jax_trace_error": w.jax_error,
             "profile_memory": w.profile_memory})
    _save(path, doc)

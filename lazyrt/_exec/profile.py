"""lazyrt's work as named ranges of ``torch.profiler`` (while one records).

``_torch.profiler`` turns ``ACTIVE`` on when a torch profiler starts recording and off
when it stops; the executors then open ranges (the C++ ``RecordFunction`` behind
``torch.profiler.record_function``, in its fast form):

    lazyrt::op[NAME]                 a strict (or debug) op's execution, its compile nested
    lazyrt::flush[N ops, hit|miss] LINES
                                     a defer flush; LINES: the user's lines that recorded
                                     most of its ops (all of them, with counts, in the
                                     exported trace's args)
    lazyrt::compile                  each XLA compile (a strict op's, a flush's, a graph's)
    lazyrt::execute                  a flush's call of its executable
    lazyrt::to_device, lazyrt::to_host   host transfers
    lazyrt::sync                     ``lazyrt.sync`` / ``torch.tpu.synchronize``

With nothing recording, the hooks cost one list read (``ACTIVE[0]``) where they sit on
every op (strict ``run``) and a shared null context elsewhere. While recording, defer
records each op's source line (as ``LAZYRT_RECORD_SOURCE`` does) so a flush can name them.

Each flush (and, with ``profile_memory``, each strict op) also leaves an entry in
``WINDOW`` (its range's name, the lines that recorded its ops, and lazyrt's own record of
it as a dict of ``memory.FlushRecord``'s fields: compile and execute time, HBM peak):
``_torch.profiler`` adds them to the exported trace as the events' args and as memory
events.
"""
from __future__ import annotations

import collections
import contextlib
import os
import time

from torch._C._profiler import _RecordFunctionFast

from .._base import memory
from .._base.config import config
from .._base.metrics import COUNTERS

ACTIVE = [False]
# entries of the window being recorded: [kind, name, unix ns, recorded-at, FlushRecord]
WINDOW: list = []
_NULL = contextlib.nullcontext()
_names: dict = {}
_state = {"record_source": False}

COMPILE, EXECUTE = "lazyrt::compile", "lazyrt::execute"
TO_DEVICE, TO_HOST, SYNC = "lazyrt::to_device", "lazyrt::to_host", "lazyrt::sync"


def span(name: str):
    """A range named ``name`` while a profiler records, else a null context."""
    return _RecordFunctionFast(name) if ACTIVE[0] else _NULL


def strict_op(run, prog, arrays: list, scalars: list, log):
    """``run(prog, arrays, scalars, log)`` (strict's full path) inside its op's range; with
    memory events on, the op's entry in ``WINDOW`` (its HBM peak by ``memory``'s rule)."""
    name = _names.get(prog.name)
    if name is None:
        name = _names[prog.name] = f"lazyrt::op[{prog.name}]"
    if memory.EVENTS is None:
        with _RecordFunctionFast(name):
            return run(prog, arrays, scalars, log)
    live, hit, c0, t0 = (memory._state["live"], prog.exe is not None,
                         COUNTERS["compile_seconds"], time.perf_counter())
    with _RecordFunctionFast(name):
        outs = run(prog, arrays, scalars, log)
    # (a tuple, made a record at ``finish``: a dict per op here cost a microsecond)
    WINDOW.append(("op", name, None, None, (
        prog, prog.mem, hit, live, memory._state["live"], t0, time.perf_counter() - t0,
        0.0 if hit else COUNTERS["compile_seconds"] - c0)))
    return outs


def _op_record(index: int, e: tuple) -> dict:
    prog, m, hit, live, after, t0, dt, compile_s = e
    m = m or memory.MemoryAnalysis(0, 0, 0, 0, 0)
    return {"index": index, "mode": "strict", "trace_hash": f"{prog.uid:x}", "num_ops": 1,
            "cache_hit": hit, "compile_seconds": compile_s, "execute_seconds": dt - compile_s,
            "argument_bytes": m.argument_bytes, "output_bytes": m.output_bytes,
            "temp_bytes": m.temp_bytes, "alias_bytes": m.alias_bytes,
            "live_bytes_before": live, "live_bytes_after": after,
            "hbm_peak_bytes": memory.computation_peak(live, m), "source": "",
            "start_seconds": t0 + compile_s - memory._T0, "name": prog.name}


def _short(line: str) -> str:
    """``/a/b/model.py:12 in forward`` -> ``model.py:12`` (``<unknown>``: no user frame, as
    for ops autograd's device thread records, stays as it is)."""
    path, sep, rest = line.partition(":")
    return os.path.basename(path) + sep + rest.split(" ", 1)[0] if sep else line


def recorded_at(srcs: list) -> list:
    """``[(line, ops recorded there)]``, most ops first (then in recording order)."""
    return collections.Counter(srcs).most_common()


def flush_range(tr, hit: bool, src: str):
    """Open the range of a flush of ``tr`` (``hit``: its executable was cached); the caller
    ends it (``end``) once the flush is accounted. Its name holds the op count, hit or
    miss, and the (up to) three lines that recorded most of its ops."""
    lines = recorded_at(tr.srcs)
    top = ", ".join(_short(s) for s, _ in lines[:3])
    more = f" +{len(lines) - 3} lines" if len(lines) > 3 else ""
    name = (f"lazyrt::flush[{len(tr.nodes)} ops, {'hit' if hit else 'miss'}]"
            + (f" {top}{more}" if top else ""))
    WINDOW.append(["flush", name, time.time_ns(), {"sync_at": src, "recorded_at": lines}, None])
    rf = _RecordFunctionFast(name)
    rf.__enter__()
    return rf


def end(rf) -> None:
    rf.__exit__(None, None, None)


def _on_record(rec) -> None:
    """``memory``'s listener: lazyrt's record of the flush just run (the last entry of
    ``WINDOW`` that has none yet is its)."""
    if ACTIVE[0] and WINDOW and WINDOW[-1][4] is None:
        WINDOW[-1][4] = rec.as_dict()


memory.add_listener(_on_record)


def begin(profile_memory: bool, tr) -> None:
    """A profiler started recording: ranges on; defer records source lines; with
    ``profile_memory`` every allocation and release is an event, and each strict op leaves
    an entry with its HBM peak. ``tr``: the pending trace (the caller holds its lock)."""
    WINDOW.clear()
    _state["record_source"] = config.record_source
    if not config.record_source:
        # NOTE: the ops recorded before the profiler started get a placeholder line, so
        # the trace's lines stay aligned with its nodes
        tr.srcs.extend(["<recorded before profiling>"]
                       * (len(tr.nodes) - len(tr.srcs)))
        config.record_source = True
    memory.EVENTS = [] if profile_memory else None
    ACTIVE[0] = True


def finish() -> tuple[list, list | None]:
    """The profiler stops: everything back as it was; returns the window's entries and
    its memory events (``(unix ns, bytes + or -, live bytes after, address)``; None
    without ``profile_memory``)."""
    ACTIVE[0] = False
    config.record_source = _state["record_source"]
    events, memory.EVENTS = memory.EVENTS, None
    entries = [e if type(e[4]) is not tuple else [*e[:4], _op_record(i, e[4])]
               for i, e in enumerate(WINDOW)]
    WINDOW.clear()
    return entries, events

"""Strict (and debug) execution: each Prog compiled on its own and run at once.

A Prog is specialized to its input avals already (plans are keyed by input
shapes and dtypes), so one AOT-compiled executable per Prog is the cache.
"""
from __future__ import annotations

import time

import jax

from . import _xla, memory
from .memory import MemoryAnalysis
from .metrics import COUNTERS

_X64 = jax.enable_x64


def _compile(prog, arrays, scalars):
    t0 = time.perf_counter()
    with _X64(True):
        lowered = jax.jit(prog.fn).lower(*arrays, *scalars)
        exe = _xla.compile(lowered)
    prog.exe = exe
    prog.mem = MemoryAnalysis.of(exe)
    COUNTERS["cache_misses"] += 1
    COUNTERS["compile_seconds"] += time.perf_counter() - t0
    return exe


# NOTE: a Prog's executable is compiled for its first inputs' shardings; inputs sharded
# otherwise (lazyrt.distributed.mark_sharding) get one executable per sharding tuple.
_by_sharding: dict = {}


def _run_resharded(prog, arrays, scalars):
    key = (prog.uid, tuple(a.sharding for a in arrays))
    exe = _by_sharding.get(key)
    if exe is None:
        exe = _xla.compile(jax.jit(prog.fn).lower(*arrays, *scalars))
        _by_sharding[key] = exe
        COUNTERS["cache_misses"] += 1
    return exe(*arrays, *scalars)


def run(prog, arrays, scalars, log: bool | None = None):
    """Run ``prog`` now; returns its output arrays (dispatched asynchronously)."""
    exe = prog.exe
    compile_s = 0.0
    if exe is None:
        t0 = time.perf_counter()
        exe = _compile(prog, arrays, scalars)
        compile_s = time.perf_counter() - t0
    else:
        COUNTERS["cache_hits"] += 1
    live_before = memory._state["live"]
    t0 = time.perf_counter()
    with _X64(True):
        try:
            outs = exe(*arrays, *scalars)
        except ValueError as e:
            if "input shardings" not in str(e):
                raise
            outs = _run_resharded(prog, arrays, scalars)
    dt = time.perf_counter() - t0
    COUNTERS["executions"] += 1
    COUNTERS["execute_seconds"] += dt
    track = memory.track
    for o, nb in zip(outs, prog.out_nbytes):
        track(o, nb)
    if log is None:
        log = memory.LOG_STRICT[0]
    if log:
        memory.record_execution(
            mode="strict", name=prog.name, trace_hash=f"{prog.uid:x}", num_ops=1,
            cache_hit=compile_s == 0.0, compile_seconds=compile_s, execute_seconds=dt,
            analysis=prog.mem, live_before=live_before, passed_bytes=memory.bytes_of(arrays),
            t_start=t0)
    else:
        # The same accounting as record_execution, without the log record (hot path).
        peak = max(live_before - memory.bytes_of(arrays), 0) + prog.mem.peak_bytes
        st = memory._state
        if peak > st["peak"]:
            st["peak"] = peak
            st["peak_where"] = prog.name
    return outs

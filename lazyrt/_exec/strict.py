"""Strict (and debug) execution: each Prog compiled on its own and run at once.

A Prog is specialized to its input avals already (plans are keyed by input shapes
and dtypes), so one AOT-compiled executable per Prog is the cache. The executables
are kept in an LRU bounded by ``config.strict_cache_size``: a dynamic-shape workload
recompiles what it evicted, it never grows without bound. ``prog.exe`` is the slot a run
reads: with tiered compiles (``_xla``) it holds the first-tier executable until the
compile worker rebinds it to the optimized one (``_install``).

Every strict execution goes through ``run`` (an op, a view derived on its own, a
write through a view), so debug mode checks them all.
"""
from __future__ import annotations

import collections
import functools
import time

import jax
from cachetools import LRUCache

from .._base import memory
from .._base.config import config
from .._base.ir import Prog
from .._base.metrics import COUNTERS
from . import consts as _consts
from . import debug as _debug
from . import xla as _xla

_X64 = jax.enable_x64
# Progs that hold a compiled executable, least recently run first.
_compiled: collections.OrderedDict = collections.OrderedDict()


def _compile(prog: Prog, arrays, scalars):
    exe, mem, seconds, upgrade = _xla.compile_program(prog.fn, (*arrays, *scalars), tiered=True)
    prog.exe, prog.mem = exe, mem
    _compiled[prog] = None
    while len(_compiled) > config.strict_cache_size:
        old, _ = _compiled.popitem(last=False)
        old.exe = old.mem = None
    if upgrade is not None:
        upgrade.arm(functools.partial(_install, prog, exe))
    return exe, mem, seconds


def _install(prog: Prog, first, exe, mem) -> None:
    """The compile worker's swap: ``prog`` runs the optimized ``exe`` from its next call,
    unless its executable was dropped meanwhile (evicted, or its plan invalidated)."""
    if prog.exe is first:
        prog.exe, prog.mem = exe, mem


# NOTE: a Prog's executable is compiled for its first inputs' shardings; inputs sharded
# otherwise (lazyrt.distributed.mark_sharding) get one executable per sharding tuple.
_by_sharding: LRUCache = LRUCache(maxsize=256)


def _run_resharded(prog, arrays, scalars):
    key = (prog.uid, tuple(a.sharding for a in arrays))
    exe = _by_sharding.get(key)
    if exe is None:
        exe = _xla.compile_program(prog.fn, (*arrays, *scalars))[0]
        _by_sharding[key] = exe
    return exe(*arrays, *scalars)


def run(prog: Prog, arrays: list, scalars: list, log: bool | None = None) -> list:
    """Run ``prog`` now; returns its output arrays (dispatched asynchronously)."""
    # NOTE: exe and mem are read once: another thread may evict this prog meanwhile.
    exe, mem = prog.exe, prog.mem
    compile_s = 0.0
    if exe is None or mem is None:
        if prog.const and (outs := _consts.evaluate(prog, arrays, scalars)) is not None:
            return _made_on_host(prog, arrays, scalars, outs)
        exe, mem, compile_s = _compile(prog, arrays, scalars)
    else:
        COUNTERS["cache_hits"] += 1
        try:
            _compiled.move_to_end(prog)
        except KeyError:  # evicted by another thread since: keep running the one we hold
            pass
    live_before = memory._state["live"]
    t0 = time.perf_counter()
    try:
        if scalars:
            # NOTE: float64/int64 scalars need x64 at the call; array inputs keep their
            # dtypes without it, so most ops skip the context (~0.7 us).
            with _X64(True):
                outs = exe(*arrays, *scalars)
        else:
            outs = exe(*arrays)
    except ValueError as e:
        if "input shardings" not in str(e):
            raise
        with _X64(True):
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
            analysis=mem, live_before=live_before, passed_bytes=memory.bytes_of(arrays),
            t_start=t0)
    else:
        memory.note_computation(live_before, arrays, mem, prog.name)
    if config.mode == "debug":
        _debug.check(prog, arrays, scalars, outs)
    return outs


def _made_on_host(prog: Prog, arrays, scalars, outs) -> list:
    """A constant made by ``_consts`` instead of a compiled program: tracked as any output."""
    COUNTERS["host_constants"] += 1
    for o, nb in zip(outs, prog.out_nbytes):
        memory.track(o, nb)
    if config.mode == "debug":
        _debug.check(prog, arrays, scalars, outs)
    return outs


def cache_info() -> dict:
    return {"executables": len(_compiled), "maxsize": config.strict_cache_size}


def drop(progs) -> None:
    """Forget the executables of ``progs`` (their plans were invalidated)."""
    for p in progs:
        _compiled.pop(p, None)
        p.exe = p.mem = None

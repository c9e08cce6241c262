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
import numpy as np
from cachetools import LRUCache

from .._base import memory
from .._base.config import config
from .._base.ir import Prog
from .._base.memory import _state
from .._base.metrics import COMPILES_BY_OP, COUNTERS
from . import consts as _consts
from . import debug as _debug
from . import flatdraw as _flatdraw
from . import profile as _profile
from . import scalars as _scalars
from . import xla as _xla

_X64 = jax.enable_x64
_LOG_STRICT = memory.LOG_STRICT
_PROFILING = _profile.ACTIVE
# Progs that hold a compiled executable, least recently run first.
_compiled: collections.OrderedDict = collections.OrderedDict()


def _compile(prog: Prog, arrays, scalars):
    COMPILES_BY_OP[prog.name] += 1
    if prog.donate:
        # NOTE: called through JAX's own call (``direct`` fixed to it), which marks donated
        # arrays deleted; never tiered (no second executable to swap in)
        exe, mem, seconds = _xla.compile_program(prog.fn, (*arrays, *scalars),
                                                 donate_argnums=prog.donate, sig=prog.sig)
        upgrade = None
        prog.direct = (exe, None, None, _scalars.store_for(exe, len(arrays), len(scalars))
                       if scalars else None)
    else:
        exe, mem, seconds, upgrade = _xla.compile_program(prog.fn, (*arrays, *scalars),
                                                          tiered=True, sig=prog.sig)
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
    found = _by_sharding.get(key)
    if found is None:
        exe = _xla.compile_program(prog.fn, (*arrays, *scalars))[0]
        COMPILES_BY_OP[prog.name] += 1
        st = _scalars.store_for(exe, len(arrays), len(scalars)) if scalars else None
        found = _by_sharding[key] = (exe, st)
    exe, st = found
    dev = None if st is None else st.put(scalars)
    return exe(*arrays, *scalars) if dev is None else exe(*arrays, *dev)


def run(prog: Prog, arrays: list, scalars: list, log: bool | None = None) -> list:
    """Run ``prog`` now; returns its output arrays (dispatched asynchronously).

    The hot path of strict mode: the executable called the cheapest way (``_direct``),
    its scalars passed as device arrays (``_scalars``: no implicit transfer), its outputs
    counted and its peak folded in (``memory.count_run``). What only a log or debug mode
    needs (timing, the log record, the checks) is in ``_run_slow``.
    """
    if _PROFILING[0]:  # a torch profiler records: the op in its range
        return _profile.strict_op(_run_slow, prog, arrays, scalars, log)
    # NOTE: exe and mem are read once: another thread may evict this prog meanwhile (or
    # rebind a better executable).
    exe, mem = prog.exe, prog.mem
    if exe is None or mem is None or log or _LOG_STRICT[0] or config.mode == "debug":
        return _run_slow(prog, arrays, scalars, log)
    try:
        _compiled.move_to_end(prog)
    except KeyError:  # evicted by another thread since: keep running the one we hold
        pass
    live_before = _state["live"]
    d = prog.direct
    if d is None or d[0] is not exe:
        d = prog.direct = _direct(exe, arrays, scalars)
    if scalars:
        dev = None if d[3] is None else d[3].put(scalars)
        if dev is None:
            outs = _call(exe, prog, arrays, scalars)
        elif d[1] is not None:
            args = arrays + dev
            try:
                outs = d[1](args).consume_with_handlers(d[2])
            except Exception:
                outs = _call(exe, prog, arrays, scalars, dev)
        else:
            outs = _call(exe, prog, arrays, scalars, dev)
    elif d[1] is not None:
        try:
            outs = d[1](arrays).consume_with_handlers(d[2])
        except Exception:
            outs = _call(exe, prog, arrays, scalars)
    else:
        outs = _call(exe, prog, arrays, scalars)
    COUNTERS["cache_hits"] += 1
    COUNTERS["executions"] += 1
    memory.count_run(outs, prog.out_nbytes, live_before, mem.extra_bytes, prog.name)
    return outs


def _call(exe, prog: Prog, arrays: list, scalars: list, dev: list | None = None) -> list:
    """``exe`` on the arguments through JAX's C++ call (``jax.stages.Compiled._call``, made
    by its first call: the path a cached ``jax.jit`` call takes). ``dev``: the scalars as
    device arrays (None: passed as Python scalars, each an implicit transfer)."""
    call = getattr(exe, "_call", None) or exe
    try:
        if dev is not None:
            return call(*arrays, *dev)
        if scalars:
            # NOTE: float64/int64 scalars need x64 at the call; array inputs keep their
            # dtypes without it, so most ops skip the context (~0.7 us).
            with _X64(True):
                return call(*arrays, *scalars)
        return call(*arrays)
    except ValueError as e:
        if "input shardings" not in str(e):
            raise
        with _X64(True):
            return _run_resharded(prog, arrays, scalars)


# Whether handing arrays straight to XLA gave what JAX's own call gives (None: not tried
# yet); checked on the first executable that can (``_direct``).
_DIRECT_OK: list = [None]


def _direct(exe, arrays: list, scalars: list) -> tuple:
    """``(exe, execute, out handlers, scalar store)``: how strict calls ``exe`` from now on.

    The scalar store (``_scalars.Store``) makes the scalars device arrays of the sharding
    ``exe`` takes them in (None: ``exe`` does not say, they are passed as Python scalars).
    The cheapest call JAX offers is its loaded XLA executable's ``execute_sharded`` on the
    argument arrays, with the output handlers of JAX's own call (~0.5 us less per op than
    ``Compiled._call``, which checks each argument's aval, sharding and layout first, and
    ~1 us less than ``Compiled.__call__``; ``python -m perf.per_op --calls``). Taken only
    where it is exactly what JAX's call does: array arguments only (the scalars as device
    arrays), all of them kept by the program, default layouts, one device, no effects,
    host callbacks or mutable arrays, no ``jax_debug_nans``/``infs``. A call that raises
    (an array on another device, a deleted one) is repeated through ``Compiled._call``, whose
    error is the one raised. ``execute`` is None where the C++ call is used. The first
    executable that qualifies is run both ways once, and the direct call is used only if
    the two give the same outputs bit for bit (a JAX whose internals changed falls back)."""
    st = _scalars.store_for(exe, len(arrays), len(scalars)) if scalars else None
    if (scalars and st is None) or _DIRECT_OK[0] is False or not hasattr(exe, "_executable"):
        return (exe, None, None, st)  # (``_xla.FirstTier``: called through its own call)
    try:
        dev = st.put(scalars) if scalars else []
        if dev is None:
            return (exe, None, None, st)
        args = arrays + dev
        ex = exe._executable
        u = ex.unsafe_call
        single = all(type(sh).__name__ == "SingleDeviceSharding"
                     for sh in u.in_handler.in_shardings)
        ok = (not exe._params.const_args and u.kept_var_idx == set(range(len(args)))
              and all(lay is None for lay in u.in_handler.in_layouts) and single
              and u.mut is None and not u.ordered_effects and not u.has_unordered_effects
              and not u.has_host_callbacks and not jax.config.jax_debug_nans
              and not jax.config.jax_debug_infs)
        if not ok:
            return (exe, None, None, st)
        execute, handlers = u.xla_executable.execute_sharded, u.out_handler.handlers
        if _DIRECT_OK[0] is None:
            _DIRECT_OK[0] = _same(execute(args).consume_with_handlers(handlers),
                                  (getattr(exe, "_call", None) or exe)(*args))
            if not _DIRECT_OK[0]:
                return (exe, None, None, st)
        return (exe, execute, handlers, st)
    except Exception:
        _DIRECT_OK[0] = False
        return (exe, None, None, st)


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype
        and np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in zip(a, b))


def _run_slow(prog: Prog, arrays: list, scalars: list, log: bool | None) -> list:
    """``run`` with everything: compiling on a miss, timing, the log record, debug checks."""
    exe, mem = prog.exe, prog.mem
    compile_s = 0.0
    if log is None:
        log = _LOG_STRICT[0]
    if exe is None or mem is None:
        # NOTE: a logged run (lazyrt-mem's record) is a compiled one: its record holds the
        # executable's memory analysis
        if (prog.const or not log) and (outs := _consts.evaluate(prog, arrays, scalars)) is not None:
            return _made_on_host(prog, arrays, scalars, outs)
        if not log and (outs := _flatdraw.run(prog, arrays, scalars, run)) is not None:
            return _made_on_host(prog, arrays, scalars, outs, "flat")
        exe, mem, compile_s = _compile(prog, arrays, scalars)
    else:
        COUNTERS["cache_hits"] += 1
        try:
            _compiled.move_to_end(prog)
        except KeyError:
            pass
    live_before = _state["live"]
    dev = None
    if scalars:
        d = prog.direct
        st = d[3] if d is not None and d[0] is exe else \
            _scalars.store_for(exe, len(arrays), len(scalars))
        dev = None if st is None else st.put(scalars)
    t0 = time.perf_counter()
    outs = _call(exe, prog, arrays, scalars, dev)
    dt = time.perf_counter() - t0
    COUNTERS["executions"] += 1
    COUNTERS["execute_seconds"] += dt
    memory.track_outputs(outs, prog.out_nbytes)
    if log:
        memory.record_execution(
            mode="strict", name=prog.name, trace_hash=f"{prog.uid:x}", num_ops=1,
            cache_hit=compile_s == 0.0, compile_seconds=compile_s, execute_seconds=dt,
            analysis=mem, live_before=live_before, t_start=t0)
    else:
        peak = live_before + mem.extra_bytes
        if peak > _state["peak"]:
            memory.note_peak(peak, prog.name)
    if config.mode == "debug":
        _debug.check(prog, arrays, scalars, outs)
    return outs


def _made_on_host(prog: Prog, arrays, scalars, outs, how: str = "host") -> list:
    """Outputs made by ``_consts`` (or a flat draw, ``_flatdraw``) instead of the program's
    own executable: tracked as any output."""
    if how == "host":
        COUNTERS["host_constants" if prog.const else "host_runs"] += 1
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

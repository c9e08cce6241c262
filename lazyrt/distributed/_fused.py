"""Fused collectives (defer mode, opt-in): a collective is a node of the pending trace, and
a flush holding one runs the whole trace as ONE SPMD program over the group's mesh.

Turn it on with ``LAZYRT_DIST_FUSED=1``, ``lazyrt.distributed.set_fused(True)`` or
``with lazyrt.distributed.fused():``. A DDP or FSDP2 step is then one program per step.

How the program is built: the flush function lazyrt's defer mode traces for any trace is
traced inside a ``shard_map`` over the mesh of the trace's group (one group per fused
program: a collective on another group flushes first); every input is this rank's local
array declared replicated (``_collectives`` explains why that is exact), and the
collective nodes' bodies use the mesh axis. Every rank compiles the same program (the
check below makes sure), so XLA schedules its collectives the same way on every rank.

The anti-deadlock rule is in ``_engine``; this module enforces its second half: before a
fused program runs, every rank of its group publishes the program's fingerprint (a hash of
its StableHLO) and the sync point that triggered it through the group's store, and waits
for all the others' (``LAZYRT_DIST_SYNC_TIMEOUT``). Same fingerprints: run. Different
ones, or a rank that does not come: ``RuntimeError`` naming every rank's sync point, on
every rank that reached the check, instead of a hang. With ``LAZYRT_DIST_CHECK=on`` the
same check runs before every isolated collective (the debug check); ``off`` skips it.
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import time
import warnings
import weakref

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from . import _collectives, _rt
from ._config import dist_config

STATS = _collectives.STATS


class _TraceState:
    __slots__ = ("pg", "colls")

    def __init__(self, pg):
        self.pg = pg
        self.colls: list = []


_states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_progs: dict = {}
_reason = ["sync"]


def set_fused(on: bool = True) -> bool:
    """Turn fused collectives on or off (defer mode); returns the previous setting.
    Pending work is flushed first, so no trace mixes the two."""
    prev = dist_config.fused
    if bool(on) != prev and _rt.pending_count():
        _rt.flush(reason="lazyrt.distributed.set_fused")
    dist_config.fused = bool(on)
    _install_runner()
    return prev


@contextlib.contextmanager
def fused(on: bool = True):
    """``with lazyrt.distributed.fused(): ...``: fused collectives inside the block."""
    prev = set_fused(on)
    try:
        yield
    finally:
        set_fused(prev)


def sync() -> None:
    """Flush at a point every rank reaches (as ``lazyrt.sync()``): the explicit way to run
    pending fused collectives."""
    _rt.flush(reason="lazyrt.distributed.sync")


def collective_log() -> dict:
    """Counters: collectives run isolated, fused collectives recorded, fused flushes,
    store checks and the seconds they took."""
    return dict(STATS)


def _install_runner() -> None:
    _rt.set_spmd_runner(_runner_for)


# ---------------------------------------------------------------------------
# recording
# ---------------------------------------------------------------------------


def _prog(comm, kind, params, in_avals):
    key = (id(comm), kind, params, in_avals)
    prog = _progs.get(key)
    if prog is None:
        b = _collectives.body(kind, params)

        def fn(*xs):
            return (b(*xs),)

        outs = _collectives.out_avals(comm, kind, params, in_avals)
        desc = f"{kind}{dict(params)} group={comm.pg.getGroupName()}"
        prog = _rt.Prog(f"c10d.{kind}", fn, (), outs, desc)
        _progs[key] = prog
    return prog


def record(pg, kind: str, params: tuple, tensors) -> list:
    _install_runner()
    tr = _rt.current_trace()
    st = _states.get(tr)
    if st is not None and st.pg is not pg:
        _rt.flush(reason=f"c10d {kind} on another group")
        tr = _rt.current_trace()
        st = None
    vals = [_rt.value_of(t) for t in tensors]
    in_avals = tuple((tuple(v.shape), np.dtype(v.dtype)) for v in vals)
    prog = _prog(pg.comm, kind, params, in_avals)
    outs = _rt.run(prog, vals)
    tr = outs[0].trace
    st = _states.get(tr)
    if st is None:
        st = _states[tr] = _TraceState(pg)
    st.colls.append(prog.desc)
    STATS["fused_recorded"] += 1
    return outs


# ---------------------------------------------------------------------------
# flushing a trace that holds fused collectives
# ---------------------------------------------------------------------------


def _runner_for(tr, reason):
    st = _states.get(tr)
    if st is None:
        return None
    _reason[0] = reason
    return _Runner(st)


class _Runner:
    def __init__(self, st: _TraceState):
        self.st = st

    def compile_program(self, fn, args, donate_argnums=(0,)):
        """The core's compile hook (lazyrt._exec.defer.flush): (executable, memory analysis,
        seconds), counted like any compile."""
        t0 = time.perf_counter()
        exe = self.compile(fn, *args)
        seconds = time.perf_counter() - t0
        _rt.note_compile(seconds)
        return exe, _rt.memory_analysis(exe), seconds

    def compile(self, fn, donated, kept, scal):
        comm = self.st.pg.comm
        rep = comm.rep

        def spmd(d, k, s):
            return fn(d, k, s)

        body = jax.shard_map(spmd, mesh=comm.mesh, in_specs=P(), out_specs=P(), check_vma=False)

        def sds(a):
            # weak_type kept: the scalar vector is weak-typed (f32 * lr stays f32)
            return jax.ShapeDtypeStruct(tuple(a.shape), a.dtype, sharding=rep,
                                        weak_type=getattr(a, "weak_type", False))

        with _rt.X64(True), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
            lowered = _rt.lean_lower(jax.jit(body, donate_argnums=(0,)),
                                     ([sds(a) for a in donated], [sds(a) for a in kept], sds(scal)))
        text = lowered.as_text()
        fp = hashlib.sha1(text.encode()).hexdigest()[:16]
        if dist_config.dump_dir:
            _dump(text, fp, self.st.pg)
        with _rt.X64(True):
            compiled = _rt.compile_lowered(lowered)
        return _SpmdExe(compiled, self.st.pg, fp, list(self.st.colls))


def _dump(text: str, fp: str, pg) -> None:
    import os

    os.makedirs(dist_config.dump_dir, exist_ok=True)
    path = os.path.join(dist_config.dump_dir, f"fused_{fp}_rank{pg.rank()}.mlir")
    with open(path, "w") as f:
        f.write(text)


class _SpmdExe:
    """A compiled fused program: wraps this rank's arrays as shards of global arrays,
    checks with the other ranks, runs, hands back this rank's local results."""

    def __init__(self, compiled, pg, fingerprint: str, colls: list):
        self.compiled = compiled
        self.pg = pg
        self.fingerprint = fingerprint
        self.colls = colls

    def memory_analysis(self):
        return self.compiled.memory_analysis()

    def __call__(self, donated, kept, scal):
        comm = self.pg.comm
        if dist_config.check != "off":
            where = f"{_reason[0]} at {_rt.user_line()}"
            check(self.pg, f"fused program {self.fingerprint} ({len(self.colls)} collectives)",
                  where)
        s = jax.device_put(scal, comm.local)
        outs = self.compiled([comm.wrap(a) for a in donated], [comm.wrap(a) for a in kept],
                             comm.wrap(s))
        STATS["fused_flushes"] += 1
        return [comm.unwrap(o) for o in outs]


# ---------------------------------------------------------------------------
# the cross-rank check (through the group's store)
# ---------------------------------------------------------------------------


def check(pg, what: str, where: str, ns: str = "fused") -> None:
    """Every rank of ``pg`` publishes ``what`` (a program signature) and ``where`` (its
    sync point) and waits for the others; raises unless all ``what`` agree."""
    t0 = time.perf_counter()
    store = pg.store
    n, me = pg.size(), pg.rank()
    gens = pg.__dict__.setdefault("_check_gen", {})
    gen = gens.get(ns, 0)
    gens[ns] = gen + 1
    base = f"lazyrt/{ns}/{gen}"
    mine = f"{base}/{me}"
    store.set(mine, f"{what}\x00{where}")
    keys = [f"{base}/{r}" for r in range(n)]
    secs = dist_config.sync_timeout
    try:
        store.wait(keys, datetime.timedelta(seconds=secs))
    except Exception as e:  # a timeout
        missing = [r for r in range(n) if not store.check([f"{base}/{r}"])]
        store.set(mine, f"aborted\x00{where}")
        raise RuntimeError(
            f"lazyrt.distributed: rank {me} reached {what} ({where}), but rank(s) {missing} of "
            f"group {pg.getGroupName()!r} did not reach a flush of it within {secs:g} s. "
            f"A flush that runs fused collectives must happen on every rank of the group: "
            f"run rank-local syncs (.item(), .cpu(), print) after optimizer.step() or "
            f"lazyrt.sync() on every rank, or use isolated collectives (LAZYRT_DIST_FUSED=0)."
            f" ({type(e).__name__})") from None
    got = [v.decode() if isinstance(v, bytes) else v for v in store.multi_get(keys)]
    if gen >= 1:
        store.delete_key(f"lazyrt/{ns}/{gen - 1}/{me}")
    STATS["checks"] += 1
    STATS["check_seconds"] += time.perf_counter() - t0
    sigs = [g.split("\x00", 1) for g in got]
    if any(s[0] != what for s in sigs):
        lines = "\n".join(f"  rank {r}: {s[0]} at {s[1]}" for r, s in enumerate(sigs))
        raise RuntimeError(
            f"lazyrt.distributed: the ranks of group {pg.getGroupName()!r} are about to run "
            f"different collective programs, which would deadlock or corrupt results:\n"
            f"{lines}\n{_ADVICE[ns]}")


_ADVICE = {
    "fused": "Every rank must flush the same pending collectives at the same point; a "
             "rank-local sync (.item(), .cpu(), print on one rank) while fused collectives "
             "are pending breaks that, and so does rank-dependent work recorded with them: "
             "sync after optimizer.step()/lazyrt.sync(), or use isolated collectives "
             "(LAZYRT_DIST_FUSED=0).",
    "isolated": "Every rank must call the same collectives, with the same shapes and dtypes, "
                "in the same order.",
    "p2p": "A send runs as one program with the matching recv on the peer: call them in "
           "matching order (a send on one rank meets a recv on the other); two ranks that "
           "both send first (batch_isend_irecv rings) are not supported on tpu tensors.",
}


def check_isolated(pg, kind: str, params: tuple, arrays) -> None:
    """``LAZYRT_DIST_CHECK=on``: the ranks agree on every isolated collective first."""
    sig = f"{kind}{dict(params)}" + "".join(f"[{tuple(a.shape)}:{a.dtype}]" for a in arrays)
    check(pg, sig, _rt.user_line(), ns="isolated")

"""Cold flushes on the CPU platform: a trace not flushed before runs op by op.

In defer mode a flush whose trace is new compiles one XLA program for it: 0.1-0.5 s on
the 2-core machine for the few ops of a test's check. Code that sweeps shapes and dtypes
(PyTorch's OpInfo device tests, a shape-polymorphic eval loop) makes a new trace at
nearly every flush and runs it once, so defer paid a compile per flush where strict mode
reuses one program per op signature, most of them run on the host while cold
(``consts``). On a proxy of PyTorch's binary-ufunc tests (``python -m perf.cold_flush
--family binary --step 3``, three processes side by side) defer compiling every flush took
167 s (1,169 programs), defer with cold flushes run op by op 116 s (679), strict 116 s.

So on the CPU platform a trace whose key has been flushed fewer than
``consts.COLD_CALLS`` times runs its ops one by one through strict's ``run`` (which
shares its programs with every other trace and strict mode, and evaluates cold ones on
the host), when that costs few compiles: at most ``NEW_PROGRAMS`` of its programs are
neither compiled nor known to run on the host (``_new_programs``). From its
``COLD_CALLS``-th flush on, a trace runs as its own fused program, as everywhere else.
A training step's first trace holds hundreds of new programs, so it is compiled at
once, as before.

Values: each op's are strict mode's for that op. The fused program can differ from them
in the last bits (XLA:CPU contracts a multiply and an add into one FMA), as strict and
defer differ; a trace's values change that way at most once, when it is compiled.

Not run op by op (compiled at once as before): traces with a ``torch.compile`` graph
(one program per step is what it is for), with donated inputs (``jax_op(donate=)``),
once a mesh exists (``lazyrt.distributed``: sharded leaves, an SPMD runner), while a
torch profiler records or recompiles are explained (``LAZYRT_EXPLAIN_RECOMPILE``).
``LAZYRT_HOST_EVAL=0`` turns it off with the host runs.
"""
from __future__ import annotations

import time

from cachetools import LRUCache

from .._base import memory
from .._base.config import config
from .._base.metrics import COUNTERS
from .._base.platform import on_cpu
from . import consts as _consts
from . import profile as _profile
from . import strict as _strict
from .program import hash_hex, needed
from .trace import _MASK, _SHIFT, Trace

# a trace's programs that may compile (not compiled yet, not known to run on the host)
# above which its fused program is compiled at once. A test's check is 3-22 ops with up
# to ~16 new programs at first, and they are shared with the next tests'; a model's step
# holds more (a tiny Llama's forward: 197 ops, 17 new programs at its first flush), and
# its programs run op by op would only be compiled for the 4 steps before the fused one.
# The binary-ufunc proxy of ``perf.cold_flush``, two processes side by side: 75 s with 16,
# 110 s with 4 (1,218 flushes, 1,213 and 480 of them op by op). 32 against 16 on PyTorch's
# sampled test_binary_ufuncs.py in defer (perf.pytorch_suite --sample 40, one side-by-side
# run at 2d1886c): 279 s against 304 s (within this machine's run-to-run noise), 1,391
# programs against 1,233; not taken: the tiny Llama's first flush would run op by op.
NEW_PROGRAMS = 16
# flushes so far per trace key (the flush cache's key), for the traces run op by op
_flushed: LRUCache = LRUCache(maxsize=8192)


def _new_programs(tr: Trace, need: list) -> int:
    """How many of ``tr``'s distinct needed programs a run op by op would compile (a
    program never run on the host counts: most of those turn out to need a compile)."""
    n, seen = 0, set()
    spent = _consts.cold_spent
    for i, p in enumerate(tr.nodes):
        if not need[i] or p.exe is not None or id(p) in seen:
            continue
        seen.add(id(p))
        if p.host is False or (not p.const and (p.host is None or spent(p))):
            n += 1
            if n > NEW_PROGRAMS:
                break
    return n


def wanted(tr: Trace, key, out_refs) -> list | None:
    """The needed-node mask if the flush of ``tr`` (not in the flush cache) is to run op
    by op, else None."""
    if (not _consts.COLD_ENABLED or not on_cpu() or tr.declared or config.explain_recompile
            or _profile.ACTIVE[0]):
        return None
    if _flushed.get(key, 0) >= _consts.COLD_CALLS:
        return None
    for p in tr.nodes:
        if p.graph or p.donate:
            return None
    need = needed(tr, out_refs)
    if _new_programs(tr, need) > NEW_PROGRAMS:
        return None
    return need


def run(tr: Trace, key, out_refs, need: list) -> tuple[list, float, float]:
    """Run ``tr``'s needed ops one by one; ``(results for out_refs, compile seconds,
    execute seconds)``. Each op's outputs are counted by strict's ``run``."""
    _flushed[key] = _flushed.get(key, 0) + 1
    t0 = time.perf_counter()
    c0 = COUNTERS["compile_seconds"]
    leaves, refs, scal = tr.leaves, tr.refs, tr.scalars
    run_op = _strict.run
    vals: list = [None] * len(tr.nodes)
    o = 0
    for n, p in enumerate(tr.nodes):
        k = len(p.scalar_kinds)
        if need[n]:
            ins = [leaves[-r - 1] if r < 0 else vals[r >> _SHIFT][r & _MASK] for r in refs[n]]
            vals[n] = run_op(p, ins, scal[o:o + k] if k else [])
        o += k
    compile_s = COUNTERS["compile_seconds"] - c0
    COUNTERS["cold_flushes"] += 1
    return ([vals[r >> _SHIFT][r & _MASK] for r in out_refs], compile_s,
            time.perf_counter() - t0 - compile_s)


class _Record:
    """What defer's flush record reads of an executable, for a flush run op by op."""
    __slots__ = ("trace_hash", "mem", "largest")


def record(tr: Trace, out_refs, results) -> _Record:
    """The flush record's fields: its trace's name and sizes, its inputs and outputs (each
    op's peak was counted by strict's ``run``; no one program's temporaries to report)."""
    r = _Record()
    r.trace_hash = hash_hex(tr, out_refs, (False,) * len(tr.leaves))
    arg = sum(a.nbytes for a in tr.leaves)
    out = sum(a.nbytes for a in results)
    r.mem = memory.MemoryAnalysis(argument_bytes=arg, output_bytes=out, temp_bytes=0,
                                  alias_bytes=0, peak_bytes=arg + out)
    r.largest = None
    return r


def clear() -> None:
    _flushed.clear()

"""DeferAndFuse: record Progs into a pending trace; flush it as ONE computation.

Recording appends a node (its prog and input wiring) and, for a new input, its leaf
aval; nothing else. A flush hashes the trace's structure (the progs, the input wiring,
the leaf avals: C-level tuple hashes, ~5 us for 200 ops) and never looks at data.
Device-data leaves are keyed by shape and dtype only;
Python float scalars and RNG seeds are runtime inputs (one float64 vector), so
a changing learning rate or a fresh random draw compiles nothing new. A cache hit
is then checked against the trace itself (the same progs, input wiring and leaf
avals), so two traces whose hashes collide never share an executable.

Runtime floats enter the program once per distinct value (ints once each, as they come:
positions and value ints equal by chance must not share): a for-loop AdamW step over
200 parameters records 1,400 scalars holding 7 values, and its program reads 7
(``_exes.scalar_layout``; a slice of the scalar vector per use made XLA compile 1,400
different kernels, 14 s instead of 1). Which positions share a value is part of what an
executable was compiled for, so a hit is also checked against the current scalars
(``_exes.Exe.fits``: positions that shared a value at compile time still do, bit for bit,
so ``-0.0`` is not ``0.0``); if not, another executable is compiled. The program is
simplified before XLA sees it (``_lean``).

At a flush every storage still holding a pending value of the trace (a live
tensor) becomes an output; nothing else is materialized. A leaf whose storage
was overwritten in the trace and that nobody else references is donated.

Segments: with ``LAZYRT_FUSION_WINDOW=N`` a trace is flushed each time it holds N ops
(``_cut``), counted from its start at a sync point, so a step is cut at the same places
every time. The flush dispatches asynchronously: the device runs a segment while the
host records the next. A compiled graph whose flushes kept compiling (the eager code
around it changes shape every call) gets a flush of its own (``isolated``).

On the CPU platform a new trace with few new programs runs op by op (``coldflush``).

Threads: one pending trace per process, guarded by ``LOCK``, which the dispatcher holds
for the whole of every op in defer mode (recording, storage registration, write-back)
and a flush from start to end: an op is never split by another thread's flush.
``values.run`` records only under it; ``note_storage`` checks that its caller holds it.
"""
from __future__ import annotations

import sys
import threading
import time
import weakref

import jax
import numpy as np

from .._base import memory
from .._base import source as _source
from .._base.config import config
from .._base.ir import Pending, Prog
from .._base.metrics import COMPILES_BY_OP, COUNTERS, register_gauge
from . import asserts as _asserts
from . import coldflush as _cold
from . import exes as _exes
from . import profile as _profile
from . import scalars as _scalars
from . import xla as _xla
from .program import build_fn, hash_hex, scalar_struct
from .trace import _MASK, _SHIFT, LOOP_PERIODS, Trace, explain, graph_text, structure_hash  # noqa: F401  (explain, graph_text: re-exported)

LOCK = threading.RLock()
_owned = LOCK._is_owned
_UNLOCKED = "lazyrt: internal error: {} without the pending trace's lock (defer.LOCK)"
_X64 = jax.enable_x64
_PROFILING = _profile.ACTIVE


_trace = Trace()
# lazyrt.distributed: a hook asked at each flush for an SPMD compile of traces holding
# fused collectives (None, or an object whose compile_program(fn, args, donate_argnums)
# returns what _xla.compile_program does).
spmd_runner = None
# lazyrt.distributed sets this once a Mesh exists: leaves are keyed on their sharding too.
KEY_SHARDING = False
_history = {"flushes": 0, "compiles": 0}


def current() -> Trace:
    return _trace


def pending_count() -> int:
    return len(_trace.nodes)


register_gauge("pending_ops", pending_count)


def holds_graph() -> bool:
    """Whether the pending trace holds a compiled graph (``Prog.graph``)."""
    return any(p.graph for p in _trace.nodes)


_TLS = threading.local()


def set_eager_consts(on: bool) -> None:
    """While on (in this thread), an op whose outputs read no input's value (``zeros_like``,
    ``full``: ``Prog.const``) runs at once instead of being recorded (``eager_const``): an
    optimizer's first step makes its state this way, so the state enters that step's
    program as inputs, exactly as on every later step, and the two programs are one."""
    _TLS.eager_consts = on


def eager_const(inputs: list) -> bool:
    """Whether a const prog on ``inputs`` runs now (see ``set_eager_consts``)."""
    return getattr(_TLS, "eager_consts", False) and not any(type(v) is Pending for v in inputs)


def record(prog: Prog, inputs: list, scalars: list) -> list[Pending]:
    """Append ``prog`` applied to ``inputs`` (arrays or Pendings); returns its Pendings.
    The caller holds ``LOCK``: reached only through ``_exec.values.run``, which records
    only while the lock is held (``note_storage`` checks the write-back)."""
    tr = _trace
    n = len(tr.nodes)
    # NOTE: both cuts are made before recording, while this op's inputs are still held
    # by the caller, so they are live outputs of the flush.
    if n >= config.max_pending_ops:
        flush(reason="pending-op budget (LAZYRT_MAX_PENDING_OPS)")
        tr = _trace
    elif config.fusion_window and n >= config.fusion_window and tr.cuttable:
        _cut(tr)
        tr = _trace
    elif config.loop_cut and _looping(tr, prog, n):
        _cut(tr, reason="a loop of small ops (LAZYRT_LOOP_CUT)")
        tr = _trace
    refs = []
    for v in inputs:
        if type(v) is Pending:
            if v.trace is tr:
                refs.append((v.node << _SHIFT) | v.idx)
                continue
            if v.result is None:
                # A value of an earlier trace whose flush failed: retry that flush
                # (it raises again unless the cause was fixed).
                retry(v)
            v = v.result
        k = id(v)
        li = tr.leaf_index.get(k)
        if li is None:
            li = len(tr.leaves)
            tr.leaf_index[k] = li
            tr.leaves.append(v)
            tr.leaf_avals.append((v.shape, v.dtype, v.sharding) if KEY_SHARDING
                                 else (v.shape, v.dtype))
        refs.append(-li - 1)
    n = len(tr.nodes)
    tr.nodes.append(prog)
    tr.refs.append(tuple(refs))
    if scalars:
        tr.scalars.extend(scalars)
    if config.record_source or config.explain_recompile:
        tr.srcs.append(_source.user_line(3))
    COUNTERS["ops_recorded"] += 1
    avals = prog.out_avals
    if len(avals) == 1:
        return [Pending(tr, n, 0, avals[0])]
    return [Pending(tr, n, i, av) for i, av in enumerate(avals)]


def forget_last(p: Pending) -> None:
    """Unrecord the trace's last node if it made ``p`` from nothing (a factory with no
    inputs and no scalars: the ``empty`` behind ``x.to("tpu")``) and nothing holds ``p``
    any more (its storage was just given the transferred value). The caller holds
    ``LOCK``."""
    tr = _trace
    n = len(tr.nodes) - 1
    if (p.trace is not tr or p.node != n or tr.refs[n] or not tr.nodes[n].const
            or tr.nodes[n].scalar_kinds
            or sys.getrefcount(p) > 3):  # the caller's name, the argument, getrefcount's
        return
    tr.nodes.pop()
    tr.refs.pop()
    if len(tr.srcs) > n:
        tr.srcs.pop()
    COUNTERS["ops_recorded"] -= 1


def _looping(tr: Trace, prog, n: int) -> bool:
    """Whether ``prog``, recorded as node ``n``, ends a run of ``config.loop_cut`` nodes that
    repeat with a period of at most ``LOOP_PERIODS`` ops: a Python loop of small ops (a row
    at a time, ``for s in x: f(s)``). Fused whole, such a trace is one program of thousands
    of ops whose compile grows with the loop's length (1,026 ops: 13 s); cut into segments
    of ``loop_cut`` ops, the segments after the first are one program, compiled once."""
    st, nodes = tr.streaks, tr.nodes
    hit = False
    for p in range(1, LOOP_PERIODS + 1):
        if n >= p and nodes[n - p] is prog:
            st[p - 1] += 1
            hit = hit or st[p - 1] >= config.loop_cut
        else:
            st[p - 1] = 0
    return hit and tr.cuttable


def _cut(tr: Trace, reason: str = "fusion window (LAZYRT_FUSION_WINDOW)") -> None:
    """Launch the segment recorded so far (``LAZYRT_FUSION_WINDOW``): a flush whose
    execution is dispatched asynchronously, so recording goes on while it runs. Segments
    count their ops from the trace's start, which is a sync point (``loss.item()``, the
    end of ``optimizer.step``), so each step is cut at the same places and every segment
    hits the cache. If the segment fails to compile or run, nothing is cut: recording goes
    on in the same trace, and the error is raised where it would have been without a
    window, at the sync point that flushes the whole trace."""
    try:
        flush(reason=reason, trace=tr, keep_on_error=True)
    except Exception:
        tr.cuttable = False
        COUNTERS["window_cut_failures"] += 1
    else:
        COUNTERS["window_flushes"] += 1


def note_storage(st, old) -> None:
    """``st`` now holds a pending value (of the current trace); ``old`` was its previous
    value. The caller holds ``LOCK``, so no flush ran since the value was recorded."""
    if not _owned():
        raise RuntimeError(_UNLOCKED.format("storing a pending value"))
    tr = st.value.trace
    if tr.done:
        raise RuntimeError("lazyrt: internal error: a storage got a pending value of a trace "
                           "that was already flushed")
    # NOTE: weakref.ref(st) hands back st's existing ref when it has one; a dead storage
    # whose id was reused is simply replaced.
    tr.storages[id(st)] = weakref.ref(st)
    if old is not None and type(old) is not Pending:
        tr.overwritten.add(id(old))


def _live_outputs(tr: Trace):
    """(storage, output index) of every live storage holding a pending value of ``tr``,
    and the sorted output refs (the order is part of the cache key: never set order)."""
    found = []
    for ref in tr.storages.values():
        st = ref()
        if st is None:
            continue
        v = st.value
        if type(v) is Pending and v.trace is tr:
            found.append(((v.node << _SHIFT) | v.idx, st))
    refs = sorted({r for r, _ in found})
    pos = {r: i for i, r in enumerate(refs)}
    return [(st, pos[r]) for r, st in found], tuple(refs)


def live_output_values(tr: Trace) -> list[Pending]:
    """The pending values a flush of ``tr`` would materialize."""
    return [st.value for st, _ in _live_outputs(tr)[0]]


# A compiled graph whose flushes compiled this many times gets flushes of its own
# (``isolated``). NOTE: with 2, compiled gpt2/lstm training (whose first two steps differ)
# ran 4 flushes a step from step 3 on (tests/test_compile_models.py).
GRAPH_ISOLATE_MISSES = 3


def _count_graph_misses(tr: Trace) -> None:
    seen = set()
    for p in tr.nodes:
        if p.graph and p.uid not in seen:
            seen.add(p.uid)
            p.flush_misses += 1


def isolated(prog: Prog) -> bool:
    """Whether the compiled graph ``prog`` gets a flush of its own: the traces that held it
    kept compiling, because the eager code around it changes shape from call to call
    (``generate()``'s growing ``input_ids``; a training step, whose trace is the same
    every step, never is). Alone, the graph's program is a cache hit at every call, and
    only the small programs of the code around it compile."""
    return prog.flush_misses >= GRAPH_ISOLATE_MISSES


def _explain(tr: Trace, src: str) -> None:
    """From the first recompile on: nothing is cached only before the first compile."""
    if not _exes.count():
        return
    cached = _exes.recent(32)
    print(explain(tr, src, cached), file=sys.stderr)


# ---- flush ----------------------------------------------------------------


def retry(p: Pending) -> None:
    """Materialize ``p`` of an earlier trace whose flush failed, by flushing it again."""
    if p.result is not None:
        return
    if p.trace.done:
        raise RuntimeError("lazyrt: internal error: a pending value of a finished trace was "
                           "never materialized")
    flush(reason="retry", trace=p.trace)
    if p.result is None:
        raise RuntimeError("lazyrt: a pending value was dead when its trace was flushed")


def materialize(p: Pending):
    """``p``'s array, flushing its trace if it has not run yet."""
    if p.result is None:
        with LOCK:
            if p.result is None:
                if p.trace.done:
                    raise RuntimeError("lazyrt: internal error: dead pending value")
                flush(reason="materialize", trace=p.trace)
                if p.result is None:
                    raise RuntimeError("lazyrt: internal error: pending value not materialized "
                                       "by flush")
    return p.result


def _donation_mask(tr: Trace) -> tuple:
    # NOTE: donate a leaf only if its storage was overwritten in this trace and nothing
    # but the trace still references the array (refcount: the leaves list, the loop
    # variable and getrefcount's argument).
    # A leaf an op declared donated (``lazyrt.jax_op(donate=...)``) is donated whoever
    # else holds it: the caller gave its buffer up.
    ow, dc = tr.overwritten, tr.declared
    if not ow and not dc:
        return (False,) * len(tr.leaves)
    getrefcount = sys.getrefcount
    return tuple([(id(a) in ow and getrefcount(a) <= 3) or id(a) in dc for a in tr.leaves])


def flush(reason: str = "sync", trace: Trace | None = None, keep_on_error: bool = False) -> None:
    """Run the pending trace as one computation and materialize its live outputs.

    If compiling or running it fails, the error names its ops and source lines; its
    tensors stay pending on that trace (a later read retries it) and a fresh trace
    takes new ops, so one bad op does not poison unrelated work (``keep_on_error``: the
    failed trace stays the current one and takes new ops too).
    """
    with LOCK:
        tr = _trace if trace is None else trace
        if not tr.nodes or tr.done:
            return
        t_start = time.perf_counter()
        src = _source.user_line(2)
        runner = spmd_runner(tr, reason) if spmd_runner is not None else None
        outs, out_refs = _live_outputs(tr)
        leaves = tr.leaves
        donate_mask = _donation_mask(tr)
        key = (structure_hash(tr), out_refs, donate_mask)
        scal = np.asarray(tr.scalars, dtype=np.float64)
        exe = _exes.lookup(key, tr, scal)
        hit = exe is not None
        # a new trace on the CPU platform may run op by op (``coldflush``)
        need = (None if hit or runner is not None or KEY_SHARDING
                else _cold.wanted(tr, key, out_refs))
        prof = _profile.flush_range(tr, hit, src) if _PROFILING[0] else None
        donated = [a for a, d in zip(leaves, donate_mask) if d]
        kept = [a for a, d in zip(leaves, donate_mask) if not d]
        try:
            if need is None:
                exe, compile_s = _compile_for(tr, exe, key, scal, out_refs, donate_mask,
                                              (donated, kept), runner, src)
                results, exec_s, live_before = _execute(exe, donated, kept, scal)
            else:
                live_before = memory._state["live"]
                results, compile_s, exec_s = _cold.run(tr, key, out_refs, need)
        except KeyboardInterrupt:
            raise
        except Exception as e:
            if not keep_on_error:
                _replace_current(tr)
            raise _flush_error(tr, src, e) from e
        del donated, kept
        _materialize(tr, outs, results, exe)
        _account(tr, exe or _cold.record(tr, out_refs, results), results, reason, src, hit,
                 compile_s, exec_s, live_before, t_start)
        if prof is not None:
            _profile.end(prof)
    # NOTE: a fusion window's segment (``keep_on_error``, ``_cut``) runs asynchronously and
    # is no sync point: its asserts are read at the next real flush.
    if not keep_on_error:
        _asserts.check(wait=False)


def _replace_current(tr: Trace) -> None:
    """The one place the current trace is swapped: if ``tr`` is it (it ran, or its flush
    failed), a fresh trace takes new ops."""
    global _trace
    if tr is _trace:
        _trace = Trace()


def _compile_for(tr: Trace, exe, key, scal, out_refs, donate_mask, arrays, runner, src):
    """``(executable, compile seconds)`` for the flush of ``tr``: ``exe``, the cache's hit,
    or (None) a new one compiled for ``arrays`` (donated, kept) and cached under ``key``."""
    if exe is not None:
        exe.hits += 1
        COUNTERS["cache_hits"] += 1
        return exe, 0.0
    _count_graph_misses(tr)
    COMPILES_BY_OP["flush"] += 1
    if config.explain_recompile:
        _explain(tr, src)
    first, slots = (None, None) if _exes.compiled_before(key, tr) else _exes.scalar_layout(scal, tr)
    fn = build_fn(tr, out_refs, donate_mask, slots)
    n_slots = len(scal) if first is None else len(first)
    args = (*arrays, scalar_struct(n_slots))
    compiled, mem, compile_s, upgrade = _xla.compile_program(
        fn, args, donate_argnums=(0,), lean=True, tiered=True, kind="flush",
        sig=_exes.flush_signature(tr, out_refs, donate_mask, slots)) if runner is None \
        else (*runner.compile_program(fn, args, donate_argnums=(0,)), None)
    out_avals = [tr.nodes[r >> _SHIFT].out_avals[r & _MASK] for r in out_refs]
    exe = _exes.Exe(compiled, mem, tr, src, out_avals, first, slots,
                    trace_hash=hash_hex(tr, out_refs, donate_mask))
    _exes.insert(key, exe)
    if upgrade is not None:
        upgrade.arm(exe.install_from(compiled))
    _history["compiles"] += 1
    return exe, compile_s


def _execute(exe, donated: list, kept: list, scal):
    """Run ``exe``: ``(results, execute seconds, live bytes before)``; the donated
    arrays are no longer counted as live."""
    live_before = memory._state["live"]
    t0 = time.perf_counter()
    # NOTE: JAX warns about unusable donations when lowering (``_xla`` filters it
    # there), never at a call: no warning filter here (~0.2 ms a flush).
    sv = exe.sc_dev
    if sv is None:
        sv = exe.sc_dev = _scalars.vector_for(exe.compiled, len(donated) + len(kept) + 1) or False
    scal = exe.scalar_input(scal)
    if sv:
        scal = sv.put(scal)  # one explicit transfer, none when the values are the last ones
    with _X64(True), _profile.span(_profile.EXECUTE):
        results = (getattr(exe.compiled, "_call", None) or exe.compiled)(donated, kept, scal)
    exec_s = time.perf_counter() - t0
    if donated:
        memory.untrack(donated)
    return results, exec_s, live_before


def _flush_error(tr: Trace, src: str, e: Exception) -> RuntimeError:
    """The error a failed flush raises: the trace's ops and source lines."""
    ops = ", ".join(sorted({p.name for p in tr.nodes}))
    where = ""
    if tr.srcs:
        where = "\n  recorded at: " + "\n  ".join(sorted(set(tr.srcs))[:10])
    return RuntimeError(
        f"lazyrt: flushing the pending trace ({len(tr.nodes)} ops: {ops}) failed at "
        f"{src}: {type(e).__name__}: {e}{where}\nThe pending tensors are intact.")


def _materialize(tr: Trace, outs, results, exe) -> None:
    """Hand the results to the live storages; ``tr`` is done. Nothing here may fail."""
    if exe is not None:  # (run op by op: strict's ``run`` counted them)
        memory.track_outputs(results, exe.out_nbytes)
    _replace_current(tr)
    tr.done = True
    for st, k in outs:
        res = results[k]
        st.value.result = res
        st.value = res


def _account(tr: Trace, exe, results, reason, src, hit, compile_s, exec_s, live_before,
             t_start) -> None:
    """The flush's counters and log record (debug mode: wait for its results)."""
    n_ops = len(tr.nodes)
    COUNTERS["flushes"] += 1
    COUNTERS["executions"] += 1
    COUNTERS["execute_seconds"] += exec_s
    if n_ops > COUNTERS["max_trace_ops"]:
        COUNTERS["max_trace_ops"] = n_ops
    _history["flushes"] += 1
    memory.record_execution(
        mode="defer", name=reason, trace_hash=exe.trace_hash, num_ops=n_ops, cache_hit=hit,
        compile_seconds=compile_s, execute_seconds=exec_s, analysis=exe.mem,
        live_before=live_before, source=src, largest=exe.largest, t_start=t_start)
    if config.mode == "debug":
        for r in results:
            r.block_until_ready()


def cache_info() -> dict:
    return {**_exes.cache_info(), "compiles": _history["compiles"],
            "flushes": _history["flushes"]}


def clear_cache() -> None:
    _exes.clear()
    _cold.clear()

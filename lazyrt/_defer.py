"""DeferAndFuse: record Progs into a pending trace; flush it as ONE computation.

Recording appends a node and folds its structural key (prog uid, input wiring,
leaf avals) into a running hash, so the cache key of a flush costs O(1) per op
and never looks at data. Device-data leaves are keyed by shape and dtype only;
Python float scalars and RNG seeds are runtime inputs (one float64 vector), so
a changing learning rate or a fresh random draw compiles nothing new.

At a flush every storage still holding a pending value of the trace (a live
tensor) becomes an output; nothing else is materialized. A leaf whose storage
was overwritten in the trace and that nobody else references is donated.
"""
from __future__ import annotations

import difflib
import hashlib
import sys
import threading
import time
import warnings
import weakref

import jax
import numpy as np
from cachetools import LRUCache
from jax._src.lax.lax import _convert_element_type

from . import _source, _xla, memory
from ._config import config
from ._ir import Pending, aval_nbytes
from .memory import MemoryAnalysis
from .metrics import COUNTERS

LOCK = threading.RLock()
_X64 = jax.enable_x64
_SHIFT = 20
_MASK = (1 << _SHIFT) - 1


class Trace:
    __slots__ = ("nodes", "refs", "h", "leaves", "leaf_index", "scalars", "storages",
                 "overwritten", "done", "srcs", "__weakref__")

    def __init__(self):
        self.nodes: list = []  # Prog per node
        self.refs: list = []  # input refs per node (tuple of ints)
        self.h = 0  # running structural hash
        self.leaves: list = []  # materialized inputs (jax arrays)
        self.leaf_index: dict = {}  # id(array) -> leaf number
        self.scalars: list = []  # runtime scalars, flat
        # id(storage) -> weak ref, for each storage that got a pending value of this trace
        self.storages: dict = {}
        self.overwritten: set = set()  # ids of leaves whose storage was overwritten here
        self.done = False
        self.srcs: list = []  # user source line per node (when recorded)


_trace = Trace()
# lazyrt.distributed: a hook asked at each flush for an SPMD compile of traces holding
# fused collectives (None, or an object with compile(fn, donated, kept, scal)).
spmd_runner = None
# lazyrt.distributed sets this once a Mesh exists: leaves are keyed on their sharding too.
KEY_SHARDING = False
_cache: LRUCache = LRUCache(maxsize=config.cache_size)
_history = {"flushes": 0, "compiles": 0}


def current() -> Trace:
    return _trace


def pending_count() -> int:
    return len(_trace.nodes)


def record(prog, inputs, scalars):
    """Append ``prog`` applied to ``inputs`` (arrays or Pendings); returns its Pendings."""
    tr = _trace
    if len(tr.nodes) >= config.max_pending_ops:
        # NOTE: checked before recording, while this op's inputs are still held by
        # the caller, so they are live outputs of the budget flush.
        flush(reason="pending-op budget (LAZYRT_MAX_PENDING_OPS)")
        tr = _trace
    refs = []
    h = tr.h
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
            h = hash((h, -1, v.shape, v.dtype))
            if KEY_SHARDING:
                h = hash((h, v.sharding))
        refs.append(-li - 1)
    refs = tuple(refs)
    n = len(tr.nodes)
    tr.nodes.append(prog)
    tr.refs.append(refs)
    tr.h = hash((h, prog.uid, refs))
    if scalars:
        tr.scalars.extend(scalars)
    if config.record_source or config.explain_recompile:
        tr.srcs.append(_source.user_line(3))
    COUNTERS["ops_recorded"] += 1
    return [Pending(tr, n, i, av) for i, av in enumerate(prog.out_avals)]


def note_storage(st, old) -> None:
    """``st`` now holds a pending value; ``old`` was its previous value."""
    tr = _trace
    # NOTE: weakref.ref(st) hands back st's existing ref when it has one; a dead storage
    # whose id was reused is simply replaced.
    tr.storages[id(st)] = weakref.ref(st)
    if old is not None and type(old) is not Pending:
        tr.overwritten.add(id(old))


class _Exe:
    __slots__ = ("compiled", "mem", "desc", "src", "hits", "hlo", "out_nbytes", "largest")

    def __init__(self, compiled, mem, desc, src, out_avals):
        self.compiled = compiled
        self.mem = mem
        self.desc = desc
        self.src = src
        self.hits = 0
        # Per-output bytes and the five largest outputs: the same on every run, so worked
        # out once here rather than from the result arrays on each flush.
        sizes = [(aval_nbytes(s, d), tuple(s), str(np.dtype(d))) for s, d in out_avals]
        self.out_nbytes = tuple(b for b, _, _ in sizes)
        self.largest = [{"bytes": b, "shape": list(s), "dtype": d}
                        for b, s, d in sorted(sizes, reverse=True)[:5]]


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


def _needed(tr: Trace, out_refs) -> list:
    need = [False] * len(tr.nodes)
    for r in out_refs:
        need[r >> _SHIFT] = True
    for n in range(len(tr.nodes) - 1, -1, -1):
        if need[n]:
            for r in tr.refs[n]:
                if r >= 0:
                    need[r >> _SHIFT] = True
    return need


def _build_fn(tr: Trace, out_refs, donate_mask):
    nodes = list(tr.nodes)
    refs = list(tr.refs)
    need = _needed(tr, out_refs)
    n_leaves = len(tr.leaves)
    # Scalar offsets per node.
    offs, o = [], 0
    for p in nodes:
        offs.append(o)
        o += len(p.scalar_kinds)
    donated_pos = [i for i in range(n_leaves) if donate_mask[i]]
    kept_pos = [i for i in range(n_leaves) if not donate_mask[i]]

    def fn(donated, kept, scal):
        leaves = [None] * n_leaves
        for i, a in zip(donated_pos, donated):
            leaves[i] = a
        for i, a in zip(kept_pos, kept):
            leaves[i] = a
        vals = [None] * len(nodes)
        for n, p in enumerate(nodes):
            if not need[n]:
                continue
            ins = [leaves[-r - 1] if r < 0 else vals[r >> _SHIFT][r & _MASK] for r in refs[n]]
            sk = p.scalar_kinds
            if sk:
                o = offs[n]
                for j, kind in enumerate(sk):
                    s = scal[o + j]
                    if kind == "i":
                        ins.append(s.astype(np.int64))
                    else:
                        # NOTE: weak-typed, as a Python float is in PyTorch: f32 * lr stays f32.
                        ins.append(_convert_element_type(s, weak_type=True))
            vals[n] = p.fn(*ins)
        return [vals[r >> _SHIFT][r & _MASK] for r in out_refs]

    return fn


def _describe(tr: Trace) -> list:
    out = []
    for p, refs in zip(tr.nodes, tr.refs):
        ins = []
        for r in refs:
            if r < 0:
                leaf = tr.leaves[-r - 1]
                ins.append(f"in{-r - 1}:{tuple(leaf.shape)}:{leaf.dtype}")
            else:
                ins.append(f"%{r >> _SHIFT}")
        out.append(f"{p.name}[{p.desc}]({', '.join(ins)})")
    return out


def _explain(key, tr: Trace, src: str) -> None:
    if not _cache or _history["compiles"] < 2:
        return
    desc = _describe(tr)
    best, best_ratio = None, -1.0
    for exe in list(_cache.values())[-32:]:
        r = difflib.SequenceMatcher(a=exe.desc, b=desc, autojunk=False).ratio()
        if r > best_ratio:
            best, best_ratio = exe, r
    lines = [f"lazyrt: recompiling a trace of {len(desc)} ops (flush triggered at {src})"]
    if best is None:
        lines.append("  no cached trace to compare with")
    else:
        lines.append(f"  closest cached trace: {len(best.desc)} ops, {best_ratio:.0%} similar "
                     f"(compiled for the flush at {best.src})")
        sm = difflib.SequenceMatcher(a=best.desc, b=desc, autojunk=False)
        shown = 0
        for tag, i1, i2, j1, j2 in sm.get_opcodes():
            if tag == "equal":
                continue
            for k in range(max(i2 - i1, j2 - j1)):
                old = best.desc[i1 + k] if i1 + k < i2 else "-"
                new = desc[j1 + k] if j1 + k < j2 else "-"
                where = tr.srcs[j1 + k] if j1 + k < j2 and j1 + k < len(tr.srcs) else ""
                lines.append(f"  op {j1 + k}: was {old}\n          now {new}" + (f"  ({where})" if where else ""))
                shown += 1
                if shown >= 8:
                    break
            if shown >= 8:
                lines.append("  ...")
                break
        if shown == 0:
            lines.append("  same ops; the set of live outputs or donated inputs differs")
    print("\n".join(lines), file=sys.stderr)


def _hash_hex(key) -> str:
    return hashlib.sha1(repr(key).encode()).hexdigest()[:12]


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


def flush(reason: str = "sync", trace: Trace | None = None) -> None:
    """Run the pending trace as one computation and materialize its live outputs.

    If compiling or running it fails, the error names its ops and source lines; its
    tensors stay pending on that trace (a later read retries it) and a fresh trace
    takes new ops, so one bad op does not poison unrelated work.
    """
    global _trace
    with LOCK:
        tr = _trace if trace is None else trace
        if not tr.nodes or tr.done:
            return
        t_start = time.perf_counter()
        src = _source.user_line(2)
        runner = spmd_runner(tr, reason) if spmd_runner is not None else None
        outs, out_refs = _live_outputs(tr)
        n_leaves = len(tr.leaves)
        leaves = tr.leaves
        # NOTE: donate a leaf only if its storage was overwritten in this trace and
        # nothing but the trace still references the array (refcount: the leaves list,
        # the loop variable and getrefcount's argument).
        donate_mask = []
        ow = tr.overwritten
        for a in leaves:
            donate_mask.append(id(a) in ow and sys.getrefcount(a) <= 3)
        donate_mask = tuple(donate_mask)
        key = (tr.h, len(tr.nodes), out_refs, donate_mask)
        exe = _cache.get(key)
        hit = exe is not None
        donated = [a for a, d in zip(leaves, donate_mask) if d]
        kept = [a for a, d in zip(leaves, donate_mask) if not d]
        scal = np.asarray(tr.scalars, dtype=np.float64)
        compile_s = 0.0
        try:
            if exe is None:
                if config.explain_recompile:
                    _explain(key, tr, src)
                t0 = time.perf_counter()
                fn = _build_fn(tr, out_refs, donate_mask)
                with _X64(True), warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
                    if runner is None:
                        compiled = _xla.compile(jax.jit(fn, donate_argnums=(0,)).lower(donated, kept, scal))
                    else:
                        compiled = runner.compile(fn, donated, kept, scal)
                compile_s = time.perf_counter() - t0
                out_avals = [tr.nodes[r >> _SHIFT].out_avals[r & _MASK] for r in out_refs]
                exe = _Exe(compiled, MemoryAnalysis.of(compiled), _describe(tr), src, out_avals)
                _cache[key] = exe
                _history["compiles"] += 1
                COUNTERS["cache_misses"] += 1
                COUNTERS["compile_seconds"] += compile_s
            else:
                exe.hits += 1
                COUNTERS["cache_hits"] += 1
            live_before = memory._state["live"]
            passed = memory.bytes_of(leaves)
            t0 = time.perf_counter()
            with _X64(True), warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
                results = exe.compiled(donated, kept, scal)
            exec_s = time.perf_counter() - t0
            if donated:
                memory.untrack(donated)
        except KeyboardInterrupt:
            raise
        except Exception as e:
            if tr is _trace:
                _trace = Trace()
            ops = ", ".join(sorted({p.name for p in tr.nodes}))
            where = ""
            if tr.srcs:
                where = "\n  recorded at: " + "\n  ".join(sorted(set(tr.srcs))[:10])
            raise RuntimeError(
                f"lazyrt: flushing the pending trace ({len(tr.nodes)} ops: {ops}) failed at "
                f"{src}: {type(e).__name__}: {e}{where}\nThe pending tensors are intact."
            ) from e
        # Materialize: from here on nothing may fail.
        track = memory.track
        for r, nb in zip(results, exe.out_nbytes):
            track(r, nb)
        del donated, kept
        if tr is _trace:
            _trace = Trace()
        tr.done = True
        pend_res = {}
        for st, k in outs:
            v = st.value
            res = results[k]
            v.result = res
            st.value = res
            pend_res[k] = res
        n_ops = len(tr.nodes)
        COUNTERS["flushes"] += 1
        COUNTERS["executions"] += 1
        COUNTERS["execute_seconds"] += exec_s
        if n_ops > COUNTERS["max_trace_ops"]:
            COUNTERS["max_trace_ops"] = n_ops
        _history["flushes"] += 1
        memory.record_execution(
            mode="defer", name=reason, trace_hash=_hash_hex(key), num_ops=n_ops, cache_hit=hit,
            compile_seconds=compile_s, execute_seconds=exec_s, analysis=exe.mem,
            live_before=live_before, passed_bytes=passed, source=src,
            largest=[dict(d) for d in exe.largest],
            t_start=t_start)
        if config.mode == "debug":
            for r in results:
                r.block_until_ready()


def graph_text(tr: Trace, only=None) -> str:
    lines = [f"lazyrt pending trace: {len(tr.nodes)} ops, {len(tr.leaves)} inputs"]
    for i, leaf in enumerate(tr.leaves):
        lines.append(f"  in{i}: {tuple(leaf.shape)} {leaf.dtype}")
    for n, (p, refs) in enumerate(zip(tr.nodes, tr.refs)):
        if only is not None and not only[n]:
            continue
        ins = ", ".join(f"in{-r - 1}" if r < 0 else
                        (f"%{r >> _SHIFT}" if len(tr.nodes[r >> _SHIFT].out_avals) == 1
                         else f"%{r >> _SHIFT}.{r & _MASK}") for r in refs)
        outs = ", ".join(f"{tuple(s)} {d}" for s, d in p.out_avals)
        src = f"  # {tr.srcs[n]}" if n < len(tr.srcs) else ""
        static = f"[{p.desc}]" if p.desc else ""
        lines.append(f"  %{n} = {p.name}{static}({ins}) -> {outs}{src}")
    return "\n".join(lines)


def needed_for(tr: Trace, pendings) -> list:
    refs = [(p.node << _SHIFT) | p.idx for p in pendings if p.trace is tr]
    return _needed(tr, refs)


def hlo_text(tr: Trace, pendings) -> str:
    refs = tuple((p.node << _SHIFT) | p.idx for p in pendings if p.trace is tr)
    if not refs:
        return ""
    mask = tuple(False for _ in tr.leaves)
    fn = _build_fn(tr, refs, mask)
    with _X64(True):
        lowered = jax.jit(fn).lower([], list(tr.leaves), np.asarray(tr.scalars, dtype=np.float64))
    return lowered.as_text()


def cache_info() -> dict:
    return {"entries": len(_cache), "maxsize": _cache.maxsize, "compiles": _history["compiles"],
            "flushes": _history["flushes"]}


def set_cache_size(n: int) -> None:
    global _cache
    new = LRUCache(maxsize=n)
    for k, v in list(_cache.items())[-n:]:
        new[k] = v
    _cache = new

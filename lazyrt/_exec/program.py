"""A flush's program, built from its trace: the JAX function ``fn(donated, kept, scal)``
that computes the trace's live outputs (``build_fn``), which nodes it needs, and the
log's name of a compiled flush."""
from __future__ import annotations

import hashlib

import jax
import numpy as np

from . import exes as _exes
from . import lean as _lean
from .trace import _MASK, _SHIFT, Trace

try:  # a weak-typed int64, as strict's programs see a Python int (``_ops.value_ints``)
    from jax._src.lax.lax import _convert_element_type

    def _weak_int(s):
        return _convert_element_type(s, _I64, weak_type=True)
except ImportError:  # pragma: no cover - another JAX
    def _weak_int(s):
        return s.astype(np.int64)

_I64 = np.dtype(np.int64)


def needed(tr: Trace, out_refs) -> list:
    need = [False] * len(tr.nodes)
    for r in out_refs:
        need[r >> _SHIFT] = True
    for n in range(len(tr.nodes) - 1, -1, -1):
        if need[n]:
            for r in tr.refs[n]:
                if r >= 0:
                    need[r >> _SHIFT] = True
    return need


def build_fn(tr: Trace, out_refs, donate_mask, slots=None):
    """The flush's program: ``fn(donated, kept, scal)``, ``scal`` the weak-typed float64
    vector of the scalars' slots (``slots[i]``: scalar ``i``'s slot; None: slot ``i``)."""
    nodes = list(tr.nodes)
    refs = list(tr.refs)
    need = needed(tr, out_refs)
    n_leaves = len(tr.leaves)
    # Scalar slots per node.
    node_slots, o = [], 0
    for p in nodes:
        k = len(p.scalar_kinds)
        node_slots.append(tuple(range(o, o + k)) if slots is None
                          else tuple(int(x) for x in slots[o:o + k]))
        o += k
    donated_pos = [i for i in range(n_leaves) if donate_mask[i]]
    kept_pos = [i for i in range(n_leaves) if not donate_mask[i]]

    def fn(donated, kept, scal):
        leaves = [None] * n_leaves
        for i, a in zip(donated_pos, donated):
            leaves[i] = a
        for i, a in zip(kept_pos, kept):
            leaves[i] = a
        # NOTE: each slot is read once (and converted to an RNG seed once). ``scal`` is
        # weak-typed, as a Python float is in PyTorch: f32 * lr stays f32.
        taken: dict = {}
        vals = [None] * len(nodes)
        for n, p in enumerate(nodes):
            if not need[n]:
                continue
            ins = [leaves[-r - 1] if r < 0 else vals[r >> _SHIFT][r & _MASK] for r in refs[n]]
            sk = p.scalar_kinds
            if sk:
                for slot, kind in zip(node_slots[n], sk):
                    s = taken.get((slot, kind))
                    if s is None:
                        s = scal[slot]
                        if kind == "i":
                            # NOTE: weak, as a Python int: int8 x < 300 compares with
                            # 300 wrapped to int8, as strict and PyTorch's CPU do
                            s = _weak_int(s)
                        taken[(slot, kind)] = s
                    ins.append(s)
            vals[n] = p.fn(*ins)
        return [vals[r >> _SHIFT][r & _MASK] for r in out_refs]

    return fn


def scalar_struct(n: int):
    return jax.ShapeDtypeStruct((n,), np.float64, weak_type=True)


def hash_hex(tr: Trace, out_refs, donate_mask) -> str:
    """The log's name of a compiled flush (``FlushRecord.trace_hash``): the same in every
    process that records the same ops in the same order. Made once per executable."""
    key = (tuple(p.uid for p in tr.nodes), tr.refs, tr.leaf_avals, out_refs, donate_mask)
    return hashlib.sha1(repr(key).encode()).hexdigest()[:12]


def needed_for(tr: Trace, pendings) -> list:
    """Which nodes the values ``pendings`` need (``lazyrt.graph``)."""
    refs = [(p.node << _SHIFT) | p.idx for p in pendings if p.trace is tr]
    return needed(tr, refs)


def hlo_text(tr: Trace, pendings) -> str:
    """The program a flush of ``pendings`` would compile, as text (``lazyrt.hlo``)."""
    refs = tuple((p.node << _SHIFT) | p.idx for p in pendings if p.trace is tr)
    if not refs:
        return ""
    mask = tuple(False for _ in tr.leaves)
    scal = np.asarray(tr.scalars, dtype=np.float64)
    first, slots = _exes.scalar_layout(scal, tr)
    fn = build_fn(tr, refs, mask, slots)
    n_slots = len(scal) if first is None else len(first)
    with jax.enable_x64(True):
        lowered = _lean.lower(jax.jit(fn), ([], list(tr.leaves), scalar_struct(n_slots)))
    return lowered.as_text()

"""Flat draws: a random plan's draw over N elements, flat, shared by every shape.

JAX's partitionable threefry makes element i of a draw from its i-th counter, so a draw of
shape S is a flat draw of ``prod(S)`` elements reshaped, and the first elements of any longer
flat draw (the draws of ``lowering.random_ops.FLAT_DRAWS``). A random plan's first calls
of a new shape run one of these instead (``lazyrt._exec.flatdraw``): one compile per
bucketed length, not one per shape.
"""
from __future__ import annotations

import jax.numpy as jnp
from cachetools import LRUCache

from .._base.ir import Prog
from ..lowering.random_ops import FLAT_DRAWS
from .args import TSLOT, signature, static_desc

# the flat draws' Progs, shared by every plan of the same draw (``maker``)
_FLAT_PROGS: LRUCache = LRUCache(maxsize=256)


def clear() -> None:
    _FLAT_PROGS.clear()


def maker(e, tpl_args, tpl_kwargs, in_avals, scalar_kinds, out_avals, narrow, c32, layout,
          caller, fixed):
    """For a draw made element by element (``lowering.random_ops.FLAT_DRAWS``): N -> the
    Prog of the same draw over N elements, flat, with the same scalars (and no array: a
    "self" draw reads only its input's shape). One Prog per (draw, static arguments, N),
    whatever the plan's shape; None where the plan is not such a draw. ``caller`` and
    ``fixed``: ``_ops.plan``'s, the lowering called on flat inputs and its outputs fixed."""
    low = e.resolution.lowering
    how = FLAT_DRAWS.get(low.op) if low is not None else None
    if how is None or len(out_avals) != 1:
        return None
    if how == "self":
        if len(in_avals) != 1 or not tpl_args or tpl_args[0] is not TSLOT:
            return None  # a view of a base (``view_as_real(t).uniform_()``): per shape
        in_dt = in_avals[0][1]
    else:
        names = [a.name for a in e.op._schema.arguments]
        if in_avals or "size" not in names or names.index("size") >= len(tpl_args):
            return None
        idx = names.index("size")
    dt, nd = out_avals[0][1], narrow[0]

    def make(n: int):
        if how == "self":
            args, arr = tpl_args, [((n,), in_dt)]
        else:
            args, arr = list(tpl_args), []
            args[idx] = [n]
        sig = signature(e, args, tpl_kwargs, tuple(arr), scalar_kinds,
                        (((n,), dt),) if nd is None and not c32 else ((((n,), dt),), (nd,), c32))
        if sig is None:
            return None
        prog = _FLAT_PROGS.get(sig)
        if prog is None:
            call = caller(e, args, tpl_kwargs, len(arr), c32)

            def fn(*sc):
                zeros = [jnp.zeros(s, d) for s, d in arr]  # the shape only: never read
                return fixed(e, layout.flatten(call(*zeros, *sc)), (((n,), dt),), (nd,))

            prog = Prog(e.packet, fn, scalar_kinds, (((n,), dt),),
                        desc=f"{static_desc(args, tpl_kwargs)} flat", op=e.op)
            prog.sig = sig
            _FLAT_PROGS[sig] = prog
        return prog

    return make

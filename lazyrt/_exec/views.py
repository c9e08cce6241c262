"""View chains: deriving a view's value from its base, and writing through a view.

A view tensor keeps ``_chain``: a tuple of ``(plan, output index)`` view steps from its
base's value. Reading it applies the steps (``chain_prog``); writing ``new`` into it
runs the steps' inverses back to the base (``write_prog``). An inverse is registered
next to its view's lowering (``lowering._registry.INVERSES``); any other view gets the
generic inverse here, derived from the view's own lowering.

Both program caches are bounded LRUs (``config.plan_cache_size`` each).
"""
from __future__ import annotations

import collections

import jax.numpy as jnp

from .._base.config import config
from .._base.ir import Prog
from ..lowering._registry import INVERSES


class _LRU:
    """A bounded map, least recently used out first (the view-program caches)."""

    __slots__ = ("d",)

    def __init__(self):
        self.d = collections.OrderedDict()

    def get(self, key):
        v = self.d.get(key)
        if v is not None:
            self.d.move_to_end(key)
        return v

    def put(self, key, value) -> None:
        self.d[key] = value
        while len(self.d) > config.plan_cache_size:
            self.d.popitem(last=False)

    def clear(self) -> None:
        self.d.clear()

    def __len__(self) -> int:
        return len(self.d)


_chain_progs = _LRU()
_write_progs = _LRU()


def apply_chain(chain, x, raw: bool = False):
    """``x`` (a base value) pushed through the view steps of ``chain``."""
    for plan, i in chain:
        x = (plan.raw if raw else plan.prog.fn)(x)[i]
    return x


def chain_text(chain) -> str:
    """``transpose(0, 1)->select(0, 2)``: a view chain, readably."""
    return "->".join(f"{plan.entry.packet}({plan.prog.desc})" for plan, _ in chain)


def chain_prog(chain) -> Prog:
    """The program deriving a view's value from its base value."""
    p = _chain_progs.get(chain)
    if p is None:
        last_plan, last_i = chain[-1]
        aval = last_plan.prog.out_avals[last_i]

        def fn(x):
            return (apply_chain(chain, x),)

        p = Prog("view", fn, (), (aval,), desc=chain_text(chain))
        _chain_progs.put(chain, p)
    return p


def inverse(plan, i: int, base, new):
    """The base value after writing ``new`` into output ``i`` of view ``plan`` of ``base``."""
    inv = INVERSES.get(plan.entry.op)
    if inv is not None:
        return inv(base, new)
    # NOTE: generic inverse of any index-rearranging view: push an iota of the base
    # through the view to learn which base element each view element is, then scatter.
    idx_dtype = jnp.int64 if base.size >= 2**31 else jnp.int32
    iota = jnp.arange(base.size, dtype=idx_dtype).reshape(base.shape)
    idx = plan.raw(iota)[i]
    flat = base.reshape(-1).at[idx.reshape(-1)].set(new.reshape(-1).astype(base.dtype))
    return flat.reshape(base.shape)


def write_prog(chain) -> Prog:
    """The program ``(base, new) -> base'`` writing a view's new value into its base."""
    p = _write_progs.get(chain)
    if p is None:
        base_aval = chain[0][0].in_avals[0]

        def fn(base, new):
            xs = [base]
            for plan, i in chain[:-1]:
                xs.append(plan.prog.fn(xs[-1])[i])
            v = new
            for (plan, i), x in zip(reversed(chain), reversed(xs)):
                v = inverse(plan, i, x, v)
            return (v,)

        p = Prog("write_through_view", fn, (), (base_aval,), desc=chain_text(chain))
        _write_progs.put(chain, p)
    return p


def cache_info() -> dict:
    return {"view_programs": len(_chain_progs), "write_programs": len(_write_progs),
            "maxsize": config.plan_cache_size}


def clear() -> None:
    _chain_progs.clear()
    _write_progs.clear()

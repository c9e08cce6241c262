"""View chains: deriving a view's value from its base, and writing through a view.

A view tensor keeps ``_chain``: a tuple of ``(plan, output index)`` view steps from its
base's value. Reading it applies the steps (``chain_prog``); writing ``new`` into it
runs the steps' inverses back to the base (``write_prog``). An inverse is registered
next to its view's lowering (``lowering._registry.INVERSES``); any other view gets the
generic inverse here, derived from the view's own lowering.

Positions: a step that only picks a position (``x[i]``, ``x[i:i + k]``: ``_ops.positions``)
is ``(plan, output index, positions)``, its plan the same for every position and its
positions runtime ints (``RuntimeInt``, "i" scalars) of the programs that apply it. A
chain holding such a step is a ``PosChain``: a tuple whose ``skey`` (the steps without
their positions) keys programs and plans, and whose ``pos`` (all its positions, in step
order) are the scalars those programs take. The chain itself (positions included) is
what identity and equality see, so every copy of a view's chain carries its positions.

Both program caches are bounded LRUs (``config.plan_cache_size`` each).
"""
from __future__ import annotations

import collections
import hashlib
import weakref

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


class PosChain(tuple):
    """A view chain with positional steps ``(plan, i, positions)`` (module docstring)."""

    def __new__(cls, steps):
        self = super().__new__(cls, steps)
        self.skey = tuple([s[:2] for s in steps])
        pos = []
        for s in steps:
            if len(s) == 3:
                pos.extend(s[2])
        self.pos = tuple(pos)
        return self


# plan -> fn(base, new, *positions): the inverse of a positional view step (registered by
# ``_ops.positions`` when it builds the step's plan); weak, as plans are evicted.
POSITION_INVERSES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def extend(prefix, step: tuple):
    """The chain ``prefix`` (or None) followed by ``step``."""
    if prefix is None:
        return PosChain((step,)) if len(step) == 3 else (step,)
    if len(step) == 3 or type(prefix) is PosChain:
        return PosChain(prefix + (step,))
    return prefix + (step,)


def chain_key(chain):
    """What programs and plans are keyed by: the steps without their positions."""
    return chain.skey if type(chain) is PosChain else chain


def chain_scalars(chain) -> list:
    """The runtime scalars of ``chain``'s programs (its positions; none for most views)."""
    return list(chain.pos) if type(chain) is PosChain else []


def _step(step, x, it_sc, raw: bool):
    plan, i = step[0], step[1]
    f = plan.raw if raw else plan.prog.fn
    if len(step) == 3:
        sc = step[2] if it_sc is None else [next(it_sc) for _ in step[2]]
        return f(x, *sc)[i]
    return f(x)[i]


def apply_chain(chain, x, raw: bool = False, it_sc=None):
    """``x`` (a base value) pushed through the view steps of ``chain``; a positional
    step takes its positions from ``it_sc`` (runtime scalars, in step order) when given."""
    for step in chain:
        x = _step(step, x, it_sc, raw)
    return x


def chain_text(chain) -> str:
    """``transpose(0, 1)->select(0, <int>)``: a view chain, readably (positions are
    runtime values: ``<int>``)."""
    return "->".join(f"{s[0].entry.packet}({s[0].prog.desc})" for s in chain)


def chain_prog(chain) -> Prog:
    """The program deriving a view's value from its base value (and the chain's positions:
    ``chain_scalars``)."""
    k = chain_key(chain)
    p = _chain_progs.get(k)
    if p is None:
        last = chain[-1]
        aval = last[0].prog.out_avals[last[1]]
        n = len(chain_scalars(chain))

        def fn(x, *pos):
            return (apply_chain(chain, x, it_sc=iter(pos)),)

        p = Prog("view", fn, ("i",) * n, (aval,), desc=chain_text(chain))
        p.sig = _chain_sig("view", chain)
        _chain_progs.put(k, p)
    return p


def inverse(plan, i: int, base, new, pos=()):
    """The base value after writing ``new`` into output ``i`` of view ``plan`` of ``base``
    (``pos``: the step's positions, for a positional step)."""
    if pos:
        inv = POSITION_INVERSES.get(plan)
        if inv is not None:
            return inv(base, new, *pos)
        return _generic_inverse(base, new, plan.raw(_iota(base), *pos)[i])
    inv = INVERSES.get(plan.entry.op)
    if inv is not None:
        return inv(base, new)
    return _generic_inverse(base, new, plan.raw(_iota(base))[i])


def _iota(base):
    idx_dtype = jnp.int64 if base.size >= 2**31 else jnp.int32
    return jnp.arange(base.size, dtype=idx_dtype).reshape(base.shape)


def _generic_inverse(base, new, idx):
    # NOTE: generic inverse of any index-rearranging view: push an iota of the base
    # through the view to learn which base element each view element is, then scatter.
    flat = base.reshape(-1).at[idx.reshape(-1)].set(new.reshape(-1).astype(base.dtype))
    return flat.reshape(base.shape)


def write_prog(chain) -> Prog:
    """The program ``(base, new, *positions) -> base'`` writing a view's new value into its
    base (positions: ``chain_scalars``)."""
    k = chain_key(chain)
    p = _write_progs.get(k)
    if p is None:
        base_aval = chain[0][0].in_avals[0]
        n = len(chain_scalars(chain))

        def fn(base, new, *pos):
            it = iter(pos)
            steps = [(s[0], s[1], tuple(next(it) for _ in s[2]) if len(s) == 3 else ())
                     for s in chain]
            xs = [base]
            for plan, i, sp in steps[:-1]:
                xs.append((plan.prog.fn(xs[-1], *sp) if sp else plan.prog.fn(xs[-1]))[i])
            v = new
            for (plan, i, sp), x in zip(reversed(steps), reversed(xs)):
                v = inverse(plan, i, x, v, sp)
            return (v,)

        p = Prog("write_through_view", fn, ("i",) * n, (base_aval,), desc=chain_text(chain))
        p.sig = _chain_sig("write_through_view", chain)
        _write_progs.put(k, p)
    return p


def _chain_sig(kind: str, chain) -> str | None:
    """A view program's ``Prog.sig``: its kind and its steps' plans' signatures."""
    parts = []
    for s in chain:
        sig = s[0].prog.sig
        if sig is None:
            return None
        parts.append(f"{sig}:{s[1]}:{len(s[2]) if len(s) == 3 else -1}")
    return hashlib.sha256(f"{kind}({';'.join(parts)})".encode()).hexdigest()[:32]


def cache_info() -> dict:
    return {"view_programs": len(_chain_progs), "write_programs": len(_write_progs),
            "maxsize": config.plan_cache_size}


def clear() -> None:
    _chain_progs.clear()
    _write_progs.clear()

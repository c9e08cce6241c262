"""How an ATen op runs on tpu: THE lookup order, in one function (``lookup``).

  1. a special handler (``_special.SPECIAL``: host transfers, ``.item()``, mask indexing)
  2. an in-place view op (``squeeze_``): its functional view, set on the same tensor
  3. a lowering in the table (``lazyrt.lowering``)
  4. derived: an in-place ``foo_`` / ``foo.out`` variant of a lowered ``foo``
  5. PyTorch's CompositeImplicitAutograd kernel
  6. a ``torch._decomp`` decomposition, or a ``torch.library.custom_op``'s own kernel (a
     Python function over torch ops: FlexAttention's ``flex_lib.zeros_and_scatter``)
  7. an in-place / out= variant whose functional op runs some other way: run it, copy back
  8. missing: ``NotImplementedError`` naming the op (or the CPU fallback, when on)

``resolve`` turns the answer into an ``OpEntry`` (schema facts, the handler, the plan
cache), once per op; ``lazyrt.coverage()`` reads ``lookup`` too, so what it reports is
what the dispatcher does.
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

from torch._ops import OpOverload

from .. import lowering
from ..lowering._registry import Lowering
from . import handlers as h
from . import value_ints as _value_ints
from .schema import (
    Schema,
    custom_kernel,
    decomposition,
    functional_of,
    has_composite_implicit,
    is_view_op,
)
from .special import SPECIAL

LOWERINGS = lowering.LOWERINGS


@dataclasses.dataclass(frozen=True)
class Resolution:
    """The answer of ``lookup``: how an op runs."""

    how: str  # special | lowered | derived | composite | decomposed | functional |
    #           inplace_view | missing
    lowering: Lowering | None = None  # lowered/derived (and a special's own lowering)
    functional: OpOverload | None = None  # derived/functional/inplace_view: the op computed
    decomp: Callable | None = None  # decomposed: the torch._decomp function
    special: Callable | None = None  # special: its handler


def lookup(op: OpOverload) -> Resolution:
    """THE lookup order (module docstring)."""
    writes = any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)
    f = functional_of(op)
    low = LOWERINGS.get(op)
    flow = LOWERINGS.get(f) if f is not None else None
    derived_ok = flow is not None and not flow.data_dependent and flow.mutates is None
    special = SPECIAL.get(op)
    if special is not None:
        return Resolution("special", low or (flow if derived_ok else None), f, special=special)
    if writes and f is not None and is_view_op(f):
        # squeeze_, unsqueeze_, transpose_, t_, as_strided_, swapdims_: metadata only
        return Resolution("inplace_view", functional=f)
    if low is not None:
        return Resolution("lowered", low)
    if derived_ok:
        return Resolution("derived", flow, f)
    if has_composite_implicit(op):
        return Resolution("composite")
    d = decomposition(op) or custom_kernel(op)
    if d is not None:
        return Resolution("decomposed", decomp=d)
    if f is not None and writes:
        return Resolution("functional", functional=f)
    return Resolution("missing")


class OpEntry(Schema):
    """An op as the dispatcher runs it: schema facts, handler, lowering, plan cache."""

    __slots__ = ("handler", "fn", "static_floats", "random", "data_dependent", "decomp",
                 "functional", "plans", "resolution", "int_slots")

    def __init__(self, op: OpOverload, r: Resolution):
        super().__init__(op)
        self.resolution = r
        self.plans: dict = {}
        self.fn = None
        self.static_floats = False
        self.random = self.has_generator
        self.data_dependent = False
        self.decomp = r.decomp
        self.functional = r.functional
        if r.lowering is not None:
            self._use(r.lowering, derived=r.lowering.op is not op)
        # value ints as runtime ints (``value_ints``): lowered ops with runtime floats
        self.int_slots = ((), ())
        # (a special handler that only checks, then runs the lowered op, keeps them:
        # ``_ops.int_checks``)
        if (r.how in ("lowered", "derived") or getattr(r.special, "value_ints", False)) \
                and not self.static_floats:
            self.int_slots = _value_ints.slots(op)
        if r.how == "lowered":
            self.handler = self._handler_for_lowering()
        elif r.how == "special":
            self.handler = r.special
        else:
            self.handler = _HANDLERS[r.how]

    def _use(self, low: Lowering, derived: bool) -> None:
        fn = low.fn
        if derived and self.out_names:
            outs = set(self.out_names)

            def fn(*args, _f=low.fn, **kwargs):
                return _f(*args, **{k: v for k, v in kwargs.items() if k not in outs})

        self.fn = fn
        self.static_floats = low.static_floats
        self.random = self.random or low.random
        self.data_dependent = low.data_dependent
        if low.mutates is not None and not derived:
            self.with_mutated(low.mutates)

    def _handler_for_lowering(self):
        if self.data_dependent:
            return h.data_dependent
        if self.is_view:
            return h.view
        if self.mut:
            return h.mutating
        return h.functional


_HANDLERS = {
    "derived": h.mutating,
    "composite": h.composite,
    "decomposed": h.decomposed,
    "functional": h.via_functional,
    "inplace_view": h.inplace_view,
    "missing": h.missing,
}

ENTRIES: dict[OpOverload, OpEntry] = {}
# The same entries by ``id(op)``, for the dispatcher: an ``OpOverload`` hashes in Python
# (``torch._ops``), ~0.15 us per op; an int hashes in C. An op in ``BY_ID`` is a key of
# ``ENTRIES`` too (both change together), which keeps it alive: its id is never reused.
BY_ID: dict[int, OpEntry] = {}
_LOCK = threading.RLock()


def resolve(op: OpOverload) -> OpEntry:
    """The entry of ``op``, resolved on first use."""
    e = ENTRIES.get(op)
    if e is not None:
        return e
    with _LOCK:
        e = ENTRIES.get(op)
        if e is None:
            e = OpEntry(op, lookup(op))
            ENTRIES[op] = e
            BY_ID[id(op)] = e
        return e


def set_special(op: OpOverload, handler: Callable) -> None:
    """Route ``op`` to ``handler(entry, args, kwargs)`` from its next call on (a package
    built on lazyrt, e.g. ``lazyrt.distributed``'s collectives)."""
    with _LOCK:
        SPECIAL[op] = handler
        ENTRIES.pop(op, None)
        BY_ID.pop(id(op), None)


def forget(op: OpOverload) -> None:
    """Resolve ``op`` afresh at its next call (its lowering was just registered)."""
    with _LOCK:
        ENTRIES.pop(op, None)
        BY_ID.pop(id(op), None)


def invalidate_plans(ops=None) -> list:
    """Drop the cached plans of ``ops`` and of their in-place/out= variants, or of every
    op when ``ops`` is None; returns their Progs (whose executables go too). The caller
    flushes pending work first (``_control``); existing tensors are unaffected."""
    dropped = []
    with _LOCK:
        for op, e in list(ENTRIES.items()):
            if ops is None or op in ops or e.functional in ops:
                dropped.extend(p.prog for p in e.plans.values())
                e.plans.clear()
    return dropped

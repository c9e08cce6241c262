"""Positions: integer arguments that only pick *where* an op reads or writes are runtime
ints of its programs, not static arguments, so a loop over positions compiles one program
per shape, never one per position.

Which ints are positions (shapes never are: they stay static):

* ``select(x, dim, i)`` (``x[i]``, ``x[:, i]``, ``x[i] = v``): ``i``;
* ``slice(x, dim, start, end, step)`` (``x[i:i + k]``, ``narrow``): ``start``, when it is
  not 0; the slice's length and step stay static (the plan is keyed by them);
* ``unbind(x, dim)`` (``for row in x``): each element is ``select(x, dim, i)``;
* ``roll(x, shifts, dims)``: ``shifts`` (taken modulo the dim's size).

A positional view step is ``(plan, 0, (RuntimeInt(i),))`` (``_exec.views.PosChain``): the
plan is keyed by the base's shape, strides and dtype (never its storage offset, which moves
with the positions of the views it is itself a view of), the dim and the static extent; the
view's storage offset is computed here per call. Ops on such a view pass its positions as
"i" scalars (``args.view_key``); reading it and writing through it pass them to the view
programs (``_exec.views``). ``lax.dynamic_slice`` clamps an index: every position is
checked on the host first, and one out of range takes the op's own path, whose meta kernel
raises PyTorch's error (``IndexError`` for ``select``) at the op, as on the CPU.
"""
from __future__ import annotations

import weakref

import jax
import torch

from .._base import dtypes as _dtypes
from .._base.tensor import TpuTensor
from .._exec.views import POSITION_INVERSES, PosChain, extend
from ..lowering.views import select_inverse, slice_at_inverse, slice_bounds
from .args import RuntimeInt, SliceEnd, arg
from .plan import make_plan, remember

aten = torch.ops.aten

# View ops whose ints may be positions (``view``).
VIEWS = frozenset({"select", "slice", "unbind"})

# plan -> its base's storage offset when the plan was made (``moved``)
_BASE_OFF: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _aval(base: TpuTensor):
    return jax.ShapeDtypeStruct(base._spec[0], _dtypes.to_jax(base._spec[2]))


def view(e, base: TpuTensor, args, kwargs):
    """The view op ``e`` of ``base`` at runtime positions, or None: the op's own path
    (static arguments: another argument kind, a start of 0, or an error to raise)."""
    p = e.packet
    if p == "select":
        return _select(e, base, arg(args, kwargs, "dim", 1), arg(args, kwargs, "index", 2))
    if p == "slice":
        return _slice(e, base, arg(args, kwargs, "dim", 1), arg(args, kwargs, "start", 2),
                      arg(args, kwargs, "end", 3), arg(args, kwargs, "step", 4))
    if p == "unbind":
        return _unbind(base, arg(args, kwargs, "dim", 1))
    return None


def _dim(base: TpuTensor, dim) -> int | None:
    nd = len(base._spec[0])
    if type(dim) is not int or not -nd <= dim < nd:
        return None
    return dim % nd


def _select(e, base, dim, index):
    d = _dim(base, 0 if dim is None else dim)
    if d is None or type(index) is not int:
        return None
    shape, stride, dtype, off = base._spec
    n = shape[d]
    if not -n <= index < n:
        return None  # the meta kernel raises PyTorch's IndexError
    i = RuntimeInt(index + n if index < 0 else index)
    key = ("pos", shape, stride, dtype, d)
    plan = e.plans.get(key)
    if plan is None:
        plan = make_plan(e, (base, d, i), {}, [_aval(base)], [i], fold=False)
        POSITION_INVERSES[plan] = lambda b, new, j, _d=d: select_inverse(b, new, _d, j)
        remember(e.plans, key, plan)
    o_shape, o_stride, o_dtype, _ = plan.out_specs[0]
    spec = (o_shape, o_stride, o_dtype, off + i * stride[d])
    return TpuTensor._wrap(spec, base._st, extend(base._chain, (plan, 0, (i,))))


def _slice(e, base, dim, start, end, step):
    d = _dim(base, 0 if dim is None else dim)
    step = 1 if step is None else step
    if d is None or type(step) is not int or step <= 0 \
            or not all(v is None or type(v) is int for v in (start, end)):
        return None
    shape, stride, dtype, off = base._spec
    n = shape[d]
    s, t = slice_bounds(start, end, n)
    if s == 0:
        return None  # a slice from the start: static (the common ``x[:, :k]``)
    length = -(-(t - s) // step)
    i = RuntimeInt(s)
    key = ("pos", shape, stride, dtype, d, length, step)
    plan = e.plans.get(key)
    if plan is None:
        plan = make_plan(e, (base, d, i, SliceEnd(t, length), step), {}, [_aval(base)], [i],
                         fold=False)
        POSITION_INVERSES[plan] = (
            lambda b, new, j, _d=d, _n=length, _s=step: slice_at_inverse(b, new, _d, j, _n, _s))
        remember(e.plans, key, plan)
    o_shape, o_stride, o_dtype, _ = plan.out_specs[0]
    spec = (o_shape, o_stride, o_dtype, off + s * stride[d])
    return TpuTensor._wrap(spec, base._st, extend(base._chain, (plan, 0, (i,))))


def _unbind(base, dim):
    d = _dim(base, 0 if dim is None else dim)
    if d is None or base._spec[0][d] == 0:
        return None
    # NOTE: below autograd and ADInplaceOrView: the views are the unbind's own outputs,
    # which the dispatcher above this op wraps as unbind's.
    with torch._C._AutoDispatchBelowADInplaceOrView():
        return [aten.select.int(base, d, i) for i in range(base._spec[0][d])]


def moving(base: TpuTensor) -> bool:
    """Whether views of ``base`` are keyed without its storage offset (``moved``): it is
    itself a view at runtime positions."""
    return type(base._chain) is PosChain


def note_base(plan, base: TpuTensor) -> None:
    """``plan`` (a view of a ``moving`` base) was made at ``base``'s storage offset."""
    _BASE_OFF[plan] = base._spec[3]


def moved(spec: tuple, plan, base: TpuTensor) -> tuple:
    """The spec of ``plan``'s output ``spec`` taken of ``base`` (a ``moving`` base at another
    storage offset than the one the plan was made at: a view moves with its base)."""
    return (spec[0], spec[1], spec[2], spec[3] - _BASE_OFF[plan] + base._spec[3])


def roll_args(args, kwargs):
    """``roll``'s arguments with its shifts as runtime ints (modulo the dim's size), or the
    arguments as they are (the op's own checks and errors)."""
    x = args[0] if args else kwargs.get("self")
    shifts = arg(args, kwargs, "shifts", 1)
    dims = arg(args, kwargs, "dims", 2) or ()
    if type(x) is not TpuTensor or not isinstance(shifts, (list, tuple)) \
            or not all(type(v) is int for v in (*shifts, *dims)):
        return args, kwargs
    shape = x._spec[0]
    if not dims:
        if len(shifts) != 1:
            return args, kwargs
        sizes = [x.numel()]
    else:
        if len(shifts) != len(dims) or not all(-len(shape) <= v < len(shape) for v in dims):
            return args, kwargs
        sizes = [shape[v] for v in dims]
    if 0 in sizes:
        return args, kwargs
    rs = [RuntimeInt(s % n) for s, n in zip(shifts, sizes)]
    return (x, rs, list(dims)), {}

"""How each kind of op runs, once resolved (``_resolve`` picks one per op).

A handler is ``handler(entry, args, kwargs) -> result``:

  functional       plan, run its Prog, wrap the fresh outputs
  mutating         the same, then write the new values into the mutated arguments
  view             no computation: a new tensor on the same storage, one more view step
  inplace_view     ``t.squeeze_()``: ``t`` becomes the out-of-place view, same object
  data_dependent   output shape depends on values: a sync point, run on concrete arrays
  composite        PyTorch's CompositeImplicitAutograd kernel
  decomposed       ``torch._decomp``
  via_functional   an in-place/out= op whose functional op runs: run it, ``copy_`` back
  missing          NotImplementedError naming the op (or the CPU fallback, when on)
"""
from __future__ import annotations

import math
import re
import warnings

import jax
import jax.numpy as jnp
import torch

from .._base import dtypes as _dtypes
from .._base import memory
from .._base.config import config
from .._base.metrics import COUNTERS
from .._base.tensor import (
    TpuTensor,
    contiguous_strides,
    storage_dtype,
    storage_extent,
    storage_itemsize,
)
from .._exec import values as _values
from .._exec.values import new_tensor, run, to_cpu, write
from .._exec.views import PosChain, extend
from . import append as _append
from . import fallback as _fallback
from . import positions as _positions
from .args import arg, walk
from .plan import make_plan, plan_for, remember

aten = torch.ops.aten
_X64 = jax.enable_x64
_IDENTITY_VIEWS = frozenset({"alias", "detach", "lift_fresh"})
_WINDOWS = frozenset({"slice", "select"})


def _fake_for_tracer(t: TpuTensor):
    """``torch.tensor(data, device="tpu")`` while Dynamo or AOTAutograd traces: the tensor
    is made for real below the tracing modes, then lifted, and fake mode leaves a subclass
    it does not know to it. The lift answers for the tracer as for a CUDA tensor's: the
    data as a CPU constant, lifted and copied to the device through the active modes (a
    fake tpu tensor; in a graph, a constant and its ``_to_copy``). None when nothing
    traces."""
    if torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None:
        return None
    cpu = aten.lift_fresh.default(to_cpu(t))
    return aten._to_copy.default(cpu, device=t.device)


def functional(e, args, kwargs):
    plan, vals, scal = plan_for(e, args, kwargs)
    outs = run(plan.prog, vals, scal)
    single = plan.layout.single
    if single is not None:
        return new_tensor(outs[0], single)
    res, _ = plan.layout.wrap_fresh(outs, new_tensor)
    return res[0] if e.n_returns == 1 else tuple(res)


def mutating(e, args, kwargs):
    try:
        plan, vals, scal = plan_for(e, args, kwargs)
    except RuntimeError as ex:
        if not e.out_names:
            raise
        return out_dtype_as_cpu(e, args, kwargs, ex)
    return finish_mutating(e, plan, run(plan.prog, vals, scal), args, kwargs)


def finish_mutating(e, plan, outs, args, kwargs):
    """A mutating op's results from its program's outputs ``outs``: the out= tensors
    resized, the mutated arguments written back, the returns in the schema's order."""
    layout = plan.layout
    if plan.resize is not None:
        for name, pos, (shape, stride, _, _) in plan.resize:
            resize_output(arg(args, kwargs, name, pos), shape, stride)
    fresh, i = layout.wrap_fresh(outs, new_tensor)
    muts = layout.write_back(args, kwargs, outs, i, write)
    if e.n_returns == 0:
        return None
    res = []
    fi = 0
    for alias in e.ret_alias:
        if alias >= 0:
            res.append(muts[alias])
        else:
            res.append(fresh[fi])
            fi += 1
    return res[0] if e.n_returns == 1 else tuple(res)


def view(e, args, kwargs):
    """A view op: no computation at all. The new tensor shares the base's storage and
    records one more view step; its value is derived only when something reads it."""
    base = args[0]
    if type(base) is not TpuTensor:
        return functional(e, args, kwargs)
    if base._chain is not None and e.packet in _WINDOWS:
        w = _append.window(e.packet, base, args, kwargs)
        if w is not None:  # the end of a grown tensor: from its buffer
            return view(e, *w)
    if e.packet in _positions.VIEWS:
        r = _positions.view(e, base, args, kwargs)
        if r is not None:  # at runtime positions
            return r
    if e.packet == "as_strided":
        _check_storage_bounds(base, args, kwargs)
        root = _append.storage_root(base) if base._chain is not None else None
        if root is not None and root._chain is not base._chain:
            # NOTE: as_strided's offset and strides address the base's storage, not the
            # view; without an offset it is the view's own.
            size, stride = args[1], args[2]
            off = args[3] if len(args) > 3 else kwargs.get("storage_offset")
            return view(e, (root, size, stride, base._spec[3] if off is None else off), {})
    vals: list = []
    scal: list = []
    rest = tuple([walk(e, a, vals, scal, True) for a in args[1:]])
    kw = tuple([(k, walk(e, v, vals, scal, True)) for k, v in kwargs.items()]) if kwargs else ()
    if vals or scal:  # another tensor or a float argument: not a pure view of args[0]
        return functional(e, args, kwargs)
    # a view of a view at runtime positions: keyed without the storage offset that moves
    # with them (``_positions.moved``)
    moving = type(base._chain) is PosChain and e.packet != "as_strided"
    key = ("view", base._spec[:3] if moving else base._spec, rest, kw)
    plan = e.plans.get(key)
    if plan is None:
        # NOTE: the plan needs the base's aval only; reading its value would record (defer)
        # or run (strict) the view chain for nothing, and only on this first call.
        aval = jax.ShapeDtypeStruct(tuple(base.shape), _dtypes.to_jax(base.dtype))
        plan = make_plan(e, args, kwargs, [aval], [], fold=False)
        if moving:
            _positions.note_base(plan, base)
        remember(e.plans, key, plan)
    st = base._st
    if e.packet in _IDENTITY_VIEWS:
        if e.packet == "lift_fresh":
            fake = _fake_for_tracer(base)
            if fake is not None:
                return fake
        # detach/alias: the same storage at the same chain, no extra step to derive.
        s = plan.out_specs[0]
        return TpuTensor._wrap(_positions.moved(s, plan, base) if moving else s, st,
                               base._chain, base._cache, base._cver)
    if type(base._chain) is PosChain:
        return _positional_views(e, plan, base, moving)
    prefix = base._chain or ()
    res = []
    i = 0
    for s, k in zip(plan.layout.fresh, plan.layout.kinds):
        if k == "TL":
            res.append([TpuTensor._wrap(sp, st, prefix + ((plan, i + j),)) for j, sp in enumerate(s)])
            i += len(s)
        else:
            res.append(TpuTensor._wrap(s, st, prefix + ((plan, i),)))
            i += 1
    return res[0] if e.n_returns == 1 else tuple(res)


def _positional_views(e, plan, base, moving: bool):
    """``view``'s outputs of a base at runtime positions (chains stay ``PosChain``s; specs
    move with the base's offset unless the plan addresses storage: ``as_strided``)."""
    st, prefix = base._st, base._chain

    def spec(s):
        return _positions.moved(s, plan, base) if moving else s

    res = []
    i = 0
    for s, k in zip(plan.layout.fresh, plan.layout.kinds):
        if k == "TL":
            res.append([TpuTensor._wrap(spec(sp), st, extend(prefix, (plan, i + j)))
                        for j, sp in enumerate(s)])
            i += len(s)
        else:
            res.append(TpuTensor._wrap(spec(s), st, extend(prefix, (plan, i))))
            i += 1
    return res[0] if e.n_returns == 1 else tuple(res)


def _check_storage_bounds(base, args, kwargs) -> None:
    """PyTorch's ``setStorage`` check: the strided view must lie inside the storage."""
    size, stride = args[1], args[2]
    off = args[3] if len(args) > 3 else kwargs.get("storage_offset")
    off = base._spec[3] if off is None else off
    if not all(type(x) is int for x in (*size, *stride, off)) or 0 in size:
        return
    item = base.element_size()
    need = (storage_extent(size, stride) + off) * item
    have = _append.storage_numel(base) * storage_itemsize(base._st)
    if need > have:
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {off}, "
            f"and itemsize {item} requiring a storage size of {need} are out of bounds for "
            f"storage of size {have}")


def inplace_view(e, args, kwargs):
    """``t.squeeze_()`` and friends: ``t`` becomes the view the out-of-place op returns
    (same storage, new shape/strides), set on the very same Python object."""
    self = args[0]
    self._rebind(e.functional(*args, **kwargs))
    return self


def data_dependent(e, args, kwargs):
    """Ops whose output shape depends on values: a sync point, then run on concrete arrays."""

    def conc(a):
        if isinstance(a, TpuTensor):
            return _values.concrete(a)
        if isinstance(a, torch.Tensor):
            return _values.host_to_device(a)
        if type(a) is list:
            return [conc(x) for x in a]
        if type(a) is tuple:
            return tuple(conc(x) for x in a)
        return a

    cargs = conc(list(args))
    ckw = {k: conc(v) for k, v in kwargs.items()}
    with _X64(True):
        res = e.fn(*cargs, **ckw)
    COUNTERS["executions"] += 1

    def wrap(r):
        if isinstance(r, (list, tuple)):
            return type(r)(wrap(x) for x in r)
        if r is None:
            return None
        r = jnp.asarray(r)
        memory.track(r)
        return new_tensor(r)

    return wrap(res)


def composite(e, args, kwargs):
    COUNTERS["decompositions"] += 1
    return e.op.decompose(*args, **kwargs)


def decomposed(e, args, kwargs):
    COUNTERS["decompositions"] += 1
    return e.decomp(*args, **kwargs)


def mut_args(e, args, kwargs) -> list:
    return [arg(args, kwargs, name, pos) for name, pos, _ in e.mut]


def via_functional(e, args, kwargs):
    kw = {k: v for k, v in kwargs.items() if k not in e.out_names}
    res = e.functional(*args, **kw)
    muts = mut_args(e, args, kwargs)
    if len(muts) == 1:
        res = (res,)
    for m, r in zip(muts, res):
        if m is None:
            continue
        if isinstance(m, (list, tuple)):
            for a, b in zip(m, r):
                aten.copy_.default(a, b)
        else:
            if isinstance(r, torch.Tensor) and m.shape != r.shape:
                resize_output(m, tuple(r.shape), tuple(r.stride()))
            aten.copy_.default(m, r)
    if e.n_returns == 0:
        return None
    out = [muts[a] if a >= 0 else None for a in e.ret_alias]
    return out[0] if e.n_returns == 1 else tuple(out)


def resize_output(t: TpuTensor, shape: tuple, stride: tuple) -> None:
    """An out= tensor of another shape, resized as PyTorch's ``resize_output`` does (with
    its warning when the tensor had elements), restrided as the op's meta kernel says."""
    if tuple(t.shape) == shape:
        return
    if t.numel():
        warnings.warn(
            f"An output with one or more elements was resized since it had shape "
            f"{list(t.shape)}, which does not match the required output shape {list(shape)}. "
            f"This behavior is deprecated, and in a future PyTorch release outputs will not "
            f"be resized unless they have zero elements. You can explicitly reuse an out "
            f"tensor t by resizing it, inplace, to zero elements with t.resize_(0).",
            UserWarning, stacklevel=2)
    restride(t, shape, stride)


def restride(t: TpuTensor, shape: tuple, stride: tuple) -> None:
    """``t`` (the same Python object) becomes the tensor of ``shape``/``stride`` at its
    storage offset in its storage, read as C-contiguous (PyTorch's ``resize_``/
    ``as_strided_``): a view of the same storage when it fits, so every alias still sees
    its writes. A storage too small grows into a new one: the old elements first, then
    zeros (other aliases keep the old storage)."""
    st = t._st
    root_dtype = storage_dtype(st)
    if root_dtype != t.dtype:
        raise NotImplementedError(
            f"lazyrt: resizing a {t.dtype} view of a {root_dtype} storage is not supported")
    off = t._spec[3]
    numel = math.prod(shape)
    need = off + storage_extent(shape, stride) if numel else 0
    if t._chain is None and t._spec[1] != contiguous_strides(t._spec[0]) and t.dim() > 1:
        # a base in another layout: its storage order is its strides' order
        order = sorted(range(t.dim()), key=lambda d: -t._spec[1][d])
        flat = aten.reshape.default(aten.permute.default(t, order), [-1])
    else:
        root = _append.storage_root(t)
        flat = aten.view.default(root, [-1]) if root.dim() != 1 else root
    if need > flat.numel():
        flat = aten.constant_pad_nd.default(flat, [0, need - flat.numel()], 0)
    if tuple(stride) == contiguous_strides(shape):
        if off or numel != flat.numel():
            flat = aten.slice.Tensor(flat, 0, off, off + numel)
        new = aten.view.default(flat, list(shape))
    else:
        new = aten.as_strided.default(flat, list(shape), list(stride), off)
    t._rebind(new)


def missing(e, args, kwargs):
    if config.cpu_fallback:
        return _fallback.cpu_fallback(e, args, kwargs)
    raise NotImplementedError(
        f"lazyrt: the ATen op '{e.name}' has no lowering for the tpu device and no "
        f"decomposition. Set LAZYRT_CPU_FALLBACK=1 (or lazyrt.set_cpu_fallback(True)) to run it "
        f"on the CPU instead.")


_OUT_DTYPE = (re.compile(r"Expected out tensor to have dtype torch\.(\w+) but got torch\.(\w+) instead"),
              re.compile(r"Attempting to cast from torch\.(\w+) to out tensor with dtype torch\.(\w+), "))
_BOOL_OUT_ONLY = {"aten::isposinf", "aten::isneginf"}


def out_dtype_as_cpu(e, args, kwargs, ex: RuntimeError):
    """An out= op whose meta kernel (a Python ref) rejected the out tensor's dtype: PyTorch's
    CPU kernel takes any out dtype the result can be cast to (``abs(complex, out=complex)``)
    and words its refusals otherwise. CPU's rule and message, then the op, cast into ``out``.
    Any other error is re-raised."""
    m = next((r.search(str(ex)) for r in _OUT_DTYPE if r.search(str(ex))), None)
    if m is None or e.functional is None:
        raise ex
    name = e.op._schema.name
    res, out = getattr(torch, m.group(1)), getattr(torch, m.group(2))
    if name in _BOOL_OUT_ONLY:
        raise RuntimeError(f"{name[len('aten::'):]} does not support non-boolean outputs.") from None
    _dtypes.check_result_cast(res, out)
    return via_functional(e, args, kwargs)

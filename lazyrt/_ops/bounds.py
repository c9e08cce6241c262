"""Index bounds: PyTorch raises for an out-of-range index, XLA clamps or drops it.

Every indexing op with an index tensor (``x[idx]``, ``index_put_``, ``index_select``,
``gather``, ``take``, ``put_``, ``scatter*``, ``index_add/copy/fill/reduce``, ``embedding``,
``take_along_dim``, ``nll_loss``'s target) is checked, with PyTorch's own exception type
and message (``RULES``: what each op requires and how its CPU kernel words a failure):

* an index whose values are known on the host is checked at the op, raising there as
  on the CPU: a CPU tensor, or a tpu tensor whose storage still holds what a host
  transfer wrote (``note_transfer``: ``x[[1, 7]]`` builds its index so, and so does
  ``idx.to("tpu")``; its min and max are kept, and its values when small);
* an index that is a device value is checked on the device, in the same program as the
  op (``_checked_prog``: one extra tiny output, the first bad index per index tensor);
  the check is read as an asynchronous assert (``_exec.asserts``): at the next sync
  point in strict and defer, at once in debug mode, as CUDA reports a device-side assert.
  ``LAZYRT_INDEX_CHECKS=sync`` reads it at the op (a sync point per op, PyTorch's error
  at the op); ``off`` leaves device indices unchecked.

A check never forces a sync of its own in the default mode, and an index in range costs
one fused reduction over the index in the op's program.
"""
from __future__ import annotations

import hashlib
import typing
import weakref

import jax.numpy as jnp
import torch

from .. import lowering as _lowering
from .._base import source as _source
from .._base.config import config
from .._base.ir import Prog
from .._base.tensor import TpuTensor
from .._exec import asserts as _asserts
from .._exec.values import concrete, new_tensor, run
from .._exec.views import apply_chain
from .args import _ALLOW_CPU, arg
from .handlers import finish_mutating, functional, mutating
from .hostvals import UNKNOWN as _UNKNOWN
from .hostvals import host_values, note_constant, note_host_write, note_transfer  # noqa: F401
from .hostvals import on_host_value as _on_host
from .plan import plan_for
from .schema import functional_of

aten = torch.ops.aten
_INDEX_DTYPES = frozenset({torch.int64, torch.int32, torch.uint8, torch.bool})


class Check(typing.NamedTuple):
    """One index tensor of one op call: its values must lie in ``[-n, n)`` (``neg``) or
    ``[0, n)``, ``ignore`` excepted; a failure raises ``exc(fmt.format(v=, d=, n=))``."""

    index: torch.Tensor
    n: int
    neg: bool
    exc: type
    fmt: str
    dim: int = 0
    ignore: int | None = None

    def error(self, v: int) -> Exception:
        return self.exc(self.fmt.format(v=v, d=self.dim, n=self.n))


# ---- the rules, per op ---------------------------------------------------------------------

_AT = "index {v} is out of bounds for dimension {d} with size {n}"
_IN_SELF = "index out of range in self"
_TAKE = "out of range: tried to access index {v} on a tensor of {n} elements."


def _dim_of(self, dim) -> tuple[int, int]:
    """(canonical dim, its size); a 0-d tensor indexes as one of size 1."""
    nd = self.dim()
    if nd == 0:
        return 0, 1
    d = dim + nd if dim < 0 else dim
    return d, self.shape[d]


def _along(exc, fmt, neg=False, choose=None, index="index", ipos=2):
    """Ops ``op(self, dim, index, ...)``; ``choose(self, d)`` may pick (exc, fmt) by case."""

    def rule(args, kwargs):
        self, dim, idx = args[0], arg(args, kwargs, "dim", 1), arg(args, kwargs, index, ipos)
        if not isinstance(idx, torch.Tensor) or type(dim) is not int:
            return []
        d, n = _dim_of(self, dim)
        ex, f = choose(self, d) if choose is not None else (exc, fmt)
        return [Check(idx, n, neg, ex, f, d)]

    return rule


def _index_select_msg(self, d):
    # ATen's CPU kernel: the dim-1 path of a >1-d tensor words it so (torch 2.13)
    if self.dim() > 1 and d == 1:
        return RuntimeError, "INDICES element is out of DATA bounds, id={v} axis_dim={n}"
    return IndexError, _IN_SELF


def _index_add_msg(self, d):
    if self.dim() <= 1 or d not in (0, self.dim() - 1):
        return IndexError, _IN_SELF
    return RuntimeError, _AT


def _flat(exc, fmt):
    """``take(self, index)``, ``put(self, index, ...)``: into the flattened tensor."""

    def rule(args, kwargs):
        idx = arg(args, kwargs, "index", 1)
        return [Check(idx, args[0].numel(), True, exc, fmt)]

    return rule


def _embedding(args, kwargs):
    w, idx = args[0], arg(args, kwargs, "indices", 1)
    return [Check(idx, w.shape[0] if w.dim() else 1, False, IndexError, _IN_SELF)]


def _take_along_dim(args, kwargs):
    self, idx, dim = args[0], arg(args, kwargs, "indices", 1), arg(args, kwargs, "dim", 2)
    if dim is None:
        return [Check(idx, self.numel(), False, RuntimeError, _AT)]
    d, n = _dim_of(self, dim)
    return [Check(idx, n, False, RuntimeError, _AT, d)]


def _nll(class_dim):
    def rule(args, kwargs):
        self, target = args[0], arg(args, kwargs, "target", 1)
        ignore = arg(args, kwargs, "ignore_index", 4)
        c = self.shape[class_dim if self.dim() > 1 else 0] if self.dim() else 1
        return [Check(target, c, False, IndexError, "Target {v} is out of bounds.", 0, ignore)]

    return rule


def index_checks(self, indices) -> list:
    """``self[indices]`` (ATen's list of None / integer / bool tensors): the integer ones,
    each against the dim it indexes. A bool mask is checked here for its shape, integer
    indices for broadcasting together (PyTorch's ``IndexError``s); a mask's positions are
    in range by construction."""
    ints = [t for t in indices if t is not None]
    if any(t.dtype not in _INDEX_DTYPES for t in ints):
        raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
    if len(ints) > 1 and not any(t.dtype in (torch.bool, torch.uint8) for t in ints):
        try:
            torch.broadcast_shapes(*[t.shape for t in ints])
        except RuntimeError:
            shapes = ", ".join(str(list(t.shape)) for t in ints)
            raise IndexError(f"shape mismatch: indexing tensors could not be broadcast together "
                             f"with shapes {shapes}") from None
    checks = []
    d = 0
    for t in indices:
        if t is None:
            d += 1
            continue
        if t.dtype in (torch.bool, torch.uint8):
            for j in range(t.dim()):
                if d + j >= self.dim():
                    raise IndexError(f"too many indices for tensor of dimension {self.dim()}")
                if t.shape[j] != self.shape[d + j]:
                    raise IndexError(
                        f"The shape of the mask {list(t.shape)} at index {j} does not match the "
                        f"shape of the indexed tensor {list(self.shape)} at index {d + j}")
            d += t.dim()
            continue
        if d < self.dim() and t.numel():
            n = self.shape[d]
            # (ATen words an index into a dim of size 0 so)
            fmt = _AT if n else "index is out of bounds for dimension with size 0"
            checks.append(Check(t, n, True, IndexError, fmt, d))
        d += 1
    return checks


def values_shape_check(x, indices, values) -> None:
    """``x[indices] = values``: PyTorch's error when ``values`` does not broadcast to the
    indexing result (the meta kernel takes it; the lowering would fail on it)."""
    pos = [k for k, t in enumerate(indices) if t is not None]
    if not pos or len(indices) > x.dim():
        return  # (the meta kernel raises PyTorch's error)
    b = list(torch.broadcast_shapes(*[indices[k].shape for k in pos]))
    n = len(indices)
    before = [x.shape[k] for k in range(pos[0]) if indices[k] is None]
    after = [x.shape[k] for k in range(pos[0], n) if indices[k] is None]
    rest = list(x.shape[n:])
    if pos == list(range(pos[0], pos[-1] + 1)):  # adjacent: the result takes their place
        res = before + b + after + rest
    else:
        res = b + before + after + rest
    v = list(values.shape)  # (no leading 1s dropped: ATen's index_put_ drops none)
    if len(v) > len(res) or any(a not in (1, r) for a, r in zip(reversed(v), reversed(res))):
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(values.shape)} cannot be "
                           f"broadcast to indexing result of shape {res}")


_GATHER = _along(RuntimeError, _AT)
_INDEX_FILL = _along(IndexError, _AT, neg=True)


def _index_fill(args, kwargs):
    value = arg(args, kwargs, "value", 3)
    if (isinstance(value, complex) or (isinstance(value, torch.Tensor) and value.is_complex())) \
            and not args[0].is_complex():
        raise RuntimeError("index_fill_(): Converting complex Scalar to non-complex type is not "
                           "supported")
    return _INDEX_FILL(args, kwargs)


_INDEX_COPY = _along(IndexError, "index_copy_(): " + _AT)
_INDEX_ADD = _along(None, None, choose=_index_add_msg)


def _index_add(args, kwargs):
    """ATen's ``index_func_meta_impl`` shape check of ``index_add`` (its Python meta kernel
    lacks it): ``source`` has ``self``'s shape but along ``dim`` (all of it when either is
    0-d)."""
    self, dim, src = args[0], arg(args, kwargs, "dim", 1), arg(args, kwargs, "source", 3)
    idx = arg(args, kwargs, "index", 2)
    d = dim + self.dim() if type(dim) is int and dim < 0 else dim
    if isinstance(src, torch.Tensor) and isinstance(idx, torch.Tensor) and type(d) is int \
            and (src.dim() == 0 or 0 <= d < src.dim()) and idx.dim() <= 1 and src.dtype == self.dtype:
        if idx.numel() != (src.shape[d] if src.dim() else 1):
            raise RuntimeError(f"index_add_(): Number of indices ({idx.numel()}) should be equal to "
                               f"source.size(dim): ({src.shape[d]}), for dim: {d}")
        a, b = list(self.shape), list(src.shape)
        if self.dim() and src.dim() and d < len(a):
            del a[d], b[d]
        if a != b:
            raise RuntimeError(f"source tensor shape must match self tensor shape, excluding the "
                               f"specified dimension. Got self.shape = {list(self.shape)} "
                               f"source.shape = {list(src.shape)}")
    return _INDEX_ADD(args, kwargs)


def _index_copy(args, kwargs):
    """ATen's ``TORCH_CHECK_INDEX``es of ``index_copy`` (``IndexError``; the decomposition
    used as its meta kernel raises ``RuntimeError`` for them)."""
    self, dim = args[0], arg(args, kwargs, "dim", 1)
    idx, src = arg(args, kwargs, "index", 2), arg(args, kwargs, "source", 3)
    if isinstance(idx, torch.Tensor) and isinstance(src, torch.Tensor) and type(dim) is int:
        if idx.dim() > 1:
            raise IndexError(f"index_copy_(): Index should have dimension 1 or 0 (got {idx.dim()})")
        n = idx.numel()
        if src.dim() == 0 and n != 1:
            raise IndexError(f"index_copy_(): When source is scalar, index should have one "
                             f"element (got {n})")
        if src.dim() != self.dim() and src.dim() != 0 and self.dim() != 0:
            raise IndexError(f"index_copy_(): When source and destination are not scalars, their "
                             f"dimensionality must match. Source dimensionality ({src.dim()}), "
                             f"destination dimensionality ({self.dim()})")
        d = dim + max(self.dim(), 1) if dim < 0 else dim
        if idx.dtype != torch.int64 or self.dtype != src.dtype or not 0 <= d < max(self.dim(), 1):
            return _INDEX_COPY(args, kwargs)  # (the meta kernel's RuntimeError)
        sliced = [list(t.shape[:d] + t.shape[d + 1:]) if t.dim() else [] for t in (self, src)]
        if sliced[0] != sliced[1]:
            a, b = (" ".join(map(str, x)) for x in sliced)
            raise RuntimeError(f"index_copy_(): Source/destination tensor must have same slice "
                               f"shapes. Destination slice shape: {a} at dimension {d} and source "
                               f"slice shape: {b} at dimension 0.")
        if src.dim() and n != src.shape[d]:
            raise IndexError(f"index_copy_(): Number of indices ({n}) should be equal to "
                             f"source.size(dim) ({src.shape[d]})")
    return _INDEX_COPY(args, kwargs)


# functional op name -> rule(args, kwargs) -> [Check]; its in-place and out= overloads too
RULES = {
    "index_select": _along(None, None, choose=_index_select_msg),
    "gather": _GATHER,
    "scatter": _GATHER,
    "scatter_add": _GATHER,
    "scatter_reduce": _GATHER,
    "index_add": _index_add,
    "index_copy": _index_copy,
    "index_fill": _index_fill,
    "index_reduce": _along(IndexError, _IN_SELF),
    "take": _flat(IndexError, _TAKE),
    "put": _flat(IndexError, _TAKE),
    "embedding": _embedding,
    "take_along_dim": _take_along_dim,
    "nll_loss_forward": _nll(1),
    "nll_loss2d_forward": _nll(1),
}


# ---- checking ------------------------------------------------------------------------------


def on_host(e, checks: list) -> list:
    """Raise PyTorch's error for the first check that fails on the host; returns the checks
    left to the device."""
    left = []
    for c in checks:
        t = c.index
        if t.numel() == 0 or (type(t) is not TpuTensor and t.dim() and e.packet not in _ALLOW_CPU):
            continue  # (the argument walk raises PyTorch's error for the CPU tensor)
        v = _on_host(c)
        if v is _UNKNOWN:
            left.append(c)
        elif v is not None:
            raise c.error(v)
    return left


def _bad_row(i, n: int, neg: bool, ignore):
    """``[1, v]`` for the first value ``v`` of index ``i`` out of range, else ``[0, i[0]]``:
    one reduction (a min of positions) and one element read."""
    i = i.reshape(-1).astype(jnp.int64)
    bad = (i >= n) | (i < (-n if neg else 0))
    if ignore is not None:
        bad = bad & (i != ignore)
    size = i.shape[0]
    pos = jnp.min(jnp.where(bad, jnp.arange(size, dtype=jnp.int64), size))
    v = i[jnp.minimum(pos, size - 1)]
    return jnp.stack([(pos < size).astype(jnp.int64), v])


# plan -> {check signature: its Prog with the bounds output}
_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _checked_prog(plan, sig: tuple) -> Prog:
    """``plan``'s Prog with one more output: the ``(k, 2)`` rows of ``_bad_row`` for the
    index values at flat input positions ``sig`` (``(position, view chain, n, neg,
    ignore)`` each)."""
    progs = _CHECKED.get(plan)
    if progs is None:
        progs = _CHECKED[plan] = {}
    p = progs.get(sig)
    if p is None:
        base = plan.prog

        def fn(*flat):
            outs = base.fn(*flat)
            rows = [_bad_row(apply_chain(ch, flat[k]) if ch else flat[k], n, neg, ign)
                    for k, ch, n, neg, ign in sig]
            return (*outs, jnp.stack(rows))

        avals = base.out_avals + (((len(sig), 2), jnp.dtype(jnp.int64)),)
        p = Prog(base.name, fn, base.scalar_kinds, avals, desc=base.desc + " [bounds]",
                 op=base.op)
        p.sig = _checked_sig(base.sig, sig)
        progs[sig] = p
    return p


def _checked_sig(base: str | None, sig: tuple) -> str | None:
    """A checked program's ``Prog.sig``: its plan's, and each check's input position, the
    index's view steps (their plans' signatures, positions included: the check bakes them
    in), bound, sign rule and ignored value; None where a part has none."""
    if base is None:
        return None
    parts = [base]
    for k, ch, n, neg, ign in sig:
        steps = []
        for st in ch or ():
            if st[0].prog.sig is None:
                return None
            steps.append((st[0].prog.sig, st[1], tuple(st[2]) if len(st) == 3 else None))
        parts.append(repr((k, steps, n, neg, ign)))
    return hashlib.sha256(("bounds|" + "|".join(parts)).encode()).hexdigest()[:32]


def _position(vals: list, t: TpuTensor) -> int:
    v = t._st.value
    for k, x in enumerate(vals):
        if x is v:
            return k
    raise RuntimeError("lazyrt: internal error: an index tensor is not among the op's inputs")


def _judge(checks: list):
    def judge(rows):
        for c, (bad, v) in zip(checks, rows.reshape(-1, 2).tolist()):
            if bad:
                return c.error(int(v))
        return None

    return judge


def run_checked(e, args, kwargs, checks: list):
    """Run op ``e`` (as ``functional`` / ``mutating`` do), its index ``checks`` done on the
    host where they can be, the rest on the device in the op's own program."""
    dev = on_host(e, checks)
    if not dev or config.index_checks == "off":
        return (mutating if e.mut else functional)(e, args, kwargs)
    plan, vals, scal = plan_for(e, args, kwargs)
    sig = tuple((_position(vals, c.index), c.index._chain, c.n, c.neg, c.ignore) for c in dev)
    outs = run(_checked_prog(plan, sig), vals, scal)
    info = new_tensor(outs[-1])
    where = f"{e.name} at {_source.user_line(2)}"
    if config.mode == "debug" or config.index_checks == "sync":
        _asserts.check_now(concrete(info), _judge(dev), where)
    else:
        _asserts.add(info._st, _judge(dev), where)
    return _finish(e, plan, outs, args, kwargs)


def _finish(e, plan, outs, args, kwargs):
    """The op's results from its program's outputs (``handlers.functional`` and
    ``mutating``'s second half; the extra output at the end is ignored)."""
    if not e.mut:
        res, _ = plan.layout.wrap_fresh(outs, new_tensor)
        return res[0] if e.n_returns == 1 else tuple(res)
    return finish_mutating(e, plan, outs, args, kwargs)


def _handler(rule):
    def handler(e, args, kwargs):
        return run_checked(e, args, kwargs, rule(args, kwargs))

    return handler


def rule_for(op):
    """The rule of ATen overload ``op`` (any of its variants), or None; ``index.Tensor`` and
    ``index_put`` check their list of indices (``index_checks``)."""
    if op in _LIST_OPS:
        return _list_rule
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return None
    name = op._schema.name.split("::")[-1]
    return RULES.get(name) or RULES.get(name.rstrip("_"))


def _list_rule(args, kwargs):
    return index_checks(args[0], arg(args, kwargs, "indices", 1))


_LIST_OPS = frozenset({aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                       aten._index_put_impl_.default})


def special_handlers() -> dict:
    """``{overload: handler}`` for every overload (functional, in-place, out=) of the ops in
    ``RULES`` that runs by a lowering (its own or its functional op's)."""
    out = {}
    lows = _lowering.LOWERINGS
    for name, rule in RULES.items():
        h = _handler(rule)
        for packet_name in (name, name + "_"):
            packet = getattr(aten, packet_name, None)
            if packet is None:
                continue
            for ov in packet.overloads():
                op = getattr(packet, ov)
                low = lows.get(op)
                f = functional_of(op)
                flow = lows.get(f) if f is not None else None
                if (low is not None and not low.data_dependent) or (
                        flow is not None and not flow.data_dependent and flow.mutates is None):
                    out[op] = h
    return out

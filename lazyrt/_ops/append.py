"""Append buffers: a tensor grown piece by piece with ``torch.cat`` along one dim lives in
a bucketed buffer, so the programs that grow it and read its end do not change with its
length.

A generation loop grows its token ids (and position ids, the attention mask) by one
token a step, ``ids = torch.cat([ids, new], dim=-1)``, and reads their end
(``ids[:, -1:]``). With exact shapes every step's programs are new ones: one compile per
token. Here:

* the result of a 2-input ``cat`` of integer or bool tensors (floating ones with gradients
  off) is marked as grown along that dim (``mark``);
* appending to a marked tensor again makes the result a view ``buf[..., cap-m:]`` of a
  buffer whose capacity ``cap`` along the dim is a power of two (at least 64), holding
  the ``m`` elements right-aligned (``grown_view``). The next append builds the next buffer
  from ``buf[..., k:]`` and the new piece: its program depends on ``cap`` and ``k`` only.
  A full buffer moves to the next bucket (one program per bucket);
* a ``slice``/``select`` along that dim ending at the tensor's end (``ids[:, -1:]``,
  ``ids[:, -1]``) is taken from the buffer at a fixed distance from its end (``window``):
  one view program at every length;
* a dtype cast of a grown tensor casts its buffer (the result grows as it did), and
  padding it on the right to a fixed length (``F.pad(mask, (0, L - n))``, transformers'
  static-cache padding mask) is one program per ``L`` that takes the length ``n`` as a
  runtime scalar (``pad_right``);
* SDPA over keys and values grown along the sequence (a KV cache grown by ``torch.cat``,
  transformers' default dynamic cache) attends over the whole buffers with a mask of the
  last ``n`` positions, ``n`` again a runtime scalar (``sdpa_keys``): one program per
  capacity. The masked positions weigh exactly 0; the sums run over more terms, so the
  result can differ from the exact-length one in the last bits, as any two kernels do.

Each append makes a new buffer (``cat`` returns new storage), so an older tensor, or a
second append to it (beam search), never sees another's elements. A grown tensor looks as
a fresh ``cat`` result does (contiguous, storage offset 0), and ops that address storage
(``as_strided``, ``resize_``) see its own elements (``storage_root``); a window taken from
its end reports the buffer's strides and offset (the price of its fixed program). Every
other read derives the ``m`` elements as from any view. Floating tensors are buffered only
with gradients off (inference: a KV cache): a training step's tensors keep exact storage.

The rules are consulted by the handlers of the ops they bend, not through one entry point
here: ``handlers.view`` (``window``), ``handlers._check_storage_bounds`` and
``handlers.restride`` (``storage_numel``, ``storage_root``), ``special.to_copy`` (a cast),
``special.cat`` (the append), ``special.constant_pad_nd`` (``pad_right``) and
``special.sdpa_fused`` (``sdpa_keys``). One entry point would have to make the ops'
results (``handlers.functional``), and ``handlers`` imports this module: an import
circle. A dispatch on the op in front of them would add a lookup to the hot ``view`` path,
which its ``base._chain is not None and e.packet in _WINDOWS`` test now skips for every
plain tensor. So each call site tests cheaply whether its tensor can be a grown one and
keeps the op's own path otherwise; this module computes only what the rules decide.
"""
from __future__ import annotations

import collections
import math
import weakref
from typing import NamedTuple

import jax.numpy as jnp
import torch

from .._base.ir import Prog
from .._base.tensor import TpuTensor, contiguous_spec

MIN_CAPACITY = 64


class Grown(NamedTuple):
    dim: int  # the dim it grows along
    chain: tuple | None  # the view chain of the whole tensor in its buffer; None: exact
    spec: tuple | None = None  # the whole tensor's spec (contiguous), when buffered


# Storage -> Grown, for storages holding a tensor grown by appends.
_GROWN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def bucket(m: int) -> int:
    """The capacity of a buffer holding ``m`` elements along its grown dim."""
    return max(MIN_CAPACITY, 1 << (m - 1).bit_length())


def whole(t: TpuTensor) -> Grown | None:
    """How ``t`` grows, when it is the whole of a grown tensor (itself, or a detached
    alias), else None."""
    g = _GROWN.get(t._st)
    if g is None or t._chain is not g.chain:
        return None
    return g


def appendable(x, y, dim) -> int | None:
    """The (non-negative) dim when ``cat([x, y], dim)`` appends ``y`` to ``x`` and may be
    buffered, else None (``cat`` then runs as usual, with its own checks and errors)."""
    if type(x) is not TpuTensor or type(y) is not TpuTensor or type(dim) is not int:
        return None
    dt = x.dtype
    if y.dtype != dt or ((dt.is_floating_point or dt.is_complex) and torch.is_grad_enabled()):
        return None
    nd = x.dim()
    if nd == 0 or y.dim() != nd or not -nd <= dim < nd:
        return None
    d = dim % nd
    xs, ys = x.shape, y.shape
    if xs[d] == 0 or ys[d] == 0 or any(xs[i] != ys[i] for i in range(nd) if i != d):
        return None
    return d


def mark(t: TpuTensor, dim: int) -> TpuTensor:
    """``t`` (a fresh exact ``cat`` result) is a tensor grown along ``dim``."""
    _GROWN[t._st] = Grown(dim, None)
    return t


def root(t: TpuTensor) -> TpuTensor:
    """The base tensor of ``t``'s storage (its whole buffer)."""
    v = t._st.value
    return TpuTensor._wrap(contiguous_spec(v.shape, t.dtype), t._st)


def grown_view(buf: TpuTensor, dim: int, m: int) -> TpuTensor:
    """The grown tensor of ``m`` elements right-aligned in buffer ``buf`` along ``dim``,
    laid out as PyTorch lays out a fresh ``cat`` result (contiguous, offset 0)."""
    cap = buf.shape[dim]
    v = torch.ops.aten.slice.Tensor(buf, dim, cap - m, cap)
    spec = contiguous_spec(v.shape, v.dtype)
    _GROWN[buf._st] = Grown(dim, v._chain, spec)
    return TpuTensor._wrap(spec, buf._st, v._chain)


def _owner(t: TpuTensor) -> Grown | None:
    """The grown tensor whose storage ``t`` addresses: ``t`` is it or a view of it (its
    chain starts with the grown tensor's), not a window read from the buffer."""
    g = _GROWN.get(t._st)
    if g is not None and g.chain is not None and t._chain is not None \
            and t._chain[0] is g.chain[0]:
        return g
    return None


def storage_numel(t: TpuTensor) -> int:
    """Elements of the storage ``t`` addresses (``storage_root``'s, without making it)."""
    g = _owner(t)
    return math.prod(g.spec[0] if g is not None else t._st.value.shape)


def storage_root(t: TpuTensor) -> TpuTensor:
    """The tensor that reads ``t``'s storage as PyTorch would (C-contiguous, from offset
    0), for ops that address storage (``as_strided``, ``resize_``): for a grown tensor and
    its views, the grown tensor's own elements; for a window from its end (whose chain
    starts at the buffer), and anything else, the whole value."""
    g = _owner(t)
    return TpuTensor._wrap(g.spec, t._st, g.chain) if g is not None else root(t)


def window(packet: str, base: TpuTensor, args, kwargs):
    """``slice``/``select`` of a whole buffered tensor along its grown dim, ending at its
    end: the same op's arguments on the buffer (a fixed distance from the buffer's end),
    else None."""
    g = _GROWN.get(base._st)
    if g is None or g.chain is None or base._chain is not g.chain:
        return None
    nd = base.dim()
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    if type(dim) is not int or not -nd <= dim < nd or dim % nd != g.dim:
        return None
    n = base.shape[g.dim]
    cap = base._st.value.shape[g.dim]
    if packet == "select":
        i = args[2] if len(args) > 2 else kwargs.get("index")
        if type(i) is not int or not -n <= i < n:
            return None
        return (root(base), g.dim, cap - n + i % n), {}
    start = args[2] if len(args) > 2 else kwargs.get("start")
    end = args[3] if len(args) > 3 else kwargs.get("end")
    step = args[4] if len(args) > 4 else kwargs.get("step", 1)
    if step != 1 or any(v is not None and type(v) is not int for v in (start, end)):
        return None
    s = 0 if start is None else (start + n if start < 0 else start)
    if end is not None and (end + n if end < 0 else end) < n:
        return None
    s = min(max(s, 0), n)
    if s == n:
        return None
    return (root(base), g.dim, cap - (n - s), cap), {}


_PAD_PROGS: collections.OrderedDict = collections.OrderedDict()
_PAD_PROGS_MAX = 64


def pad_right(x: TpuTensor, pad, value):
    """``constant_pad_nd(x, pad, value)`` of a whole buffered ``x`` padded only at the end
    of its grown dim: ``(prog, n)``, the program ``(buffer, n) -> padded`` (the same for
    every ``n`` with the same padded length) and the runtime length; else None."""
    g = _GROWN.get(x._st)
    if g is None or g.chain is None or x._chain is not g.chain:
        return None
    nd = x.dim()
    at = 2 * (nd - 1 - g.dim) + 1  # where the grown dim's right pad is in ``pad``
    if len(pad) % 2 or len(pad) > 2 * nd or len(pad) <= at \
            or any(v != 0 for i, v in enumerate(pad) if i != at):
        return None
    right = pad[at]
    if type(right) is not int or right <= 0 or type(value) not in (int, float, bool):
        return None
    buf = x._st.value
    n = x.shape[g.dim]
    length = n + right
    key = (tuple(buf.shape), str(buf.dtype), g.dim, length, type(value), value)
    prog = _PAD_PROGS.get(key)
    if prog is None:
        prog = _pad_prog(tuple(buf.shape), buf.dtype, g.dim, length, value)
        _PAD_PROGS[key] = prog
        if len(_PAD_PROGS) > _PAD_PROGS_MAX:
            _PAD_PROGS.popitem(last=False)
    else:
        _PAD_PROGS.move_to_end(key)
    return prog, n


def _pad_prog(shape, dtype, dim, length, value) -> Prog:
    cap = shape[dim]

    def fn(buf, n):
        # element j of the result: the buffer's cap - n + j for j < n, else the value
        j = jnp.arange(length)
        src = jnp.clip(cap - n + j, 0, cap - 1)
        taken = jnp.take(buf, src, axis=dim)
        keep = (j < n).reshape([length if d == dim else 1 for d in range(len(shape))])
        return (jnp.where(keep, taken, jnp.asarray(value, dtype)),)

    out = (tuple(length if d == dim else s for d, s in enumerate(shape)), dtype)
    return Prog("pad_grown", fn, ("i",), (out,), desc=f"dim={dim}, length={length}, value={value}")


def sdpa_keys(key: TpuTensor, value: TpuTensor):
    """``(n, key buffer, value buffer)`` when ``key`` and ``value`` are whole buffered
    tensors grown along the sequence dim (2) with the same length and capacity (a KV cache
    grown by ``torch.cat`` in decoding), else None."""
    gk, gv = whole(key), whole(value)
    if gk is None or gv is None or gk.chain is None or gv.chain is None \
            or gk.dim != 2 or gv.dim != 2 or key.dim() != 4:
        return None
    n = key.shape[2]
    if value.shape[2] != n or key._st.value.shape[2] != value._st.value.shape[2]:
        return None
    return n, root(key), root(value)


_MASK_PROGS: dict = {}


def valid_mask_prog(cap: int) -> Prog:
    """``n -> mask``: True at the last ``n`` of ``cap`` positions (a buffer's elements),
    shaped ``(1, 1, 1, cap)`` for SDPA's ``attn_bias``."""
    p = _MASK_PROGS.get(cap)
    if p is None:
        def fn(n):
            return ((jnp.arange(cap) >= cap - n).reshape(1, 1, 1, cap),)

        p = _MASK_PROGS[cap] = Prog("grown_keys_mask", fn, ("i",), (((1, 1, 1, cap), jnp.bool_),),
                                    desc=f"cap={cap}")
    return p

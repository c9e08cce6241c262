"""View and shape ops. A view op's lowering computes the view's *value*; the
runtime keeps the aliasing (see ``lazyrt._base.tensor``), and writes through a view
with the inverse the runtime derives from this same lowering."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ._registry import aten, inverse, lower, prims
from ._util import canon_dim, jdt


def _norm_shape(size, numel):
    size = list(size)
    if -1 in size:
        i = size.index(-1)
        rest = 1
        for j, s in enumerate(size):
            if j != i:
                rest *= s
        size[i] = numel // rest if rest else 0
    return tuple(size)


@lower(aten.view.default, aten._unsafe_view.default, aten._reshape_alias.default,
       aten.reshape.default, aten.view_copy.default)
def view(self, size, *args):
    return jnp.reshape(self, _norm_shape(size, self.size))


@lower(aten.view.dtype)
def view_dtype(self, dtype):
    return _bitcast(self, jdt(dtype))


@inverse(aten.view.dtype)
def view_dtype_inverse(base, new):
    return _bitcast(new, base.dtype)


def _bitcast(self, jd):
    """Reinterpret the bytes as ``jd``; the last dim scales by the itemsize ratio.

    ``lax.bitcast_convert_type`` takes neither bool nor complex: a bool is its byte (uint8),
    read back as ``byte != 0``; a complex number is its (real, imag) pair of floats, the
    layout PyTorch and NumPy store."""
    jd = jnp.dtype(jd)
    if self.dtype == jd:
        return self
    if self.ndim == 0:  # (same itemsizes only: PyTorch checks that)
        return _bitcast(self.reshape(1), jd).reshape(())
    if self.dtype == jnp.bool_:
        return _bitcast(self.astype(jnp.uint8), jd)
    if jd == jnp.bool_:
        return _bitcast(self, jnp.dtype(jnp.uint8)) != 0
    if jnp.issubdtype(self.dtype, jnp.complexfloating):
        pairs = jnp.stack([jnp.real(self), jnp.imag(self)], axis=-1)
        return _bitcast(pairs.reshape(self.shape[:-1] + (self.shape[-1] * 2,)), jd)
    if jnp.issubdtype(jd, jnp.complexfloating):
        part = jnp.dtype(jnp.real(jnp.zeros((), jd)).dtype)
        flat = _bitcast(self, part)
        pairs = flat.reshape(flat.shape[:-1] + (flat.shape[-1] // 2, 2))
        return lax.complex(pairs[..., 0], pairs[..., 1])
    if jd.itemsize == self.dtype.itemsize:
        return lax.bitcast_convert_type(self, jd)
    src, dst = self.dtype.itemsize, jd.itemsize
    if dst < src:
        out = lax.bitcast_convert_type(self, jd)  # adds a trailing dim of src // dst
        return out.reshape(self.shape[:-1] + (self.shape[-1] * (src // dst),))
    r = dst // src
    x = self.reshape(self.shape[:-1] + (self.shape[-1] // r, r))
    return lax.bitcast_convert_type(x, jd)


@lower(aten.split_copy.Tensor)
def split_copy(self, split_size, dim=0):
    """``split``'s pieces as new tensors."""
    return split(self, split_size, dim)


@lower(aten._reshape_copy.default)
def reshape_copy(self, size):
    return jnp.reshape(self, _norm_shape(size, self.size))


@lower(aten.alias.default, aten.detach.default, aten.lift_fresh.default)
def alias(self):
    return self


@lower(aten.t.default)
def t(self):
    return self.T if self.ndim == 2 else self


@lower(aten.transpose.int)
def transpose(self, dim0, dim1):
    if self.ndim == 0:
        return self
    return jnp.swapaxes(self, dim0, dim1)


@lower(aten.permute.default)
def permute(self, dims):
    if self.ndim == 0:
        return self
    return jnp.transpose(self, [canon_dim(d, self.ndim) for d in dims])


@lower(aten.expand.default)
def expand(self, size, *, implicit=False):
    size = list(size)
    off = len(size) - self.ndim
    shape = tuple(self.shape[i - off] if s == -1 else s for i, s in enumerate(size))
    return jnp.broadcast_to(self, shape)


@lower(aten.unsqueeze.default)
def unsqueeze(self, dim):
    return jnp.expand_dims(self, canon_dim(dim, self.ndim + 1))


@lower(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def squeeze(self, dim=None):
    if self.ndim == 0:
        return self
    if dim is None:
        return jnp.squeeze(self)
    ds = [dim] if isinstance(dim, int) else list(dim)
    ds = tuple(canon_dim(d, self.ndim) for d in ds)
    ds = tuple(d for d in ds if self.shape[d] == 1)
    return jnp.squeeze(self, ds) if ds else self


@lower(aten.slice.Tensor)
def slice_(self, dim=0, start=None, end=None, step=1):
    """A traced ``start`` is a runtime position (``_ops.positions``): the host clamped it,
    and ``end`` carries the slice's static ``length``."""
    if self.ndim == 0:
        return self
    d = canon_dim(dim, self.ndim)
    if _traced(start):
        return slice_at(self, d, start, end.length, step)
    s, e = slice_bounds(start, end, self.shape[d])
    idx = [slice(None)] * self.ndim
    idx[d] = slice(s, e, step)
    return self[tuple(idx)]


def slice_bounds(start, end, n: int) -> tuple[int, int]:
    """ATen's slice bounds: ``start``/``end`` (None: the ends) made non-negative and
    clamped into ``[0, n]``, ``end`` at least ``start``."""
    s = 0 if start is None else start
    e = n if end is None else end
    if s < 0:
        s += n
    if e < 0:
        e += n
    s = min(max(s, 0), n)
    return s, min(max(e, s), n)


def _traced(v) -> bool:
    return v is not None and not isinstance(v, int)


def _span(length: int, step: int) -> int:
    return (length - 1) * step + 1 if length else 0


def slice_at(self, d: int, start, length: int, step: int):
    """``length`` elements every ``step`` along ``d`` from the runtime ``start`` (in range:
    ``lax.dynamic_slice`` would clamp it, so the host checks)."""
    x = lax.dynamic_slice_in_dim(self, start, _span(length, step), axis=d)
    return lax.slice_in_dim(x, 0, x.shape[d], step, axis=d) if step != 1 else x


def slice_at_inverse(base, new, d: int, start, length: int, step: int):
    """``base`` with ``new`` written at ``slice_at(base, d, start, length, step)``."""
    new = new.astype(base.dtype)
    if step == 1:
        return lax.dynamic_update_slice_in_dim(base, new, start, axis=d)
    idx = start + jnp.arange(length) * step
    x = jnp.moveaxis(base, d, 0).at[idx].set(jnp.moveaxis(new, d, 0))
    return jnp.moveaxis(x, 0, d)


@lower(aten.select.int)
def select(self, dim, index):
    """A traced ``index`` is a runtime position (``_ops.positions``)."""
    d = canon_dim(dim, self.ndim)
    n = self.shape[d]
    if _traced(index):
        index = jnp.where(index < 0, index + n, index)
        return lax.dynamic_index_in_dim(self, index, d, keepdims=False)
    if index < 0:
        index += n
    return lax.index_in_dim(self, index, d, keepdims=False)


def select_inverse(base, new, d: int, index):
    """``base`` with ``new`` written at ``select(base, d, index)`` (``index`` runtime)."""
    return lax.dynamic_update_index_in_dim(base, new.astype(base.dtype), index, d)


@lower(aten.diagonal.default)
def diagonal(self, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(self, offset, canon_dim(dim1, self.ndim), canon_dim(dim2, self.ndim))


@lower(aten.as_strided.default)
def as_strided(self, size, stride, storage_offset=None):
    off = storage_offset or 0
    flat = self.reshape(-1)
    idx = jnp.full(tuple(size), off, dtype=jnp.int64 if flat.size >= 2**31 else jnp.int32)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        idx = idx + (jnp.arange(n, dtype=idx.dtype) * s).reshape(shape)
    if flat.size == 0:
        return jnp.zeros(tuple(size), self.dtype)
    return flat[idx]


@lower(aten.unfold.default)
def unfold(self, dimension, size, step):
    if self.ndim == 0:
        return self.reshape(1)
    d = canon_dim(dimension, self.ndim)
    n = (self.shape[d] - size) // step + 1
    starts = jnp.arange(n) * step
    idx = starts[:, None] + jnp.arange(size)[None, :]  # [n, size]
    x = jnp.moveaxis(self, d, -1)
    out = x[..., idx]  # [..., n, size]
    return jnp.moveaxis(out, -2, d)


@lower(aten.split.Tensor)
def split(self, split_size, dim=0):
    d = canon_dim(dim, self.ndim)
    n = self.shape[d]
    if split_size == 0:
        return [self]
    bounds = list(range(0, n, split_size)) or [0]
    return [lax.slice_in_dim(self, b, min(b + split_size, n), axis=d) for b in bounds]


@lower(aten.split_with_sizes.default)
def split_with_sizes(self, split_sizes, dim=0):
    d = canon_dim(dim, self.ndim)
    out, b = [], 0
    for s in split_sizes:
        out.append(lax.slice_in_dim(self, b, b + s, axis=d))
        b += s
    return out


@lower(aten.unbind.int)
def unbind(self, dim=0):
    d = canon_dim(dim, self.ndim)
    return [lax.index_in_dim(self, i, d, keepdims=False) for i in range(self.shape[d])]


@lower(aten.chunk.default)
def chunk(self, chunks, dim=0):
    d = canon_dim(dim, self.ndim)
    n = self.shape[d]
    size = -(-n // chunks) if n else 0
    return split(self, size, d) if size else [self]


@lower(aten.view_as_real.default)
def view_as_real(self):
    return jnp.stack([jnp.real(self), jnp.imag(self)], axis=-1)


@lower(aten.view_as_complex.default)
def view_as_complex(self):
    if self.dtype == jnp.float16:  # complex32's parts (held as complex64: dtypes.WIDENED)
        self = self.astype(jnp.float32)
    return lax.complex(self[..., 0], self[..., 1])


@lower(prims.broadcast_in_dim.default)
def broadcast_in_dim(a, shape, broadcast_dimensions):
    return lax.broadcast_in_dim(a, tuple(shape), tuple(broadcast_dimensions))


@lower(aten.real.default, prims.real.default)
def real(self):
    return jnp.real(self)


@lower(aten.imag.default, prims.imag.default)
def imag(self):
    return jnp.imag(self)


@lower(aten._conj.default, prims.conj.default)
def _conj(self):
    # NOTE: PyTorch's lazy conjugate bit does not exist here: the view holds the value.
    return jnp.conj(self)


@lower(aten._neg_view.default)
def _neg_view(self):
    return -self


# ---- inverses: writing through a view (see _registry.INVERSES) --------------------------


@inverse(aten.alias, aten.detach, aten.lift_fresh)
def alias_inverse(base, new):
    return new.astype(base.dtype)


@inverse(aten.view.default, aten._unsafe_view, aten._reshape_alias, aten.reshape, aten.squeeze,
         aten.unsqueeze, aten.flatten, aten.unflatten, aten.view_as)
def reshape_inverse(base, new):
    return new.reshape(base.shape).astype(base.dtype)


@inverse(aten.real, prims.real)
def real_inverse(base, new):
    return lax.complex(new.astype(jnp.real(base).dtype), jnp.imag(base))


@inverse(aten.imag, prims.imag)
def imag_inverse(base, new):
    return lax.complex(jnp.real(base), new.astype(jnp.imag(base).dtype))


@inverse(aten.view_as_real)
def view_as_real_inverse(base, new):
    part = jnp.real(base).dtype  # complex32's float16 parts into its complex64 value
    return lax.complex(new[..., 0].astype(part), new[..., 1].astype(part)).astype(base.dtype)


@inverse(aten.view_as_complex)
def view_as_complex_inverse(base, new):
    return jnp.stack([jnp.real(new), jnp.imag(new)], axis=-1).astype(base.dtype)


@inverse(aten._conj, prims.conj)
def conj_inverse(base, new):
    return jnp.conj(new).astype(base.dtype)


@inverse(aten._neg_view)
def neg_view_inverse(base, new):
    return (-new).astype(base.dtype)


# ---- shape ops that copy ---------------------------------------------------------------------


@lower(aten.cat.default)
def cat(tensors, dim=0):
    ts = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not ts:
        return tensors[0]
    d = canon_dim(dim, ts[0].ndim)
    dt = jnp.result_type(*ts)
    return jnp.concatenate([t.astype(dt) for t in ts], axis=d)


@lower(aten.stack.default)
def stack(tensors, dim=0):
    return jnp.stack(tensors, axis=canon_dim(dim, tensors[0].ndim + 1))


@lower(aten.flip.default)
def flip(self, dims):
    if self.ndim == 0:
        return self
    return jnp.flip(self, [canon_dim(d, self.ndim) for d in dims])


@lower(aten.roll.default)
def roll(self, shifts, dims=()):
    """``shifts`` may be runtime positions (``_ops.positions``): ``jnp.roll`` takes them."""
    if not dims:
        return jnp.roll(self.reshape(-1), shifts[0]).reshape(self.shape)
    return jnp.roll(self, tuple(shifts), tuple(canon_dim(d, self.ndim) for d in dims))


@lower(aten.repeat.default)
def repeat(self, repeats):
    x = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
    return jnp.tile(x, repeats)


@lower(aten.tril.default)
def tril(self, diagonal=0):
    return jnp.tril(self, diagonal)


@lower(aten.triu.default)
def triu(self, diagonal=0):
    return jnp.triu(self, diagonal)


@lower(aten.constant_pad_nd.default)
def constant_pad_nd(self, pad, value=0):
    n = len(pad) // 2
    cfg = [(0, 0, 0)] * (self.ndim - n)
    for i in range(n):
        lo, hi = pad[2 * (n - 1 - i)], pad[2 * (n - 1 - i) + 1]
        cfg.append((lo, hi, 0))
    return lax.pad(self, jnp.asarray(value, self.dtype), cfg)


@lower(aten.as_strided_scatter.default)
def as_strided_scatter(self, src, size, stride, storage_offset=None):
    off = storage_offset or 0
    flat = self.reshape(-1)
    idx = jnp.full(tuple(size), off, dtype=jnp.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        idx = idx + (jnp.arange(n, dtype=jnp.int64) * s).reshape(shape)
    if idx.size == 0:
        return self
    return flat.at[idx.reshape(-1)].set(src.reshape(-1).astype(self.dtype)).reshape(self.shape)


@lower(aten.diagonal_scatter.default)
def diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
    d1, d2 = canon_dim(dim1, self.ndim), canon_dim(dim2, self.ndim)
    x = jnp.moveaxis(self, (d1, d2), (-2, -1))
    n1, n2 = x.shape[-2:]
    r0, c0 = max(-offset, 0), max(offset, 0)
    L = max(min(n1 - r0, n2 - c0), 0)
    if L == 0:
        return self
    i = jnp.arange(L)
    x = x.at[..., i + r0, i + c0].set(src.astype(self.dtype))
    return jnp.moveaxis(x, (-2, -1), (d1, d2))

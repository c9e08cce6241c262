"""Indexing, gather/scatter and the data-dependent ops (nonzero, masked_select,
unique), which run at a sync point on concrete values."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ._registry import aten, lower
from ._util import canon_dim


def _index_tuple(self, indices):
    """ATen advanced indexing: a list of (None | int64 tensor) per leading dim."""
    idx = []
    for i, t in enumerate(indices):
        if t is None:
            idx.append(slice(None))
        else:
            n = self.shape[i]
            t = t.astype(jnp.int64)
            idx.append(jnp.where(t < 0, t + n, t))
    return tuple(idx)


@lower(aten.index.Tensor)
def index(self, indices):
    return self[_index_tuple(self, indices)]


@lower(aten.index_put.default)
def index_put(self, indices, values, accumulate=False):
    idx = _index_tuple(self, indices)
    values = values.astype(self.dtype)
    if accumulate:
        if self.dtype == jnp.bool_:  # bool addition is a logical or
            return self.at[idx].max(values)
        return self.at[idx].add(values)
    return self.at[idx].set(values)


@lower(aten._unsafe_index.Tensor)
def _unsafe_index(self, indices):
    # Clamped explicitly: a decomposition may index one past the end (upsample_linear1d with
    # a scale larger than its sizes imply); JAX's gather clamps that but the scatter of its
    # vjp would drop it, so the derived backward would lose that gradient.
    idx = tuple(i if isinstance(i, slice) else jnp.clip(i, 0, max(self.shape[d] - 1, 0))
                for d, i in enumerate(_index_tuple(self, indices)))
    return self[idx]


@lower(aten._unsafe_index_put.default)
def _unsafe_index_put(self, indices, values, accumulate=False):
    return index_put(self, indices, values, accumulate)


@lower(aten.index_select.default)
def index_select(self, dim, index):
    if self.ndim == 0:
        return self.reshape(1)[index.reshape(-1).astype(jnp.int64)].reshape(())
    return jnp.take(self, index.astype(jnp.int64), axis=canon_dim(dim, self.ndim))


@lower(aten.gather.default)
def gather(self, dim, index, *, sparse_grad=False):
    if self.ndim == 0:
        return self.reshape(index.shape) if index.size else jnp.zeros(index.shape, self.dtype)
    if index.size == 0:  # PyTorch accepts any rank for an empty index
        return jnp.zeros(index.shape, self.dtype)
    d = canon_dim(dim, self.ndim)
    # index may be smaller than self in the other dims (scatter's backward gathers so)
    self = self[tuple(slice(None) if a == d else slice(0, n) for a, n in enumerate(index.shape))]
    return jnp.take_along_axis(self, index.astype(jnp.int64), axis=d, mode="clip")


def _scatter_index(self, dim, index):
    d = canon_dim(dim, self.ndim)
    grids = jnp.meshgrid(*[jnp.arange(s) for s in index.shape], indexing="ij")
    grids[d] = index.astype(jnp.int64)
    return tuple(grids)


@lower(aten.scatter.src, aten.scatter.value)
def scatter(self, dim, index, src):
    if self.ndim == 0:
        return jnp.asarray(src, self.dtype).reshape(()) if index.size else self
    idx = _scatter_index(self, dim, index)
    if hasattr(src, "shape") and src.ndim:
        src = src[tuple(slice(0, s) for s in index.shape)]
    return self.at[idx].set(jnp.asarray(src).astype(self.dtype))


@lower(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce_legacy(self, dim, index, src, *, reduce):
    if self.ndim == 0:
        src = src.reshape(-1) if hasattr(src, "shape") else src
        return scatter_reduce_legacy(self.reshape(1), 0, index.reshape(-1), src,
                                     reduce=reduce).reshape(())
    idx = _scatter_index(self, dim, index)
    if hasattr(src, "shape") and src.ndim:
        src = src[tuple(slice(0, s) for s in index.shape)]
    src = jnp.asarray(src).astype(self.dtype)
    if reduce == "add":
        return self.at[idx].add(src)
    if reduce == "multiply":
        return self.at[idx].multiply(src)
    raise RuntimeError(f"reduce argument must be either add or multiply, got {reduce}")


@lower(aten.scatter_add.default)
def scatter_add(self, dim, index, src):
    if index.size == 0:
        return self
    if self.ndim == 0:
        return self + (src.reshape(()) if index.size else 0)
    idx = _scatter_index(self, dim, index)
    src = src[tuple(slice(0, s) for s in index.shape)]
    return self.at[idx].add(src.astype(self.dtype))


def _reduce_into(self, idx, src, reduce, include_self, name):
    """``self`` with ``src`` reduced into the positions ``idx`` (scatter_reduce and
    index_reduce semantics: ``include_self=False`` ignores the old value where touched)."""
    touched = jnp.zeros(self.shape, jnp.bool_).at[idx].set(True)
    flt = jnp.issubdtype(self.dtype, jnp.inexact)
    if reduce == "sum":
        base = self if include_self else jnp.where(touched, 0, self)
        return base.at[idx].add(src)
    if reduce == "prod":
        base = self if include_self else jnp.where(touched, 1, self)
        return base.at[idx].multiply(src)
    if reduce in ("amax", "amin"):
        if flt:
            fill = -jnp.inf if reduce == "amax" else jnp.inf
        else:
            info = jnp.iinfo(self.dtype)
            fill = info.min if reduce == "amax" else info.max
        base = self if include_self else jnp.where(touched, fill, self)
        return base.at[idx].max(src) if reduce == "amax" else base.at[idx].min(src)
    if reduce == "mean":
        base = self if include_self else jnp.where(touched, 0, self)
        s = base.at[idx].add(src)
        cnt = jnp.full(self.shape, 1 if include_self else 0, jnp.int64).at[idx].add(1)
        cnt = jnp.maximum(cnt, 1)
        return s / cnt if flt else jnp.floor_divide(s, cnt)
    raise RuntimeError(f"{name}(): reduce argument must be one of sum, prod, mean, amax or "
                       f"amin, got {reduce}")


@lower(aten.scatter_reduce.two)
def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
    if self.ndim == 0:
        self = self.reshape(1)
        index = index.reshape(-1)
        src = src.reshape(-1)
        return scatter_reduce(self, 0, index, src, reduce, include_self=include_self).reshape(())
    idx = _scatter_index(self, dim, index)
    src = src[tuple(slice(0, s) for s in index.shape)].astype(self.dtype)
    return _reduce_into(self, idx, src, reduce, include_self, "scatter_reduce")


def _along_dim(self, dim, index, source):
    """The positions of ``index`` along ``dim`` of ``self`` and ``source`` shaped to them (a
    0-d index is one position; a 0-d or 1-element source fills it, as ATen takes them)."""
    d = canon_dim(dim, self.ndim)
    index = index.reshape(-1).astype(jnp.int64)
    idx = [slice(None)] * self.ndim
    idx[d] = index
    shape = self.shape[:d] + (index.shape[0],) + self.shape[d + 1:]
    if hasattr(source, "shape") and source.shape != shape:
        source = source.reshape(shape)
    return tuple(idx), source


@lower(aten.index_add.default)
def index_add(self, dim, index, source, *, alpha=1):
    if self.ndim == 0:
        return self + alpha * source.reshape(())
    idx, source = _along_dim(self, dim, index, source)
    return self.at[idx].add((alpha * source).astype(self.dtype))


@lower(aten.index_copy.default)
def index_copy(self, dim, index, source):
    if self.ndim == 0:
        return source.reshape(())
    idx, source = _along_dim(self, dim, index, source)
    return self.at[idx].set(source.astype(self.dtype))


@lower(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(self, dim, index, value):
    if self.ndim == 0:
        return jnp.asarray(value, self.dtype).reshape(())
    d = canon_dim(dim, self.ndim)
    idx = [slice(None)] * self.ndim
    idx[d] = index.astype(jnp.int64)
    return self.at[tuple(idx)].set(jnp.asarray(value).astype(self.dtype))


@lower(aten.masked_scatter.default)
def masked_scatter(self, mask, source):
    shape = jnp.broadcast_shapes(self.shape, mask.shape)  # either one may broadcast
    self = jnp.broadcast_to(self, shape)
    mask = jnp.broadcast_to(mask, shape)
    if source.size == 0:  # nothing to scatter (a True in mask would be an error on the CPU)
        return self
    pos = jnp.cumsum(mask.reshape(-1)) - 1
    src = source.reshape(-1)
    vals = src[jnp.clip(pos, 0, max(src.size - 1, 0))].reshape(self.shape)
    return jnp.where(mask, vals.astype(self.dtype), self)


@lower(aten.take.default)
def take(self, index):
    flat = self.reshape(-1)
    i = index.astype(jnp.int64)
    return flat[jnp.where(i < 0, i + flat.size, i)]


@lower(aten.take_along_dim.default)
def take_along_dim(self, indices, dim=None):
    if dim is None:
        return take(self, indices.reshape(-1))
    return jnp.take_along_axis(self, indices.astype(jnp.int64), axis=canon_dim(dim, self.ndim))


@lower(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices.astype(jnp.int64), axis=0)


@lower(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    idx = indices.reshape(-1).astype(jnp.int64)
    g = grad_output.reshape(idx.shape[0], -1)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[idx].add(1)
        g = g / counts[idx][:, None]
    if padding_idx >= 0:
        g = jnp.where((idx == padding_idx)[:, None], 0, g)
    out = jnp.zeros((num_weights, g.shape[1]), g.dtype).at[idx].add(g)
    return out


@lower(aten.searchsorted.Tensor)
def searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    side = side or ("right" if right else "left")
    seq = sorted_sequence
    if self.size == 0 or seq.shape[-1] == 0:  # nothing to search, or nothing to search in
        return jnp.zeros(self.shape, jnp.int64)
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter.astype(jnp.int64), axis=-1)
    if seq.ndim == 1:
        return jnp.searchsorted(seq, self, side=side)
    flat_seq = seq.reshape(-1, seq.shape[-1])
    flat_v = self.reshape(flat_seq.shape[0], -1)
    out = jnp.stack([jnp.searchsorted(s, v, side=side) for s, v in zip(flat_seq, flat_v)]) \
        if flat_seq.shape[0] <= 64 else None
    if out is None:
        import jax

        out = jax.vmap(lambda s, v: jnp.searchsorted(s, v, side=side))(flat_seq, flat_v)
    return out.reshape(self.shape)


@lower(aten.searchsorted.Scalar)
def searchsorted_scalar(sorted_sequence, self, *, out_int32=False, right=False, side=None,
                        sorter=None):
    return searchsorted(sorted_sequence, jnp.asarray(self), out_int32=out_int32, right=right,
                        side=side, sorter=sorter)


@lower(aten.bucketize.Tensor)
def bucketize(self, boundaries, *, out_int32=False, right=False):
    return jnp.searchsorted(boundaries, self, side="right" if right else "left")


# ---- data-dependent shapes: run on concrete values at a sync point ----------------------------


@lower(aten.nonzero.default, data_dependent=True)
def nonzero(self):
    a = np.asarray(self)
    if a.ndim == 0:  # PyTorch: shape (1, 0) if the scalar is nonzero, else (0, 0)
        return jnp.zeros((int(a != 0), 0), jnp.int64)
    return jnp.asarray(np.stack(np.nonzero(a), axis=-1).astype(np.int64).reshape(-1, a.ndim))


@lower(aten.masked_select.default, data_dependent=True)
def masked_select(self, mask):
    a, m = np.broadcast_arrays(np.asarray(self), np.asarray(mask))
    return jnp.asarray(a[m])


def _unique_np(a, sorted_, return_inverse, return_counts, dim=None):
    a = np.asarray(a)
    if dim is None:
        vals, inv, cnt = np.unique(a.reshape(-1), return_inverse=True, return_counts=True)
        inv = inv.reshape(a.shape)
    else:
        vals, inv, cnt = np.unique(a, return_inverse=True, return_counts=True, axis=dim)
        inv = inv.reshape(-1)
    return (jnp.asarray(vals), jnp.asarray(inv.astype(np.int64)), jnp.asarray(cnt.astype(np.int64)))


@lower(aten._unique2.default, data_dependent=True)
def _unique2(self, sorted=True, return_inverse=False, return_counts=False):
    v, i, c = _unique_np(self, sorted, return_inverse, return_counts)
    if not return_inverse:
        i = jnp.zeros((0,), jnp.int64)
    if not return_counts:
        c = jnp.zeros((0,), jnp.int64)
    return v, i, c


@lower(aten._unique.default, data_dependent=True)
def _unique(self, sorted=True, return_inverse=False):
    v, i, _ = _unique_np(self, sorted, return_inverse, False)
    return v, (i if return_inverse else jnp.zeros((0,), jnp.int64))


@lower(aten.unique_dim.default, data_dependent=True)
def unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):
    v, i, c = _unique_np(self, sorted, return_inverse, return_counts, dim=canon_dim(dim, self.ndim))
    return v, i, c


@lower(aten.unique_consecutive.default, data_dependent=True)
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    a = np.asarray(self)
    if dim is None:
        flat = a.reshape(-1)
        if flat.size == 0:
            return (jnp.asarray(flat), jnp.zeros(a.shape, jnp.int64), jnp.zeros((0,), jnp.int64))
        change = np.concatenate([[True], flat[1:] != flat[:-1]])
        vals = flat[change]
        inv = (np.cumsum(change) - 1).reshape(a.shape)
        cnt = np.diff(np.append(np.nonzero(change)[0], flat.size))
        return jnp.asarray(vals), jnp.asarray(inv.astype(np.int64)), jnp.asarray(cnt.astype(np.int64))
    d = canon_dim(dim, a.ndim)
    if a.shape[d] == 0:
        return jnp.asarray(a), jnp.zeros((0,), jnp.int64), jnp.zeros((0,), jnp.int64)
    if a.size == 0:
        raise RuntimeError("There are 0 sized dimensions, and they aren't selected, so unique "
                           "cannot be applied")
    m = np.moveaxis(a, d, 0).reshape(a.shape[d], -1)
    change = np.concatenate([[True], np.any(m[1:] != m[:-1], axis=1)])
    vals = np.moveaxis(np.moveaxis(a, d, 0)[change], 0, d)
    inv = np.cumsum(change) - 1
    cnt = np.diff(np.append(np.nonzero(change)[0], m.shape[0]))
    return jnp.asarray(vals), jnp.asarray(inv.astype(np.int64)), jnp.asarray(cnt.astype(np.int64))


@lower(aten.embedding_renorm.default)
def embedding_renorm(self, indices, max_norm, norm_type):
    """Rescale the rows of ``self`` that ``indices`` reference (each once) to norm <= max_norm."""
    used = jnp.zeros((self.shape[0],), jnp.bool_).at[indices.reshape(-1).astype(jnp.int64)].set(True)
    a = jnp.abs(self.astype(jnp.float32) if self.dtype in (jnp.bfloat16, jnp.float16) else self)
    p = jnp.where(norm_type == 0, 1.0, norm_type).astype(a.dtype)
    norm = jnp.where(norm_type == 0, jnp.sum((a != 0).astype(a.dtype), -1),
                     jnp.where(jnp.isinf(norm_type), jnp.max(a, -1, initial=0),
                               jnp.sum(a ** p, -1) ** (1 / p)))
    scale = jnp.where(used & (norm > max_norm), max_norm / (norm + 1e-7), 1.0)
    return (self * scale[:, None].astype(self.dtype)).astype(self.dtype)


@lower(aten.index_reduce.default)
def index_reduce(self, dim, index, source, reduce, *, include_self=True):
    if self.ndim == 0:
        return index_reduce(self.reshape(1), 0, index.reshape(-1), source.reshape(-1), reduce,
                            include_self=include_self).reshape(())
    d = canon_dim(dim, self.ndim)
    idx = (slice(None),) * d + (index.astype(jnp.int64),)
    if reduce == "sum":  # not one of index_reduce's reductions
        raise RuntimeError(f"index_reduce(): Expected reduce to be one of prod, mean, amax or "
                           f"amin, got {reduce}.")
    return _reduce_into(self, idx, source.astype(self.dtype), reduce, include_self, "index_reduce")


@lower(aten.put.default)
def put(self, index, source, accumulate=False):
    flat = self.reshape(-1)
    i = index.reshape(-1).astype(jnp.int64)
    i = jnp.where(i < 0, i + flat.size, i)
    src = source.reshape(-1).astype(self.dtype)
    out = flat.at[i].add(src) if accumulate else flat.at[i].set(src)
    return out.reshape(self.shape)


@lower(aten.nonzero_static.default)
def nonzero_static(self, *, size, fill_value=-1):
    if self.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    if self.size == 0:
        return jnp.full((size, self.ndim), fill_value, jnp.int64)
    nz = jnp.nonzero(self, size=size, fill_value=fill_value)
    return jnp.stack([a.astype(jnp.int64) for a in nz], axis=-1)


@lower(aten.segment_reduce.default)
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False,
                   initial=None):
    import jax

    ax = canon_dim(axis, data.ndim)
    if lengths is None:
        lengths = offsets[..., 1:] - offsets[..., :-1]
    lengths = lengths.astype(jnp.int64)
    lead = data.shape[:ax]
    nseg = lengths.shape[-1]
    n = data.shape[ax]
    rest = data.shape[ax + 1:]
    x = data.reshape((-1, n) + rest)
    lens = jnp.broadcast_to(lengths, lead + (nseg,)).reshape(-1, nseg)
    flt = jnp.issubdtype(data.dtype, jnp.inexact)
    if initial is not None:
        init = initial
    elif reduce == "max":
        init = -jnp.inf if flt else jnp.iinfo(data.dtype).min
    elif reduce == "min":
        init = jnp.inf if flt else jnp.iinfo(data.dtype).max
    elif reduce == "prod":
        init = 1
    else:
        init = 0

    def one(xb, lb):
        ends = jnp.cumsum(lb)
        seg = jnp.searchsorted(ends, jnp.arange(n), side="right")
        base = jnp.full((nseg,) + rest, init, xb.dtype)
        if reduce in ("sum", "mean"):
            out = base.at[seg].add(xb, mode="drop")
        elif reduce == "prod":
            out = base.at[seg].multiply(xb, mode="drop")
        elif reduce == "max":
            out = base.at[seg].max(xb, mode="drop")
            nan = jnp.zeros((nseg,) + rest, jnp.bool_).at[seg].max(jnp.isnan(xb), mode="drop") \
                if flt else None
            out = jnp.where(nan, jnp.nan, out) if flt else out
        elif reduce == "min":
            out = base.at[seg].min(xb, mode="drop")
            nan = jnp.zeros((nseg,) + rest, jnp.bool_).at[seg].max(jnp.isnan(xb), mode="drop") \
                if flt else None
            out = jnp.where(nan, jnp.nan, out) if flt else out
        else:
            raise RuntimeError(f"unsupported reduction {reduce}")
        if reduce == "mean":
            lr = lb.reshape((nseg,) + (1,) * len(rest))
            empty = jnp.nan if initial is None else init
            out = jnp.where(lr > 0, out / jnp.maximum(lr, 1).astype(out.dtype), empty)
        return out

    out = jax.vmap(one)(x, lens)
    return out.reshape(lead + (nseg,) + rest)


@lower(aten.bincount.default, data_dependent=True)
def bincount(self, weights=None, minlength=0):
    """Counts (int64) or weight sums of each value 0..max (the output length is the input's
    max + 1): float32 weights sum in float32 in input order (np.add.at, as ATen's loop),
    others in float64."""
    a = np.asarray(self)
    if a.ndim != 1 or (a.size and a.min() < 0):
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    a = a.astype(np.int64)
    n = max(int(a.max()) + 1 if a.size else 0, minlength)
    if weights is None:
        return jnp.asarray(np.bincount(a, minlength=n).astype(np.int64))
    w = np.asarray(weights)
    if w.shape != a.shape:
        raise RuntimeError("weights should be 1-d and have the same length as input")
    dt = np.float32 if w.dtype == np.float32 else np.float64
    out = np.zeros((n,), dt)
    np.add.at(out, a, w.astype(dt))
    return jnp.asarray(out)


@lower(aten.repeat_interleave.Tensor, data_dependent=True)
def repeat_interleave_tensor(repeats, *, output_size=None):
    """Index i repeated repeats[i] times (the output length is the repeats' sum)."""
    r = np.asarray(repeats).reshape(-1).astype(np.int64)
    if (r < 0).any():
        raise RuntimeError("repeats can not be negative")
    out = np.repeat(np.arange(r.size, dtype=np.int64), r)
    if output_size is not None and output_size != out.size:
        raise RuntimeError("allocated size does not match required size")
    return jnp.asarray(out)

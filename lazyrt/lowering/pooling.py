"""Adaptive max pooling (values and flat spatial indices, PyTorch's window rule
``[floor(i*n/o), ceil((i+1)*n/o))``) and its backward."""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from ._registry import aten, lower


def _adaptive_windows(n, o):
    """Static [o, K] index table and validity mask of the adaptive windows of one dim."""
    starts = [(i * n) // o for i in range(o)]
    ends = [-(-((i + 1) * n) // o) for i in range(o)]
    k = max([e - s for s, e in zip(starts, ends)] + [1])
    idx = np.array([[min(s + j, n - 1) for j in range(k)] for s in starts], np.int64).reshape(o, k)
    valid = np.array([[s + j < e for j in range(k)] for s, e in zip(starts, ends)]).reshape(o, k)
    return idx, valid


def _adaptive_max(x, output_size):
    nd = len(output_size)
    lead = x.shape[:x.ndim - nd]
    spatial = x.shape[x.ndim - nd:]
    if x.size == 0 or math.prod(output_size) == 0:
        shape = lead + tuple(output_size)
        return jnp.zeros(shape, x.dtype), jnp.zeros(shape, jnp.int64)
    tables = [_adaptive_windows(n, o) for n, o in zip(spatial, output_size)]
    # broadcast index arrays of shape (o0, K0, o1, K1, ...)
    idxs, valid, flat = [], np.ones((), bool), np.zeros((), np.int64)
    strides = [math.prod(spatial[d + 1:]) for d in range(nd)]
    for d, (idx, val) in enumerate(tables):
        shape = [1] * (2 * nd)
        shape[2 * d], shape[2 * d + 1] = idx.shape
        idxs.append(idx.reshape(shape))
        valid = valid & val.reshape(shape)
        flat = flat + idx.reshape(shape) * strides[d]
    g = x[(Ellipsis,) + tuple(jnp.asarray(i) for i in idxs)]  # lead + (o0,K0,o1,K1,...)
    neg = -jnp.inf if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.iinfo(x.dtype).min
    g = jnp.where(jnp.asarray(valid), g, jnp.asarray(neg, x.dtype))
    nl = len(lead)
    perm = list(range(nl)) + [nl + 2 * d for d in range(nd)] + [nl + 2 * d + 1 for d in range(nd)]
    g = jnp.transpose(g, perm).reshape(lead + tuple(output_size) + (-1,))
    fl = np.transpose(np.broadcast_to(flat, valid.shape),
                      [2 * d for d in range(nd)] + [2 * d + 1 for d in range(nd)])
    fl = fl.reshape(tuple(output_size) + (-1,))
    am = jnp.argmax(g, axis=-1)
    vals = jnp.take_along_axis(g, am[..., None], axis=-1)[..., 0]
    inds = jnp.take_along_axis(jnp.broadcast_to(jnp.asarray(fl), g.shape), am[..., None], -1)[..., 0]
    return vals, inds.astype(jnp.int64)


@lower(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(self, output_size):
    return _adaptive_max(self, tuple(output_size))


@lower(aten.adaptive_max_pool3d.default)
def adaptive_max_pool3d(self, output_size):
    return _adaptive_max(self, tuple(output_size))


def _adaptive_max_backward(grad_output, self, indices, nd):
    spatial = self.shape[self.ndim - nd:]
    lead = self.shape[:self.ndim - nd]
    n = math.prod(spatial)
    g = grad_output.reshape(lead + (-1,))
    i = indices.reshape(lead + (-1,)).astype(jnp.int64)
    out = jnp.zeros(lead + (n,), grad_output.dtype)
    lead_idx = tuple(jnp.arange(s).reshape((-1,) + (1,) * (len(lead) - k))
                     for k, s in enumerate(lead))
    out = out.at[lead_idx + (i,)].add(g)
    return out.reshape(self.shape)


@lower(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(grad_output, self, indices):
    return _adaptive_max_backward(grad_output, self, indices, 2)


@lower(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(grad_output, self, indices):
    return _adaptive_max_backward(grad_output, self, indices, 3)

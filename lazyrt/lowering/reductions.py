"""Reductions, scans, sorting and top-k."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ._registry import aten, lower
from ._util import canon_dim, jdt, opmath
from ._util import dims as _dims


def dims(dim, ndim):
    """Reduction axes; a 0-dim tensor accepts dim 0 / -1 and reduces over nothing."""
    if ndim == 0:
        return ()
    return _dims(dim, ndim)


def _acc(x, dtype=None):
    if dtype is not None:
        return x.astype(jdt(dtype))
    if x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.integer):
        return x.astype(jnp.int64)
    return opmath(x)


@lower(aten.sum.default)
def sum_all(self, *, dtype=None):
    return jnp.sum(_acc(self, dtype))


@lower(aten.sum.dim_IntList)
def sum_dim(self, dim, keepdim=False, *, dtype=None):
    return jnp.sum(_acc(self, dtype), axis=dims(dim, self.ndim), keepdims=keepdim)


@lower(aten.prod.default)
def prod_all(self, *, dtype=None):
    return jnp.prod(_acc(self, dtype))


@lower(aten.prod.dim_int)
def prod_dim(self, dim, keepdim=False, *, dtype=None):
    return jnp.prod(_acc(self, dtype), axis=dims(dim, self.ndim), keepdims=keepdim)


@lower(aten.mean.default)
def mean_all(self, *, dtype=None):
    return jnp.mean(_acc(self, dtype))


@lower(aten.mean.dim)
def mean_dim(self, dim, keepdim=False, *, dtype=None):
    return jnp.mean(_acc(self, dtype), axis=dims(dim, self.ndim), keepdims=keepdim)


def _correction(correction, unbiased=None):
    if correction is None:
        return 1 if unbiased is None or unbiased else 0
    return correction


@lower(aten.var.correction)
def var(self, dim=None, *, correction=None, keepdim=False):
    x = opmath(self)
    ax = dims(dim, self.ndim)
    n = 1
    for a in ax:
        n *= self.shape[a]
    c = _correction(correction)
    m = jnp.mean(x, axis=ax, keepdims=True)
    d = x - m
    s = jnp.sum(jnp.real(d * jnp.conj(d)), axis=ax, keepdims=keepdim)
    return s / jnp.maximum(n - c, 0)


@lower(aten.std.correction)
def std(self, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(var(self, dim, correction=correction, keepdim=keepdim))


@lower(aten.var_mean.correction)
def var_mean(self, dim=None, *, correction=None, keepdim=False):
    x = opmath(self)
    return (var(self, dim, correction=correction, keepdim=keepdim),
            jnp.mean(x, axis=dims(dim, self.ndim), keepdims=keepdim))


@lower(aten.std_mean.correction)
def std_mean(self, dim=None, *, correction=None, keepdim=False):
    v, m = var_mean(self, dim, correction=correction, keepdim=keepdim)
    return jnp.sqrt(v), m


@lower(aten.amax.default)
def amax(self, dim=(), keepdim=False):
    if self.ndim == 0:
        return self
    return jnp.max(self, axis=dims(dim, self.ndim), keepdims=keepdim)


@lower(aten.amin.default)
def amin(self, dim=(), keepdim=False):
    if self.ndim == 0:
        return self
    return jnp.min(self, axis=dims(dim, self.ndim), keepdims=keepdim)


@lower(aten.max.default)
def max_all(self):
    return jnp.max(self)


@lower(aten.min.default)
def min_all(self):
    return jnp.min(self)


def _arg_first(x, axis, largest):
    # NOTE: PyTorch returns the first index of the extreme value and treats NaN as
    # the extreme; jnp.argmax already returns the first NaN / first max.
    return jnp.argmax(x, axis=axis) if largest else jnp.argmin(x, axis=axis)


@lower(aten.max.dim)
def max_dim(self, dim, keepdim=False):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    d = canon_dim(dim, self.ndim)
    return (jnp.max(self, axis=d, keepdims=keepdim),
            jnp.expand_dims(_arg_first(self, d, True), d) if keepdim else _arg_first(self, d, True))


@lower(aten.min.dim)
def min_dim(self, dim, keepdim=False):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    d = canon_dim(dim, self.ndim)
    return (jnp.min(self, axis=d, keepdims=keepdim),
            jnp.expand_dims(_arg_first(self, d, False), d) if keepdim else _arg_first(self, d, False))


@lower(aten.argmax.default)
def argmax(self, dim=None, keepdim=False):
    if dim is None:
        r = jnp.argmax(self.reshape(-1))
        return r.reshape((1,) * self.ndim) if keepdim else r
    if self.ndim == 0:
        return jnp.zeros((), jnp.int64)
    return jnp.argmax(self, axis=canon_dim(dim, self.ndim), keepdims=keepdim)


@lower(aten.argmin.default)
def argmin(self, dim=None, keepdim=False):
    if dim is None:
        r = jnp.argmin(self.reshape(-1))
        return r.reshape((1,) * self.ndim) if keepdim else r
    if self.ndim == 0:
        return jnp.zeros((), jnp.int64)
    return jnp.argmin(self, axis=canon_dim(dim, self.ndim), keepdims=keepdim)


@lower(aten.any.default)
def any_all(self):
    return jnp.any(self != 0)


@lower(aten.any.dim, aten.any.dims)
def any_dim(self, dim=None, keepdim=False):
    return jnp.any(self != 0, axis=dims(dim, self.ndim), keepdims=keepdim)


@lower(aten.all.default)
def all_all(self):
    return jnp.all(self != 0)


@lower(aten.all.dim, aten.all.dims)
def all_dim(self, dim=None, keepdim=False):
    return jnp.all(self != 0, axis=dims(dim, self.ndim), keepdims=keepdim)


@lower(aten.logsumexp.default)
def logsumexp(self, dim, keepdim=False):
    x = self if jnp.issubdtype(self.dtype, jnp.inexact) else self.astype(jnp.float32)
    x = opmath(x)
    ax = dims(dim, self.ndim)
    m = jnp.max(x, axis=ax, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0)
    out = jnp.log(jnp.sum(jnp.exp(x - m), axis=ax, keepdims=True)) + m
    return out if keepdim else jnp.squeeze(out, ax)


@lower(aten.cumsum.default)
def cumsum(self, dim, *, dtype=None):
    if self.ndim == 0:
        return _acc(self, dtype)
    return jnp.cumsum(_acc(self, dtype), axis=canon_dim(dim, self.ndim))


@lower(aten.cumprod.default)
def cumprod(self, dim, *, dtype=None):
    if self.ndim == 0:
        return _acc(self, dtype)
    return jnp.cumprod(_acc(self, dtype), axis=canon_dim(dim, self.ndim))


def _cum_ext(self, dim, op):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    d = canon_dim(dim, self.ndim)
    n = self.shape[d]
    idx = jnp.broadcast_to(jnp.arange(n).reshape([-1 if i == d else 1 for i in range(self.ndim)]),
                           self.shape)

    def comb(a, b):
        va, ia = a
        vb, ib = b
        if jnp.issubdtype(va.dtype, jnp.inexact):
            take_b = op(vb, va) | (vb == va) | jnp.isnan(vb)
            take_b = take_b & ~(jnp.isnan(va) & ~jnp.isnan(vb))
        else:
            take_b = op(vb, va) | (vb == va)
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    v, i = lax.associative_scan(comb, (self, idx), axis=d)
    return v, i


@lower(aten.cummax.default)
def cummax(self, dim):
    return _cum_ext(self, dim, jnp.greater)


@lower(aten.cummin.default)
def cummin(self, dim):
    return _cum_ext(self, dim, jnp.less)


@lower(aten.logcumsumexp.default)
def logcumsumexp(self, dim):
    if self.ndim == 0:
        return self
    return lax.cumlogsumexp(opmath(self), axis=canon_dim(dim, self.ndim))


@lower(aten.sort.default)
def sort(self, dim=-1, descending=False):
    return sort_stable(self, stable=False, dim=dim, descending=descending)


@lower(aten.sort.stable)
def sort_stable(self, *, stable=False, dim=-1, descending=False):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    d = canon_dim(dim, self.ndim)
    idx = jnp.argsort(self, axis=d, stable=True, descending=descending)
    return jnp.take_along_axis(self, idx, axis=d), idx


@lower(aten.argsort.default)
def argsort(self, dim=-1, descending=False):
    return sort_stable(self, dim=dim, descending=descending)[1]


@lower(aten.argsort.stable)
def argsort_stable(self, *, stable, dim=-1, descending=False):
    return sort_stable(self, stable=stable, dim=dim, descending=descending)[1]


@lower(aten.topk.default)
def topk(self, k, dim=-1, largest=True, sorted=True):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    d = canon_dim(dim, self.ndim)
    x = jnp.moveaxis(self, d, -1)
    if largest:
        v, i = lax.top_k(x, k)
    else:
        v, i = lax.top_k(-x, k)
        v = -v
    return jnp.moveaxis(v, -1, d), jnp.moveaxis(i, -1, d)


@lower(aten.kthvalue.default)
def kthvalue(self, k, dim=-1, keepdim=False):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    d = canon_dim(dim, self.ndim)
    v, i = sort_stable(self, dim=d)
    v = lax.index_in_dim(v, k - 1, d, keepdims=keepdim)
    i = lax.index_in_dim(i, k - 1, d, keepdims=keepdim)
    return v, i


@lower(aten.median.default)
def median_all(self):
    x = jnp.sort(self.reshape(-1))
    return x[(x.size - 1) // 2]


@lower(aten.median.dim)
def median_dim(self, dim, keepdim=False):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    d = canon_dim(dim, self.ndim)
    return kthvalue(self, (self.shape[d] + 1) // 2, d, keepdim)


@lower(aten.nansum.default)
def nansum(self, dim=None, keepdim=False, *, dtype=None):
    return jnp.nansum(_acc(self, dtype), axis=dims(dim, self.ndim), keepdims=keepdim)


@lower(aten.count_nonzero.dim_IntList)
def count_nonzero(self, dim):
    return jnp.sum(self != 0, axis=dims(dim, self.ndim))


@lower(aten.count_nonzero.default)
def count_nonzero_one(self, dim=None):
    return jnp.sum(self != 0, axis=dims(dim, self.ndim))


@lower(aten.linalg_vector_norm.default)
def vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None):
    x = jnp.abs(_acc(self, dtype))
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(jnp.float32)
    ax = dims(dim, self.ndim)
    red = dict(axis=ax, keepdims=keepdim)
    if isinstance(ord, (int, bool)):  # a static ord: one reduction
        if ord == 0:
            return jnp.sum((x != 0).astype(x.dtype), **red)
        if ord == 1:
            return jnp.sum(x, **red)
        if ord == 2:
            return jnp.sqrt(jnp.sum(x * x, **red))
        return jnp.sum(x ** ord, **red) ** (1.0 / ord)
    # A float ord is a runtime value: compute each case and select.
    ord = jnp.asarray(ord, x.dtype)
    safe = jnp.where(jnp.isinf(ord) | (ord == 0), 1.0, ord).astype(x.dtype)
    general = jnp.sum(x ** safe, **red) ** (1.0 / safe)
    out = jnp.where(ord == 0, jnp.sum((x != 0).astype(x.dtype), **red), general)
    if x.size:
        out = jnp.where(ord == jnp.inf, jnp.max(x, **red), out)
        out = jnp.where(ord == -jnp.inf, jnp.min(x, **red), out)
    return out


@lower(aten.norm.Scalar, aten.norm.ScalarOpt_dim, aten.norm.ScalarOpt_dtype, aten.norm.ScalarOpt_dim_dtype)
def norm(self, p=2, dim=None, keepdim=False, *, dtype=None):
    return vector_norm(self, 2 if p is None else p, dim, keepdim, dtype=dtype)


@lower(aten.aminmax.default)
def aminmax(self, *, dim=None, keepdim=False):
    ax = dims(dim, self.ndim)
    if dim is None and keepdim:
        ax = None  # aminmax(dim=None, keepdim=True) keeps every dim as size 1
    return jnp.min(self, axis=ax, keepdims=keepdim), jnp.max(self, axis=ax, keepdims=keepdim)


@lower(aten.softmax.int, aten._softmax.default)
def softmax(self, dim, half_to_float=False, **_):
    x = opmath(self)
    return jax.nn.softmax(x, axis=canon_dim(dim, self.ndim)) if self.ndim else jnp.ones_like(x)


@lower(aten.log_softmax.int, aten._log_softmax.default)
def log_softmax(self, dim, half_to_float=False, **_):
    x = opmath(self)
    return jax.nn.log_softmax(x, axis=canon_dim(dim, self.ndim)) if self.ndim else jnp.zeros_like(x)


@lower(aten._softmax_backward_data.default)
def softmax_backward(grad_output, output, dim, input_dtype):
    g, y = opmath(grad_output), opmath(output)
    d = canon_dim(dim, y.ndim)
    return y * (g - jnp.sum(g * y, axis=d, keepdims=True))


@lower(aten._log_softmax_backward_data.default)
def log_softmax_backward(grad_output, output, dim, input_dtype):
    g, y = opmath(grad_output), opmath(output)
    d = canon_dim(dim, y.ndim)
    return g - jnp.exp(y) * jnp.sum(g, axis=d, keepdims=True)

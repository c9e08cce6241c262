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


# NOTE: ``_is_all_true``/``_is_any_true`` (bool inputs only, PyTorch's own check) are what
# ``torch._check_tensor_all`` and torch.distributions' argument checks call.
@lower(aten.any.default, aten._is_any_true.default)
def any_all(self):
    return jnp.any(self != 0)


@lower(aten.any.dim, aten.any.dims)
def any_dim(self, dim=None, keepdim=False):
    return jnp.any(self != 0, axis=dims(dim, self.ndim), keepdims=keepdim)


@lower(aten.all.default, aten._is_all_true.default)
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
    # complex: shift by the largest real part (as ATen)
    m = jnp.max(jnp.real(x), axis=ax, keepdims=True)
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
    if jnp.iscomplexobj(self):
        return lax.associative_scan(_log_add_exp_complex, self, axis=canon_dim(dim, self.ndim))
    return lax.cumlogsumexp(opmath(self), axis=canon_dim(dim, self.ndim))


def _log_add_exp_complex(x, y):
    """log(exp(x) + exp(y)) for complex x, y as ATen's ``_log_add_exp_helper``: shift by the
    operand with the larger real part; nan if either is nan; both real parts -inf: the
    smaller operand."""
    xr, yr = jnp.real(x), jnp.real(y)
    x_small = xr <= yr
    mn = jnp.where(x_small, x, y)
    mx = jnp.where(x_small, y, x)
    mnr, mxr = jnp.real(mn), jnp.real(mx)
    out = jnp.log1p(jnp.exp(mn - mx)) + mx
    both_inf = ~jnp.isfinite(mnr) & (mnr == mxr)
    out = jnp.where(both_inf & (mnr < 0), mn, out)
    nan = jnp.isnan(x) | jnp.isnan(y)
    return jnp.where(nan, jnp.asarray(jnp.nan + 1j * jnp.nan, x.dtype), out)


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
    red = {"axis": ax, "keepdims": keepdim}
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
    d = canon_dim(dim, y.ndim) if y.ndim else None  # 0-d: the one element
    return y * (g - jnp.sum(g * y, axis=d, keepdims=True))


@lower(aten._log_softmax_backward_data.default)
def log_softmax_backward(grad_output, output, dim, input_dtype):
    g, y = opmath(grad_output), opmath(output)
    d = canon_dim(dim, y.ndim) if y.ndim else None  # 0-d: the one element
    return g - jnp.exp(y) * jnp.sum(g, axis=d, keepdims=True)


# ---- median / mode -----------------------------------------------------------------------------


def _sorted_last(self, d):
    """Stable ascending sort along d (NaN last), moved to the last axis: (values, indices)."""
    x = jnp.moveaxis(self, d, -1)
    idx = jnp.argsort(x, axis=-1, stable=True)
    return jnp.take_along_axis(x, idx, axis=-1), idx


def _pick_sorted(s, idx, k, d, keepdim):
    """(value, index) at position ``k`` (shape [..., 1]) of ``_sorted_last``'s output,
    moved back to dim ``d``."""
    v = jnp.moveaxis(jnp.take_along_axis(s, k, axis=-1), -1, d)
    i = jnp.moveaxis(jnp.take_along_axis(idx, k, axis=-1), -1, d)
    if not keepdim:
        v, i = jnp.squeeze(v, d), jnp.squeeze(i, d)
    return v, i


@lower(aten.nanmedian.default)
def nanmedian_all(self):
    x = self.reshape(-1)
    if x.size == 0:
        return jnp.array(jnp.nan, self.dtype)
    s = jnp.sort(x)
    c = jnp.sum(~jnp.isnan(x)) if jnp.issubdtype(x.dtype, jnp.inexact) else x.size
    k = jnp.where(c == 0, (x.size - 1) // 2, (c - 1) // 2)
    return s[k]


@lower(aten.nanmedian.dim)
def nanmedian_dim(self, dim, keepdim=False):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    d = canon_dim(dim, self.ndim)
    s, idx = _sorted_last(self, d)
    n = s.shape[-1]
    if jnp.issubdtype(s.dtype, jnp.inexact):
        c = jnp.sum(~jnp.isnan(s), axis=-1, keepdims=True)
        k = jnp.where(c == 0, (n - 1) // 2, (c - 1) // 2)
    else:
        k = jnp.full(s.shape[:-1] + (1,), (n - 1) // 2)
    return _pick_sorted(s, idx, k, d, keepdim)


@lower(aten.mode.default)
def mode(self, dim=-1, keepdim=False):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    d = canon_dim(dim, self.ndim)
    s, idx = _sorted_last(self, d)
    n = s.shape[-1]
    if n == 0:
        shape = s.shape[:-1] + (1,) if keepdim else s.shape[:-1]
        return jnp.zeros(shape, self.dtype), jnp.zeros(shape, jnp.int64)
    pos = jnp.arange(n)
    new_run = jnp.concatenate([jnp.ones(s.shape[:-1] + (1,), bool), s[..., 1:] != s[..., :-1]], axis=-1)
    start = lax.cummax(jnp.where(new_run, pos, 0), axis=s.ndim - 1)
    length = pos - start + 1
    # The end of the first longest run: the smallest of the most frequent values; stable
    # sorting makes its last element the value's last occurrence, as ATen returns.
    best = jnp.argmax(length, axis=-1, keepdims=True)
    return _pick_sorted(s, idx, best, d, keepdim)


# ---- histograms --------------------------------------------------------------------------------
# ATen's histogramdd kernel: LINEAR (histc), LINEAR with a local search against the edges
# (histogram/histogramdd with bin counts), BINARY search (explicit edge tensors). An
# element outside [first edge, last edge] (or NaN) is skipped; the last bin is closed.


def _linspace_edges(lo, hi, bins, dt):
    lo = jnp.asarray(lo, dt)
    hi = jnp.asarray(hi, dt)
    steps = bins + 1
    i = jnp.arange(steps, dtype=dt)
    step = (hi - lo) / bins
    half = steps // 2
    return jnp.where(jnp.arange(steps) < half, lo + step * i, hi - step * (steps - 1 - i))


def _bin_pos(x, edges, algorithm):
    nb = edges.shape[0]  # number of edges
    if algorithm == "binary":
        pos = jnp.searchsorted(edges, x, side="right") - 1
    else:
        lo, hi = edges[0], edges[-1]
        pos = ((x - lo) * (nb - 1) / (hi - lo))
        pos = jnp.where(jnp.isfinite(pos), pos, 0).astype(jnp.int64)
        if algorithm == "local":
            pmin = jnp.maximum(pos - 1, 0)
            pmax = jnp.minimum(pos + 2, nb)
            cnt = jnp.zeros_like(pos)
            for j in range(3):
                e = pmin + j
                cnt = cnt + ((e < pmax) & (edges[jnp.clip(e, 0, nb - 1)] <= x)).astype(pos.dtype)
            pos = pmin + cnt - 1
    pos = jnp.where(pos == nb - 1, pos - 1, pos)
    valid = (x >= edges[0]) & (x <= edges[-1])
    return jnp.clip(pos, 0, nb - 2), valid


def _histdd(x, edges, algorithm, weight=None, density=False):
    """x: (N, D); edges: D edge arrays -> hist of shape (len(e) - 1 for e in edges)."""
    shape = tuple(e.shape[0] - 1 for e in edges)
    flat = jnp.zeros(x.shape[0], jnp.int64)
    valid = jnp.ones(x.shape[0], bool)
    for dd, e in enumerate(edges):
        p, v = _bin_pos(x[:, dd], e, algorithm)
        flat = flat * shape[dd] + p
        valid = valid & v
    w = jnp.ones(x.shape[0], x.dtype) if weight is None else weight.reshape(-1).astype(x.dtype)
    total = 1
    for s_ in shape:
        total *= s_
    hist = jnp.zeros(total, x.dtype).at[flat].add(jnp.where(valid, w, 0)).reshape(shape)
    if density:
        hist = hist / jnp.sum(hist)
        for dd, e in enumerate(edges):
            widths = e[1:] - e[:-1]
            hist = hist / widths.reshape([-1 if k == dd else 1 for k in range(len(edges))])
    return hist


def _outer_edges(x, rng, dt):
    """select_outer_bin_edges: (lo, hi) per column of x (N, D)."""
    D = x.shape[1]
    if rng is not None:
        lo = jnp.asarray([rng[2 * k] for k in range(D)], dt)
        hi = jnp.asarray([rng[2 * k + 1] for k in range(D)], dt)
    elif x.shape[0] > 0:
        lo, hi = jnp.min(x, axis=0), jnp.max(x, axis=0)
    else:  # ATen: an empty input without a range bins [0, 1]
        return jnp.zeros((D,), dt), jnp.ones((D,), dt)
    same = lo == hi
    return jnp.where(same, lo - 0.5, lo), jnp.where(same, hi + 0.5, hi)


@lower(aten.histc.default)
def histc(self, bins=100, min=0, max=0):
    dt = self.dtype if jnp.issubdtype(self.dtype, jnp.inexact) else jnp.float32
    x = self.reshape(-1).astype(dt)
    lo = jnp.asarray(min, jnp.float64 if dt == jnp.float64 else jnp.float32)
    hi = jnp.asarray(max, lo.dtype)
    if x.size:
        use_data = lo == hi
        lo = jnp.where(use_data, jnp.min(x).astype(lo.dtype), lo)
        hi = jnp.where(use_data, jnp.max(x).astype(hi.dtype), hi)
    same = lo == hi
    lo, hi = jnp.where(same, lo - 1, lo), jnp.where(same, hi + 1, hi)
    edges = _linspace_edges(lo, hi, bins, dt)
    return _histdd(x[:, None], [edges], "linear")


@lower(aten.histogram.bin_ct)
def histogram_bin_ct(self, bins=100, *, range=None, weight=None, density=False):
    x = self.reshape(-1, 1)
    lo, hi = _outer_edges(x, range, x.dtype)
    edges = _linspace_edges(lo[0], hi[0], bins, x.dtype)
    return _histdd(x, [edges], "local", weight, density), edges


@lower(aten.histogram.bins_tensor)
def histogram_bins_tensor(self, bins, *, weight=None, density=False):
    x = self.reshape(-1, 1)
    edges = bins.astype(x.dtype)
    return _histdd(x, [edges], "binary", weight, density), bins


@lower(aten._histogramdd_bin_edges.default)
def histogramdd_bin_edges(self, bins, *, range=None, weight=None, density=False):
    x = self.reshape(-1, self.shape[-1])
    lo, hi = _outer_edges(x, range, x.dtype)
    return [_linspace_edges(lo[k], hi[k], b, x.dtype) for k, b in enumerate(bins)]


@lower(aten._histogramdd_from_bin_cts.default)
def histogramdd_from_bin_cts(self, bins, *, range=None, weight=None, density=False):
    x = self.reshape(-1, self.shape[-1])
    edges = histogramdd_bin_edges(self, bins, range=range)
    return _histdd(x, edges, "local", weight, density)


@lower(aten._histogramdd_from_bin_tensors.default)
def histogramdd_from_bin_tensors(self, bins, *, weight=None, density=False):
    x = self.reshape(-1, self.shape[-1])
    return _histdd(x, [b.astype(x.dtype) for b in bins], "binary", weight, density)


@lower(aten.hash_tensor.default)
def hash_tensor(self, dim=(), *, keepdim=False, mode=0):
    if mode != 0:
        raise RuntimeError(f"hash_tensor: unsupported mode {mode}")
    # mode 0: XOR of the elements as uint64: a float's float64 bit pattern, an integer's or
    # bool's value cast to uint64 (two's complement, as ATen's static_cast).
    if jnp.issubdtype(self.dtype, jnp.inexact):
        bits = lax.bitcast_convert_type(self.astype(jnp.float64), jnp.uint64)
    elif self.dtype == jnp.uint64:
        bits = self
    else:
        bits = lax.bitcast_convert_type(self.astype(jnp.int64), jnp.uint64)
    ax = dims(dim, self.ndim)
    out = lax.reduce(bits, jnp.uint64(0), lax.bitwise_xor, ax)
    if keepdim:
        out = jnp.expand_dims(out, ax)
    return out

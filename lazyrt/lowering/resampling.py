"""Antialiased upsampling (``_upsample_{bilinear,bicubic,lanczos}2d_aa``) and
fractional max pooling, computed like PyTorch's CPU kernels.

Antialiased resampling is separable: along each spatial dim, output ``i`` is a
normalized weighted sum of the inputs within ``support`` of its center (PIL's
scheme, stretched by the scale when downsampling). The weights depend only on the
sizes and scales, so they are built once as a static [out, in] matrix per dim and
applied with a matmul; their backward is derived (``derived_backward``).
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from ._registry import aten, lower
from ._util import matmul_precision


def _area_scale(in_size, out_size, align_corners, scale):
    if align_corners:
        return (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    if scale is not None and scale > 0:
        return 1.0 / scale
    return in_size / out_size


def _bilinear_filter(x):
    x = np.abs(x)
    return np.where(x < 1, 1 - x, 0)


def _bicubic_filter(x, a=-0.5):
    x = np.abs(x)
    return np.where(x < 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                    np.where(x < 2, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, 0))


def _lanczos_filter(x, a=3):
    x = np.asarray(x, np.float64)
    return np.where(np.abs(x) < a, np.sinc(x) * np.sinc(x / a), 0)


_FILTERS = {"bilinear": (_bilinear_filter, 2), "bicubic": (_bicubic_filter, 4),
            "lanczos": (_lanczos_filter, 6)}


def aa_weights(in_size, out_size, align_corners, scale, mode):
    """[out_size, in_size] float32 weights of one dim (PyTorch's _compute_weights_aa)."""
    filt, interp_size = _FILTERS[mode]
    s = np.float32(_area_scale(in_size, out_size, align_corners, scale))
    support = np.float32(interp_size * 0.5 * s if s >= 1.0 else interp_size * 0.5)
    invscale = np.float32(1.0 / s) if s >= 1.0 else np.float32(1.0)
    W = np.zeros((out_size, in_size), np.float32)
    for i in range(out_size):
        center = np.float32(s * np.float32(i + 0.5))
        xmin = max(int(center - support + np.float32(0.5)), 0)
        xmax = min(int(center + support + np.float32(0.5)), in_size)
        j = np.arange(xmin, xmax)
        w = filt((j - center + np.float32(0.5)).astype(np.float32) * invscale).astype(np.float32)
        total = w.sum(dtype=np.float32)
        if total != 0:
            w = w / total
        W[i, xmin:xmax] = w
    return W


def _upsample_aa(x, output_size, align_corners, scales, mode):
    dt = x.dtype
    y = x.astype(jnp.float32) if dt in (jnp.bfloat16, jnp.float16) else x
    prec = matmul_precision()
    # width first, then height (the order of PyTorch's separable passes)
    for ax, out, sc in ((x.ndim - 1, output_size[1], scales[1]),
                        (x.ndim - 2, output_size[0], scales[0])):
        W = jnp.asarray(aa_weights(x.shape[ax], out, align_corners, sc, mode), y.dtype)
        y = jnp.moveaxis(jnp.tensordot(jnp.moveaxis(y, ax, -1), W.T, axes=1, precision=prec), -1, ax)
    return y.astype(dt)


@lower(aten._upsample_bilinear2d_aa.default, static_floats=True)
def _upsample_bilinear2d_aa(self, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_aa(self, output_size, align_corners, (scales_h, scales_w), "bilinear")


@lower(aten._upsample_bicubic2d_aa.default, static_floats=True)
def _upsample_bicubic2d_aa(self, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_aa(self, output_size, align_corners, (scales_h, scales_w), "bicubic")


@lower(aten._upsample_lanczos2d_aa.default, static_floats=True)
def _upsample_lanczos2d_aa(self, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_aa(self, output_size, align_corners, (scales_h, scales_w), "lanczos")


# ---- fractional max pooling ------------------------------------------------------------------


def _intervals(sample, in_size, out_size, pool):
    """Window starts of one dim for each plane's sample u in [0, 1) (PyTorch's
    generate_intervals, in the input's float type): int((i + u) * a) - int(u * a)."""
    if out_size == 0:
        return jnp.zeros(sample.shape + (0,), jnp.int64)
    alpha = jnp.asarray((in_size - pool) / (out_size - 1) if out_size > 1 else 0.0, sample.dtype)
    i = jnp.arange(out_size - 1, dtype=sample.dtype)
    u = sample[..., None]
    seq = (jnp.floor((i + u) * alpha) - jnp.floor(u * alpha)).astype(jnp.int64)
    last = jnp.full(sample.shape + (1,), in_size - pool, jnp.int64)
    return jnp.concatenate([seq, last], axis=-1)


def _fractional_max_pool(x, kernel_size, output_size, random_samples, nd):
    """Max over [start, start + k) windows per dim; ``random_samples[..., d]`` drives dim
    d's starts (PyTorch: 2-D samples are (w, h); 3-D samples are (t, h, w))."""
    batched = x.ndim == nd + 2
    if not batched:
        x = x[None]
        random_samples = random_samples.reshape((1,) + random_samples.shape[-2:])
    N, C = x.shape[:2]
    spatial = x.shape[2:]
    order = (1, 0) if nd == 2 else (0, 1, 2)  # sample index of each spatial dim
    rs = random_samples.astype(x.dtype if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.float32)
    if math.prod(output_size) == 0 or x.size == 0:
        shape = (N, C) + tuple(output_size)
        v, i = jnp.zeros(shape, x.dtype), jnp.zeros(shape, jnp.int64)
        return (v, i) if batched else (v[0], i[0])
    # per dim d: absolute input index of (output o, window offset j), shape (N, C, o, k)
    pos = []
    for d in range(nd):
        start = _intervals(rs[..., order[d]], spatial[d], output_size[d], kernel_size[d])
        pos.append(start[..., None] + jnp.arange(kernel_size[d]))
    strides = [math.prod(spatial[d + 1:]) for d in range(nd)]
    # flat input index for every (o_0.., j_0..) combination: (N, C, o0, k0, o1, k1, ...)
    flat = 0
    for d in range(nd):
        shape = [N, C] + [1] * (2 * nd)
        shape[2 + 2 * d], shape[3 + 2 * d] = output_size[d], kernel_size[d]
        flat = flat + pos[d].reshape(shape) * strides[d]
    perm = [0, 1] + [2 + 2 * d for d in range(nd)] + [3 + 2 * d for d in range(nd)]
    flat = jnp.transpose(flat, perm).reshape((N, C) + tuple(output_size) + (-1,))
    xf = x.reshape(N, C, -1)
    vals = jnp.take_along_axis(xf, flat.reshape(N, C, -1), axis=2).reshape(flat.shape)
    # the first maximum in window order; a NaN wins, the last one of them (the CPU loop's
    # ``val > max || isnan(val)``)
    am = jnp.argmax(vals, axis=-1)
    if jnp.issubdtype(vals.dtype, jnp.inexact):
        nan = jnp.isnan(vals)
        last_nan = nan.shape[-1] - 1 - jnp.argmax(nan[..., ::-1], axis=-1)
        am = jnp.where(jnp.any(nan, axis=-1), last_nan, jnp.argmax(jnp.where(nan, -jnp.inf, vals),
                                                                    axis=-1))
    v = jnp.take_along_axis(vals, am[..., None], -1)[..., 0]
    i = jnp.take_along_axis(flat, am[..., None], -1)[..., 0].astype(jnp.int64)
    return (v, i) if batched else (v[0], i[0])


@lower(aten.fractional_max_pool2d.default)
def fractional_max_pool2d(self, kernel_size, output_size, random_samples):
    return _fractional_max_pool(self, tuple(kernel_size), tuple(output_size), random_samples, 2)


@lower(aten.fractional_max_pool3d.default)
def fractional_max_pool3d(self, kernel_size, output_size, random_samples):
    return _fractional_max_pool(self, tuple(kernel_size), tuple(output_size), random_samples, 3)


def _fractional_max_pool_backward(grad_output, self, indices, nd):
    """Scatter-add each output's gradient to the input position its index names."""
    lead = self.shape[:self.ndim - nd]
    n = math.prod(self.shape[self.ndim - nd:])
    g = grad_output.reshape((-1, math.prod(grad_output.shape[len(lead):])))
    i = indices.reshape(g.shape).astype(jnp.int64)
    rows = jnp.arange(g.shape[0])[:, None]
    out = jnp.zeros((g.shape[0], n), grad_output.dtype).at[rows, i].add(g)
    return out.reshape(self.shape)


@lower(aten.fractional_max_pool2d_backward.default)
def fractional_max_pool2d_backward(grad_output, self, kernel_size, output_size, indices):
    return _fractional_max_pool_backward(grad_output, self, indices, 2)


@lower(aten.fractional_max_pool3d_backward.default)
def fractional_max_pool3d_backward(grad_output, self, kernel_size, output_size, indices):
    return _fractional_max_pool_backward(grad_output, self, indices, 3)

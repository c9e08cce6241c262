"""FFT lowerings: ATen's three primitives ``_fft_r2c``, ``_fft_c2c`` and ``_fft_c2r``
(every ``torch.fft.*`` function reaches one of them).

``normalization`` is ATen's fft_norm_mode: 0 none, 1 by 1/sqrt(n), 2 by 1/n, for
either direction; the transforms below are computed unnormalized and then scaled.
"""
from __future__ import annotations

import math

import jax.numpy as jnp

from ._registry import aten, lower


def _scale(out, n, normalization):
    if normalization == 1:
        return out * (1.0 / math.sqrt(n))
    if normalization == 2:
        return out * (1.0 / n)
    return out


def _size(shape, dim):
    n = 1
    for d in dim:
        n *= shape[d]
    return n


def _cdt(x):
    return jnp.complex128 if x.dtype in (jnp.float64, jnp.complex128) else jnp.complex64


@lower(aten._fft_r2c.default)
def fft_r2c(self, dim, normalization, onesided):
    dim = [d % self.ndim for d in dim]
    x = self.astype(jnp.float64 if self.dtype == jnp.float64 else jnp.float32)
    if onesided:
        out = jnp.fft.rfftn(x, axes=dim, norm="backward")
    else:
        out = jnp.fft.fftn(x.astype(_cdt(x)), axes=dim, norm="backward")
    return _scale(out, _size(self.shape, dim), normalization)


@lower(aten._fft_c2c.default)
def fft_c2c(self, dim, normalization, forward):
    dim = [d % self.ndim for d in dim]
    x = self.astype(_cdt(self))
    if not dim:
        return x
    if forward:
        out = jnp.fft.fftn(x, axes=dim, norm="backward")
    else:
        out = jnp.fft.ifftn(x, axes=dim, norm="forward")  # unscaled inverse
    return _scale(out, _size(self.shape, dim), normalization)


@lower(aten._fft_c2r.default)
def fft_c2r(self, dim, normalization, last_dim_size):
    dim = [d % self.ndim for d in dim]
    x = self.astype(_cdt(self))
    s = [self.shape[d] for d in dim[:-1]] + [last_dim_size]
    out = jnp.fft.irfftn(x, s=s, axes=dim, norm="forward")  # unscaled inverse
    n = 1
    for v in s:
        n *= v
    return _scale(out, n, normalization)

"""Small helpers shared by lowerings."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .._base.dtypes import to_jax
from .._base.platform import on_cpu


def jdt(dtype):
    """torch dtype (or None) -> jnp dtype (or None)."""
    return None if dtype is None else to_jax(dtype)


def canon_dim(dim, ndim):
    if ndim == 0:
        ndim = 1
    return dim % ndim


def dims(dim, ndim):
    """ATen dim / dim list (None or [] = all) -> tuple of non-negative axes."""
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, int):
        return (canon_dim(dim, ndim),)
    if len(dim) == 0:
        return tuple(range(ndim))
    return tuple(sorted({canon_dim(d, ndim) for d in dim}))


def is_float(x) -> bool:
    return jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)


def opmath(x):
    """Compute low-precision floats in float32, as PyTorch's CPU kernels do."""
    if x.dtype in (jnp.bfloat16, jnp.float16):
        return x.astype(jnp.float32)
    return x


def vjp(f, *primals):
    """``jax.vjp`` for a backward lowering: ``(outputs, pullback)`` where the pullback takes
    cotangents in any floating dtype and returns each gradient in its primal's dtype.

    The cotangent a backward op receives has the dtype PyTorch gives the forward's output
    (the input's: bfloat16 for a bfloat16 conv), while the JAX forward may return a wider
    one (a conv or matmul with ``preferred_element_type=float32``, an ``opmath`` body):
    ``jax.vjp``'s pullback refuses a cotangent of another dtype. Each cotangent is cast to
    its output's dtype (a widening cast is exact), and each gradient back to its primal's
    (one rounding at the end, as PyTorch's CPU kernels accumulate in float32)."""
    out, pullback = jax.vjp(f, *primals)

    def pull(cotangents):
        cots = jax.tree_util.tree_map(
            lambda c, o: jnp.broadcast_to(jnp.asarray(c).astype(o.dtype), o.shape), cotangents, out)
        grads = pullback(cots)
        return tuple(g if g is None or g.dtype == jnp.asarray(p).dtype else
                     g.astype(jnp.asarray(p).dtype) for g, p in zip(grads, primals))

    return out, pull


def matmul_precision():
    p = torch.get_float32_matmul_precision()
    return {"highest": lax.Precision.HIGHEST, "high": lax.Precision.HIGH,
            "medium": lax.Precision.DEFAULT}[p]


def log1p(x):
    """log(1 + x), vectorizable on XLA:CPU.

    XLA:CPU's own log1p keeps a fused elementwise loop from being vectorized at full width:
    one log1p in a 20-op chain cost 2 ms per 1M floats, the other 19 ops together 2 ms. On the
    CPU, for float32, compute it from two branch-free pieces the vectorizer handles:
    near zero (1 + x in [sqrt(1/2), sqrt(2)]) the series log1p(x) = 2 atanh(s) with
    s = x / (2 + x), |s| < 0.172, to the s^15 term (truncation below 1e-12); elsewhere
    log(1 + x), whose rounding of 1 + x costs at most half an ulp of the result there.
    Measured against float64: at most 2.7 ulps, mean 0.3 ulps. (The usual
    log(u) * x / (u - 1) trick does not survive XLA, which simplifies (1 + x) - 1 to x.)
    """
    if x.dtype != jnp.float32 or not on_cpu():
        return jnp.log1p(x)
    s = x / (2.0 + x)
    z = s * s
    p = jnp.full_like(z, 1.0 / 15)
    for k in (13, 11, 9, 7, 5, 3):
        p = p * z + 1.0 / k
    near = 2.0 * s * (p * z + 1.0)
    r = jnp.where((x > -0.2929) & (x < 0.4142), near, jnp.log(1.0 + x))
    return jnp.where(jnp.abs(x) < 2.0 ** -24, x, r)

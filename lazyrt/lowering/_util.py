"""Small helpers shared by lowerings."""
from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from .._dtypes import to_jax


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


def matmul_precision():
    p = torch.get_float32_matmul_precision()
    return {"highest": lax.Precision.HIGHEST, "high": lax.Precision.HIGH,
            "medium": lax.Precision.DEFAULT}[p]

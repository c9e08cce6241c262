"""Factory ops (no tensor input; reached through PrivateUse1 kernels) and *_like ops."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ._registry import aten, lower
from ._util import jdt


def _dt(dtype, default=jnp.float32):
    return jdt(dtype) if dtype is not None else default


def _value(v, dt):
    """A Python int for an integer dtype, wrapped as C++ converts it (-1 is 255 in uint8;
    the values that overflow raised at the op: ``_ops.int_checks``); JAX refuses it."""
    if dt is not None and type(v) is int and jnp.issubdtype(dt, jnp.integer):
        return np.asarray(v, np.int64).astype(dt)
    return v


@lower(aten.empty.memory_format, aten.empty_strided.default, aten.zeros.default,
       aten._efficientzerotensor.default)
def zeros(size, *args, dtype=None, **_):
    # NOTE: empty() is zeros here: deterministic, and free once fused.
    return jnp.zeros(tuple(size), _dt(dtype))


@lower(aten.ones.default)
def ones(size, *args, dtype=None, **_):
    return jnp.ones(tuple(size), _dt(dtype))


@lower(aten.full.default)
def full(size, fill_value, *args, dtype=None, **_):
    dt = _dt(dtype, None)
    return jnp.full(tuple(size), _value(fill_value, dt), dt)


@lower(aten.scalar_tensor.default)
def scalar_tensor(s, *, dtype=None, **_):
    dt = _dt(dtype, None)
    return jnp.asarray(_value(s, dt), dt)


@lower(aten.empty_like.default, aten.zeros_like.default, aten.new_empty.default,
       aten.new_zeros.default, aten.new_empty_strided.default)
def zeros_like(self, *args, dtype=None, **_):
    shape = self.shape if not args else tuple(args[0])
    return jnp.zeros(shape, _dt(dtype, self.dtype))


@lower(aten.ones_like.default, aten.new_ones.default)
def ones_like(self, *args, dtype=None, **_):
    shape = self.shape if not args else tuple(args[0])
    return jnp.ones(shape, _dt(dtype, self.dtype))


@lower(aten.full_like.default)
def full_like(self, fill_value, *, dtype=None, **_):
    dt = _dt(dtype, self.dtype)
    return jnp.full(self.shape, _value(fill_value, dt), dt)


@lower(aten.new_full.default)
def new_full(self, size, fill_value, *, dtype=None, **_):
    dt = _dt(dtype, self.dtype)
    return jnp.full(tuple(size), _value(fill_value, dt), dt)


@lower(aten.arange.default, aten.arange.start, aten.arange.start_step, static_floats=True)
def arange(*args, dtype=None, **_):
    if len(args) == 1:
        start, end, step = 0, args[0], 1
    elif len(args) == 2:
        (start, end), step = args, 1
    else:
        start, end, step = args
    jd = _dt(dtype, None)
    n = max(0, -(-(end - start) // step)) if all(isinstance(v, int) for v in (start, end, step)) \
        else max(0, int(-(-(end - start) // step)))
    if all(isinstance(v, int) for v in (start, end, step)):
        return jnp.arange(n, dtype=jnp.int64) * step + start
    import math
    n = max(0, math.ceil((end - start) / step))
    return start + jnp.arange(n, dtype=jnp.float64) * step if jd is None or jnp.issubdtype(jd, jnp.inexact) \
        else (start + jnp.arange(n, dtype=jnp.float64) * step)


@lower(aten.linspace.default, static_floats=True)
def linspace(start, end, steps, *, dtype=None, **_):
    jd = _dt(dtype, jnp.float32)
    if steps == 1:
        return jnp.full((1,), start, jnp.complex128 if isinstance(start, complex) else jnp.float64)
    step = (end - start) / (steps - 1)
    i = jnp.arange(steps, dtype=jnp.float64)
    half = steps // 2
    out = jnp.where(i < half, start + step * i, end - step * (steps - 1 - i))
    if jnp.issubdtype(jd, jnp.integer):
        return jnp.trunc(out)
    return out


@lower(aten.logspace.default, static_floats=True)
def logspace(start, end, steps, base=10.0, *, dtype=None, **_):
    return jnp.power(base, linspace(start, end, steps))


@lower(aten.eye.default, aten.eye.m)
def eye(n, m=None, *, dtype=None, **_):
    return jnp.eye(n, n if m is None else m, dtype=_dt(dtype))


@lower(aten.tril_indices.default)
def tril_indices(row, col, offset=0, **_):
    r, c = jnp.tril_indices(row, offset, col)
    return jnp.stack([r, c]).astype(jnp.int64)


@lower(aten.triu_indices.default)
def triu_indices(row, col, offset=0, **_):
    r, c = jnp.triu_indices(row, offset, col)
    return jnp.stack([r, c]).astype(jnp.int64)

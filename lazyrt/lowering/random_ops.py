"""Random ops. Each gets a PRNG key built from a runtime seed (see lazyrt._base.rng):
values differ from CPU's generator, distributions match."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from ._registry import aten, lower
from ._util import jdt


def _rlower(*ops, **kw):
    return lower(*ops, random=True, **kw)


def _fdt(x):
    return x.dtype if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.float32


@_rlower(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor)
def normal_t(mean, std=1.0, *, generator):
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    dt = jnp.result_type(*[x for x in (mean, std) if hasattr(x, "dtype")])
    return mean + std * jax.random.normal(generator, shape, _draw_dtype(dt))


@_rlower(aten.normal.float_float)
def normal_ff(mean, std, size, *, generator, dtype=None, **_):
    return mean + std * jax.random.normal(generator, tuple(size), _draw_dtype(dtype))


@_rlower(aten.normal_functional.default)
def normal_functional(self, mean=0.0, std=1.0, *, generator):
    # as randn draws: randn(out=t) is t.normal_(), and the same seed gives the same values
    return _normal(generator, self.shape, _draw_dtype(_fdt(self)), mean, std)


def _normal(key, shape, dt, mean=0.0, std=1.0):
    """``mean + std * N(0, 1)`` of ``shape``, drawn in ``dt``; complex as ATen's normal_ of a
    complex tensor: its view_as_real's parts each ``mean + std/sqrt(2) * N(0, 1)``."""
    if jnp.issubdtype(dt, jnp.complexfloating):
        part = jnp.real(jnp.zeros((), dt)).dtype
        pairs = mean + (std / math.sqrt(2)) * jax.random.normal(key, tuple(shape) + (2,), part)
        return jax.lax.complex(pairs[..., 0], pairs[..., 1])
    return mean + std * jax.random.normal(key, tuple(shape), dt)


@_rlower(aten.uniform.default)
def uniform(self, from_=0.0, to=1.0, *, generator):
    if jnp.iscomplexobj(self):  # ATen: real and imaginary parts each uniform (view_as_real)
        part = jax.random.uniform(generator, self.shape + (2,), jnp.real(self).dtype, from_, to)
        return jax.lax.complex(part[..., 0], part[..., 1])
    return jax.random.uniform(generator, self.shape, _draw_dtype(_fdt(self)), from_, to)


@_rlower(aten.bernoulli.default)
def bernoulli(self, *, generator):
    return jax.random.uniform(generator, self.shape, jnp.float32) < self


@_rlower(aten.bernoulli.p)
def bernoulli_p(self, p=0.5, *, generator):
    return jax.random.uniform(generator, self.shape, jnp.float32) < p


@_rlower(aten.bernoulli.Tensor)
def bernoulli_t(self, p, *, generator):
    return jnp.broadcast_to(jax.random.uniform(generator, self.shape, jnp.float32) < p, self.shape)


@_rlower(aten.exponential.default)
def exponential(self, lambd=1.0, *, generator):
    return jax.random.exponential(generator, self.shape, _fdt(self)) / lambd


@_rlower(aten.geometric.default)
def geometric(self, p, *, generator):
    u = jax.random.uniform(generator, self.shape, jnp.float32, 1e-7, 1.0)
    return jnp.ceil(jnp.log(u) / jnp.log1p(-p))


@_rlower(aten.log_normal.default)
def log_normal(self, mean=1.0, std=2.0, *, generator):
    return jnp.exp(mean + std * jax.random.normal(generator, self.shape, _fdt(self)))


@_rlower(aten.cauchy.default)
def cauchy(self, median=0.0, sigma=1.0, *, generator):
    return median + sigma * jax.random.cauchy(generator, self.shape, _fdt(self))


def _int_range(dtype):
    if dtype == jnp.bool_:
        return 0, 2
    if jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        return 0, int(info.max) + 1 if info.max < 2**62 else 2**62
    return 0, 2 ** jnp.finfo(dtype).nmant + 1


@_rlower(aten.random.default)
def random_(self, *, generator):
    lo, hi = _int_range(self.dtype)
    return jax.random.randint(generator, self.shape, lo, hi, jnp.int64)


@_rlower(aten.random.to)
def random_to(self, to, *, generator):
    lo = 0
    return jax.random.randint(generator, self.shape, lo, to, jnp.int64)


@_rlower(getattr(aten.random, "from"))
def random_from(self, from_, to, *, generator):
    if to is None:
        to = _int_range(self.dtype)[1]
    return jax.random.randint(generator, self.shape, from_, to, jnp.int64)


def _draw_dtype(dtype):
    """The dtype ``rand``/``randn`` draw in: the result's (float64 with float64's bits,
    complex with both parts drawn), float32 for the narrower floats (then rounded)."""
    if dtype is None:
        return jnp.dtype(jnp.float32)
    jd = jnp.dtype(jdt(dtype)) if isinstance(dtype, torch.dtype) else jnp.dtype(dtype)
    if jd.itemsize < 4 and jnp.issubdtype(jd, jnp.floating):
        return jnp.dtype(jnp.float32)
    if jd.itemsize < 8 and jnp.issubdtype(jd, jnp.complexfloating):  # complex32
        return jnp.dtype(jnp.complex64)
    return jd


@_rlower(aten.rand.default, aten.rand.generator)
def rand(size, *args, generator, dtype=None, **_):
    dt = _draw_dtype(dtype)
    if jnp.issubdtype(dt, jnp.complexfloating):  # ATen: each part uniform in [0, 1)
        part = jax.random.uniform(generator, tuple(size) + (2,), jnp.real(jnp.zeros((), dt)).dtype)
        return jax.lax.complex(part[..., 0], part[..., 1])
    return jax.random.uniform(generator, tuple(size), dt)


@_rlower(aten.randn.default, aten.randn.generator)
def randn(size, *args, generator, dtype=None, **_):
    return _normal(generator, size, _draw_dtype(dtype))


@_rlower(aten.randint.default, aten.randint.generator)
def randint(high, size, *args, generator, dtype=None, **_):
    return jax.random.randint(generator, tuple(size), 0, high, jnp.int64)


@_rlower(aten.randint.low, aten.randint.low_generator)
def randint_low(low, high, size, *args, generator, dtype=None, **_):
    return jax.random.randint(generator, tuple(size), low, high, jnp.int64)


@_rlower(aten.rand_like.default)
def rand_like(self, *, generator, dtype=None, **_):
    return jax.random.uniform(generator, self.shape, jnp.float32)


@_rlower(aten.randn_like.default)
def randn_like(self, *, generator, dtype=None, **_):
    return jax.random.normal(generator, self.shape, jnp.float32)


@_rlower(aten.randint_like.default)
def randint_like(self, high, *, generator, dtype=None, **_):
    return jax.random.randint(generator, self.shape, 0, high, jnp.int64)


@_rlower(aten.randint_like.low_dtype)
def randint_like_low(self, low, high, *, generator, dtype=None, **_):
    return jax.random.randint(generator, self.shape, low, high, jnp.int64)


@_rlower(aten.randperm.default, aten.randperm.generator)
def randperm(n, *, generator, dtype=None, **_):
    return jax.random.permutation(generator, n).astype(jnp.int64)


@_rlower(aten.multinomial.default)
def multinomial(self, num_samples, replacement=False, *, generator):
    p = self.astype(jnp.float32)
    logits = jnp.log(p / jnp.sum(p, axis=-1, keepdims=True))
    if replacement:
        shape = (num_samples,) + p.shape[:-1]
        s = jax.random.categorical(generator, logits, axis=-1, shape=shape)
        return jnp.moveaxis(s, 0, -1).astype(jnp.int64)
    # Gumbel top-k: sampling without replacement.
    g = jax.random.gumbel(generator, p.shape, jnp.float32)
    _, idx = jax.lax.top_k(logits + g, num_samples)
    return idx.astype(jnp.int64)


@_rlower(aten.native_dropout.default)
def native_dropout(input, p, train, *, generator):
    if train is False:
        return input, jnp.ones(input.shape, jnp.bool_)
    keep = jax.random.uniform(generator, input.shape, jnp.float32) >= p
    scale = 1.0 / (1.0 - p)
    return jnp.where(keep, input * scale, 0), keep


@lower(aten.native_dropout_backward.default)
def native_dropout_backward(grad_output, mask, scale):
    return grad_output * mask * scale


@lower(aten.rrelu_with_noise.default)
def rrelu_with_noise(self, noise, lower_=0.125, upper=1.0 / 3.0, training=False, generator=None, **kw):
    lower_ = kw.get("lower", lower_)
    upper = kw.get("upper", upper)
    training = kw.get("training", training)
    generator = kw.get("generator", generator)
    x = self
    if not training:
        return jnp.where(x >= 0, x, x * ((lower_ + upper) / 2)), noise
    r = jax.random.uniform(generator, x.shape, jnp.float32, 0.0, 1.0)
    r = (lower_ + (upper - lower_) * r).astype(x.dtype)
    neg = x <= 0
    return jnp.where(neg, x * r, x), jnp.where(neg, r, jnp.ones_like(r)).astype(noise.dtype)

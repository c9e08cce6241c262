"""Random ops. Each gets a PRNG key built from a runtime seed (see lazyrt._base.rng):
values differ from CPU's generator, distributions match."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ._registry import aten, lower
from ._util import jdt


def _rlower(*ops, **kw):
    return lower(*ops, random=True, **kw)


def _flat(draw):
    """``draw`` (a ``jax.random`` function taking ``(key, shape, ...)``) made over the flat
    shape and reshaped. The values are the same bit for bit: with partitionable threefry
    each element is a function of its row-major index alone (``tests/test_flat_draws.py``).
    XLA compiles the draw's counter as one 1-D iota instead of an iota per dimension
    combined: on XLA:CPU a float32 ``uniform`` of shape (2, 3, 4, 5, 6) compiled in 1.54 s,
    flat 0.14 s; (4, 8, 16) 0.80 s against 0.17 s; (32, 512) 0.20 s against 0.14 s; 1-D
    draws are left as they are (``python -m perf.flat_draws --compile``)."""
    def flat(key, shape, *args, **kw):
        shape = tuple(shape)
        if len(shape) < 2:
            return draw(key, shape, *args, **kw)
        return draw(key, (math.prod(shape),), *args, **kw).reshape(shape)
    flat.__name__ = draw.__name__
    return flat


class _random:
    """The element-wise draws of ``jax.random`` this module makes, flat (``_flat``)."""
    bits = staticmethod(_flat(jax.random.bits))
    uniform = staticmethod(_flat(jax.random.uniform))
    normal = staticmethod(_flat(jax.random.normal))
    randint = staticmethod(_flat(jax.random.randint))
    exponential = staticmethod(_flat(jax.random.exponential))
    cauchy = staticmethod(_flat(jax.random.cauchy))
    gumbel = staticmethod(_flat(jax.random.gumbel))


def _fdt(x):
    return x.dtype if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.float32


@_rlower(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor)
def normal_t(mean, std=1.0, *, generator):
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    dt = jnp.result_type(*[x for x in (mean, std) if hasattr(x, "dtype")])
    return mean + std * _random.normal(generator, shape, _draw_dtype(dt))


@_rlower(aten.normal.float_float)
def normal_ff(mean, std, size, *, generator, dtype=None, **_):
    return mean + std * _random.normal(generator, tuple(size), _draw_dtype(dtype))


@_rlower(aten.normal_functional.default)
def normal_functional(self, mean=0.0, std=1.0, *, generator):
    # as randn draws: randn(out=t) is t.normal_(), and the same seed gives the same values
    return _normal(generator, self.shape, _draw_dtype(_fdt(self)), mean, std)


def _normal(key, shape, dt, mean=0.0, std=1.0):
    """``mean + std * N(0, 1)`` of ``shape``, drawn in ``dt``; complex as ATen's normal_ of a
    complex tensor: its view_as_real's parts each ``mean + std/sqrt(2) * N(0, 1)``."""
    if jnp.issubdtype(dt, jnp.complexfloating):
        part = jnp.real(jnp.zeros((), dt)).dtype
        pairs = mean + (std / math.sqrt(2)) * _random.normal(key, tuple(shape) + (2,), part)
        return jax.lax.complex(pairs[..., 0], pairs[..., 1])
    return mean + std * _random.normal(key, tuple(shape), dt)


def uniform_values(generator, shape, dtype, from_, to):
    """ATen's CPU ``uniform_``: ``from``/``to`` cast to the dtype, ``digits`` random bits
    scaled by ``2**-digits`` into [0, 1), then ``x * (to - from) + from`` in float32
    (float64 for float64), cast to the dtype."""
    name = jnp.dtype(dtype).name
    digits = FP_DIGITS[name]
    acc = jnp.float64 if name == "float64" else jnp.float32
    lo = _to_fp(jnp.asarray(from_, jnp.float64), name).astype(acc)
    hi = _to_fp(jnp.asarray(to, jnp.float64), name).astype(acc)
    bits = _random.bits(generator, shape, jnp.uint64 if name == "float64" else jnp.uint32)
    mask = (1 << digits) - 1
    x = (bits & jnp.asarray(mask, bits.dtype)).astype(acc) * acc(1.0 / (1 << digits))
    return (x * (hi - lo) + lo).astype(dtype)


@_rlower(aten.uniform.default)
def uniform(self, from_=0.0, to=1.0, *, generator):
    if jnp.iscomplexobj(self):  # ATen: real and imaginary parts each uniform (view_as_real)
        part = uniform_values(generator, self.shape + (2,), jnp.real(self).dtype, from_, to)
        return jax.lax.complex(part[..., 0], part[..., 1])
    return uniform_values(generator, self.shape, _fdt(self), from_, to)


@_rlower(aten.bernoulli.default)
def bernoulli(self, *, generator):
    return _random.uniform(generator, self.shape, jnp.float32) < self


@_rlower(aten.bernoulli.p)
def bernoulli_p(self, p=0.5, *, generator):
    return _random.uniform(generator, self.shape, jnp.float32) < p


@_rlower(aten.bernoulli.Tensor)
def bernoulli_t(self, p, *, generator):
    return jnp.broadcast_to(_random.uniform(generator, self.shape, jnp.float32) < p, self.shape)


@_rlower(aten.exponential.default)
def exponential(self, lambd=1.0, *, generator):
    return _random.exponential(generator, self.shape, _fdt(self)) / lambd


@_rlower(aten.geometric.default)
def geometric(self, p, *, generator):
    u = _random.uniform(generator, self.shape, jnp.float32, 1e-7, 1.0)
    return jnp.ceil(jnp.log(u) / jnp.log1p(-p))


@_rlower(aten.log_normal.default)
def log_normal(self, mean=1.0, std=2.0, *, generator):
    return jnp.exp(mean + std * _random.normal(generator, self.shape, _fdt(self)))


@_rlower(aten.cauchy.default)
def cauchy(self, median=0.0, sigma=1.0, *, generator):
    return median + sigma * _random.cauchy(generator, self.shape, _fdt(self))


# ---- random_: ATen's DistributionTemplates.h (random_impl, random_from_to_impl) ---------
# ``std::numeric_limits<T>::digits`` of the floating dtypes
FP_DIGITS = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}
INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
# dtypes whose random_(from, to) draws 64 random bits for a range of 2**32 or more
_WIDE = frozenset({"int64", "float64", "float32", "bfloat16"})


def _to_fp(x, name):
    """``static_cast<T>`` of a float64/int64 value as C++ does it: float16 and bfloat16
    go through float (``c10::Half``/``c10::BFloat16`` are built from a float)."""
    if name == "float64":
        return x.astype(jnp.float64)
    f32 = x.astype(jnp.float32)
    return f32 if name == "float32" else f32.astype(jnp.dtype(name))


def _wrap64(v: int) -> int:
    return (v + 2 ** 63) % 2 ** 64 - 2 ** 63


def round_trip(v: int, name: str) -> int:
    """``static_cast<int64_t>(static_cast<T>(v))`` for an int64 ``v`` (wrapped as x86 does)
    and a floating dtype ``name``; x86 gives INT64_MIN for a value an int64 cannot hold."""
    with np.errstate(over="ignore"):  # float16's inf, as C++ casts it
        f = float(_to_fp(np.asarray(_wrap64(v), np.int64), name).astype(np.float64))
    if not math.isfinite(f) or not INT64_MIN <= f < 2 ** 63:
        return INT64_MIN
    return int(f)


def _shift(v: int, digits: int) -> int | None:
    """``1LL << (n - digits + 1)`` with ``n`` the top bit of ``std::abs(v)``; None where
    ATen's loop would not end (``v`` INT64_MIN)."""
    a = abs(_wrap64(v))
    if a > INT64_MAX:
        return None
    return 1 << max(a.bit_length() - 1 - digits + 1, 0)


def update_from(v: int, name: str) -> int:
    """ATen's ``update_from<T>``: ``from`` moved right to where ``T`` holds it exactly."""
    plus_1 = round_trip(v + 1, name)
    if plus_1 < v:
        sh = _shift(v + 1, FP_DIGITS[name])
        if sh is not None:
            v = _wrap64(plus_1 + sh)
    return v


def update_to(v: int, name: str) -> int:
    """ATen's ``update_to<T>``: ``to`` moved left to where ``T`` holds ``to - 1`` exactly."""
    minus_1 = round_trip(v - 1, name)
    if minus_1 >= v:
        sh = _shift(v - 1, FP_DIGITS[name])
        if sh is not None:
            v = _wrap64(minus_1 - sh)
    return v


def int_max(name: str) -> int:
    return 1 if name == "bool" else int(np.iinfo(np.dtype(name)).max)


def from_to_range(name: str, from_: int, to) -> tuple[int, int | None]:
    """``(base, range)`` that ``random_from_to_impl`` hands its kernel (range None: the
    full 64-bit range), ``from``/``to`` moved as it moves them (no checks here)."""
    fp = name in FP_DIGITS
    if to is not None:
        if fp:
            from_, to = update_from(from_, name), update_to(to, name)
        return from_, (to - from_) % 2 ** 64
    if from_ == INT64_MIN:
        return from_, None
    if fp:
        to_inc = min(1 << FP_DIGITS[name], INT64_MAX)
        from_ = update_from(from_, name)
    else:
        to_inc = int_max(name)
    return from_, (to_inc - from_ + 1) % 2 ** 64


def _cast_int64(v, dtype):
    """``static_cast<T>`` of int64 values."""
    name = jnp.dtype(dtype).name
    if name in FP_DIGITS:
        return _to_fp(v, name)
    if name == "bool":
        return v != 0
    return v.astype(dtype)


def random_values(generator, shape, dtype, base: int, rng):
    """ATen's ``uniform_int_from_to_distribution``: ``(bits % range) + base`` in uint64,
    as int64, cast to the dtype; 32 random bits unless the dtype is wide and the range
    2**32 or more. ``rng`` None: all 64 bits as an int64 (``uniform_int_full_range``)."""
    name = jnp.dtype(dtype).name
    wide = rng is None or (rng >= 2 ** 32 and name in _WIDE)
    bits = _random.bits(generator, shape, jnp.uint64 if wide else jnp.uint32).astype(jnp.uint64)
    if rng is not None:
        bits = bits % jnp.uint64(rng) + jnp.uint64(base % 2 ** 64)
    return _cast_int64(jax.lax.bitcast_convert_type(bits, jnp.int64), dtype)


def random_default_values(generator, shape, dtype):
    """ATen's ``uniform_int_distribution`` (``random_()``): bool the low bit; int64
    [0, 2**63 - 1]; other ints [0, max]; floating dtypes [0, 2**digits]. 64 random bits
    for int64 and float64, 32 for the rest."""
    name = jnp.dtype(dtype).name
    wide = name in ("int64", "float64")
    bits = _random.bits(generator, shape, jnp.uint64 if wide else jnp.uint32).astype(jnp.uint64)
    if name == "bool":
        return (bits & jnp.uint64(1)) != 0
    mod = (1 << FP_DIGITS[name]) + 1 if name in FP_DIGITS else int_max(name) + 1
    return _cast_int64((bits % jnp.uint64(mod)).astype(jnp.int64), dtype)


@_rlower(aten.random.default)
def random_(self, *, generator):
    return random_default_values(generator, self.shape, self.dtype)


@_rlower(aten.random.to)
def random_to(self, to, *, generator):
    base, rng = from_to_range(jnp.dtype(self.dtype).name, 0, to)
    return random_values(generator, self.shape, self.dtype, base, rng)


@_rlower(getattr(aten.random, "from"))
def random_from(self, from_, to=None, *, generator):
    base, rng = from_to_range(jnp.dtype(self.dtype).name, from_, to)
    return random_values(generator, self.shape, self.dtype, base, rng)


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
    # as uniform_ draws (rand(out=t) is t.uniform_(0, 1): the same seed, the same values)
    jd = jnp.dtype(jnp.float32) if dtype is None else jnp.dtype(jdt(dtype))
    if jnp.issubdtype(jd, jnp.complexfloating):  # ATen: each part uniform in [0, 1)
        part = uniform_values(generator, tuple(size) + (2,), jnp.real(jnp.zeros((), jd)).dtype, 0.0, 1.0)
        return jax.lax.complex(part[..., 0], part[..., 1])
    return uniform_values(generator, tuple(size), jd, 0.0, 1.0)


@_rlower(aten.randn.default, aten.randn.generator)
def randn(size, *args, generator, dtype=None, **_):
    return _normal(generator, size, _draw_dtype(dtype))


@_rlower(aten.randint.default, aten.randint.generator)
def randint(high, size, *args, generator, dtype=None, **_):
    return _random.randint(generator, tuple(size), 0, high, jnp.int64)


@_rlower(aten.randint.low, aten.randint.low_generator)
def randint_low(low, high, size, *args, generator, dtype=None, **_):
    return _random.randint(generator, tuple(size), low, high, jnp.int64)


@_rlower(aten.rand_like.default)
def rand_like(self, *, generator, dtype=None, **_):
    return _random.uniform(generator, self.shape, jnp.float32)


@_rlower(aten.randn_like.default)
def randn_like(self, *, generator, dtype=None, **_):
    return _random.normal(generator, self.shape, jnp.float32)


@_rlower(aten.randint_like.default)
def randint_like(self, high, *, generator, dtype=None, **_):
    return _random.randint(generator, self.shape, 0, high, jnp.int64)


@_rlower(aten.randint_like.low_dtype)
def randint_like_low(self, low, high, *, generator, dtype=None, **_):
    return _random.randint(generator, self.shape, low, high, jnp.int64)


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
    g = _random.gumbel(generator, p.shape, jnp.float32)
    _, idx = jax.lax.top_k(logits + g, num_samples)
    return idx.astype(jnp.int64)


@_rlower(aten.native_dropout.default)
def native_dropout(input, p, train, *, generator):
    if train is False:
        return input, jnp.ones(input.shape, jnp.bool_)
    keep = _random.uniform(generator, input.shape, jnp.float32) >= p
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
    r = _random.uniform(generator, x.shape, jnp.float32, 0.0, 1.0)
    r = (lower_ + (upper - lower_) * r).astype(x.dtype)
    neg = x <= 0
    return jnp.where(neg, x * r, x), jnp.where(neg, r, jnp.ones_like(r)).astype(noise.dtype)


# Draws made element by element over threefry's counters (JAX's partitionable threefry:
# element i of a draw of shape S is element i of the same draw flattened, and of a longer
# flat draw): the argument that gives the draw's shape, "size" or "self" (a tensor whose
# value is not read). Their first calls of a new shape run a flat draw of a bucketed length
# (``lazyrt._exec.flatdraw``), bit for bit the draw of that shape
# (``tests/test_flat_draws.py``).
FLAT_DRAWS = {
    aten.uniform.default: "self",
    aten.normal_functional.default: "self",
    aten.randn.default: "size",
    aten.randn.generator: "size",
    aten.rand.default: "size",
    aten.rand.generator: "size",
    aten.randint.default: "size",
    aten.randint.generator: "size",
    aten.randint.low: "size",
    aten.randint.low_generator: "size",
    aten.normal.float_float: "size",
    aten.bernoulli.p: "self",
    aten.exponential.default: "self",
    aten.geometric.default: "self",
    aten.log_normal.default: "self",
    aten.cauchy.default: "self",
    aten.random.default: "self",
    aten.random.to: "self",
    getattr(aten.random, "from"): "self",
    aten.rand_like.default: "self",
    aten.randn_like.default: "self",
    aten.randint_like.default: "self",
    aten.randint_like.low_dtype: "self",
}

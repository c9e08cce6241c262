"""The host evaluation of programs (``lazyrt._exec.hosteval``) gives the compiled program's
values bit for bit, or refuses.

Each case is a small JAX function; its jaxpr is evaluated with numpy and the result
compared, bit for bit, with ``jax.jit`` of the same function on XLA:CPU, over special
values (NaN, infinities, signed zeros, denormals, integer extremes) in every dtype the
primitive takes. A case may be refused (the program would be compiled); a value given
must be XLA's. Then the same through lazyrt's ops: the first calls of a strict program
run on the host, a later call runs the compiled executable, and both equal CPU eager.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

from lazyrt._exec import consts
from lazyrt._exec.hosteval import DATA, _float, evaluate_jaxpr

FLOATS = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]
INTS = [np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint32, np.bool_]


def _specials(dt, n=24, seed=0):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dt)
    if dt == np.bool_:
        return rng.integers(0, 2, n).astype(bool)
    if np.issubdtype(dt, np.integer):
        info = np.iinfo(dt)
        base = [info.min, info.max, 0, 1, -1 if info.min < 0 else 2, info.max // 2]
        rest = rng.integers(info.min, info.max, n - len(base), dtype=dt, endpoint=True)
        return np.concatenate([np.array(base, dt), rest])
    if np.issubdtype(dt, np.complexfloating):
        r = _specials(np.float32 if dt == np.complex64 else np.float64, n, seed)
        i = _specials(np.float32 if dt == np.complex64 else np.float64, n, seed + 1)
        return _pack(r, i, dt)
    info = ml_dtypes.finfo(dt)
    tiny = float(info.smallest_subnormal)
    base = [np.nan, np.inf, -np.inf, 0.0, -0.0, tiny, -tiny * 3, float(info.max),
            -float(info.max), float(info.tiny), 1.0, -2.5]
    rest = rng.standard_normal(n - len(base)) * 10.0
    return np.array(base + list(rest)).astype(dt)


def _pack(r, i, dt):
    out = np.empty(r.shape, dt)
    out.real, out.imag = r, i
    return out


def _bits(a):
    a = np.ascontiguousarray(np.asarray(a))
    return a.shape, a.dtype, a.view(np.uint8).tobytes()


def _check(f, *args):
    """Evaluate ``f`` on the host and compiled; equal bits where the host gives a value.
    Returns whether the host gave one."""
    with jax.enable_x64(True):
        closed = jax.make_jaxpr(f)(*args)
        want = jax.jit(f)(*args)
    got = evaluate_jaxpr(closed.jaxpr, closed.consts, [np.asarray(a) for a in args])
    if got is None or got is DATA:
        return False
    want = want if isinstance(want, (list, tuple)) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert _bits(g) == _bits(w), (f, args, g, np.asarray(w))
    return True


def _no_denormal(x):
    x = np.asarray(x)
    if not _float(x.dtype):
        return x
    tiny = ml_dtypes.finfo(x.dtype).tiny
    a = np.abs(x.astype(np.float64))
    return np.where((a > 0) & (a < float(tiny)), np.asarray(1.0, x.dtype), x).astype(x.dtype)


@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_float_arithmetic_rounds_as_xla(op, dt):
    f = {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "div": jnp.divide}[op]
    a, b = _specials(dt, seed=1), _specials(dt, seed=2)[::-1].copy()
    grid_a, grid_b = np.meshgrid(a, b)
    # with denormals among the values, refused or XLA's (flushed) values
    _check(f, grid_a, grid_b)
    # with no denormal among inputs and outputs, always given, and XLA's
    m = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -2.5, 3.0, 0.1, -7.25, 1e3]).astype(dt)
    assert _check(f, *np.meshgrid(m, m[::-1]))


@pytest.mark.parametrize("dt", FLOATS + INTS, ids=lambda d: np.dtype(d).name)
def test_comparisons_and_selects(dt):
    a = _no_denormal(_specials(dt, seed=3))
    b = _no_denormal(_specials(dt, seed=4))
    for f in (jnp.equal, jnp.not_equal, jnp.less, jnp.less_equal, jnp.greater,
              jnp.greater_equal):
        assert _check(f, a, b)
    assert _check(lambda x, y: jnp.where(x < y, x, y), a, b)
    assert _check(lambda x: x != x, a)  # isnan
    if _float(np.dtype(dt)):
        for f in (jnp.abs, jnp.negative, jnp.isfinite):
            assert _check(f, a)
            _check(f, _specials(dt, seed=3))  # denormals: refused, or XLA's values
    # a denormal read by a comparison: refused (XLA:CPU reads it as zero)
    d = _specials(dt, seed=3)
    if _float(np.dtype(dt)):
        assert not _check(lambda x: x > 0, d)


@pytest.mark.parametrize("dt", INTS, ids=lambda d: np.dtype(d).name)
def test_integer_arithmetic_wraps_as_xla(dt):
    a, b = _specials(dt, seed=5), _specials(dt, seed=6)
    if dt == np.bool_:
        for f in (jnp.logical_and, jnp.logical_or, jnp.logical_not, jnp.logical_xor):
            assert _check(f, a, b) if f is not jnp.logical_not else _check(f, a)
        return
    for f in (jnp.add, jnp.subtract, jnp.multiply, jnp.maximum, jnp.minimum,
              jnp.bitwise_and, jnp.bitwise_or, jnp.bitwise_xor):
        assert _check(f, a, b)
    for f in (jnp.negative, jnp.abs, jnp.invert):
        assert _check(f, a)
    assert _check(lambda x: x.sum(), a)
    assert _check(lambda x: x.reshape(4, 6).max(1), a)


@pytest.mark.parametrize("src", FLOATS + INTS + [np.complex64],
                         ids=lambda d: np.dtype(d).name)
def test_conversions(src):
    x = _specials(src, seed=7)
    for dst in FLOATS + INTS + [np.complex64, np.complex128]:
        _check(lambda v, d=dst: v.astype(d), x)  # refused (float -> int, ...) or exact
    if np.issubdtype(np.dtype(src), np.integer) and np.dtype(src) != np.uint64:
        assert _check(lambda v: v.astype(np.float32), x)
        assert _check(lambda v: v.astype(np.float64), x)
    if src == np.float32:
        assert _check(lambda v: v.astype(np.float16), _no_denormal(x))
        assert _check(lambda v: v.astype(ml_dtypes.bfloat16), _no_denormal(x))
        assert _check(lambda v: v.astype(np.float64), _no_denormal(x))


@pytest.mark.parametrize("dt", [np.float32, ml_dtypes.bfloat16, np.int64, np.bool_,
                                np.complex64, np.uint8], ids=lambda d: np.dtype(d).name)
def test_data_movement(dt):
    x = _specials(dt, n=24, seed=8).reshape(2, 3, 4)
    cases = [
        lambda v: v.transpose(2, 0, 1), lambda v: v[:, 1:3, ::2], lambda v: v[::-1, :, ::-1],
        lambda v: v.reshape(6, 4), lambda v: v[None, :, 0], lambda v: jnp.squeeze(v[:1]),
        lambda v: jnp.broadcast_to(v[:, :1], (2, 3, 4)),
        lambda v: jnp.concatenate([v, v[:1]], 0), lambda v: jnp.stack([v, v], -1),
        lambda v: jax.lax.dynamic_slice(v, (1, 2, 1), (1, 1, 2)),
        lambda v: jax.lax.dynamic_slice(v, (5, -3, 1), (1, 2, 2)),  # clamped
        lambda v: jax.lax.dynamic_update_slice(v, v[:1, :1], (1, 7, 2)),
        lambda v: jnp.split(v, [1, 3], axis=2),
        lambda v: jnp.where(jnp.arange(4) > 1, v, v[:, :, ::-1]),
    ]
    for f in cases:
        assert _check(f, x)
    if dt in (np.float32, np.int64, np.uint8):
        assert _check(lambda v: jax.lax.bitcast_convert_type(v, np.uint8), x)
        assert _check(lambda v: jax.lax.bitcast_convert_type(
            jax.lax.bitcast_convert_type(v, np.uint8), v.dtype), x)
    if dt == np.complex64:
        assert _check(lambda v: (jnp.real(v), jnp.imag(v)), x)
        assert _check(lambda v: jax.lax.complex(jnp.real(v), jnp.imag(v)[::-1]), x)


def test_what_xla_would_rewrite_is_refused():
    x = np.array([-0.0, 0.0, 1.5, np.nan], np.float32)
    # XLA folds x + 0 into x: -0.0 stays -0.0 there (IEEE gives +0.0)
    assert not _check(lambda v: v + 0.0, x)
    assert not _check(lambda v: v / 3.0, x)  # x * (1/3) after XLA's rewrite
    # a multiply feeding an add is contracted into an FMA in the optimized program
    assert not _check(lambda a, b: a * b + a, x, x)
    # float16 chains are kept in float32 (excess precision)
    h = np.array([1.0, 2.0, 3.0], np.float16)
    assert not _check(lambda a: (a * a) * a, h)
    # not evaluated at all: transcendental functions, integer division, complex products
    assert not _check(jnp.sin, x)
    assert not _check(lambda a: a // 3, np.arange(5))
    c = np.array([1 + 2j], np.complex64)
    assert not _check(lambda a: a * a, c)


def test_first_calls_on_the_host_equal_the_compiled_program(monkeypatch):
    """A strict program's first call runs on the host (a budget of ~0 s: the next call is
    compiled); both equal CPU eager, bit for bit (special values included)."""
    import lazyrt
    from lazyrt import metrics

    monkeypatch.setattr(consts, "COLD_SECONDS", 1e-9)
    with lazyrt.set_mode("strict"):
        _host_then_compiled(metrics)


def _host_then_compiled(metrics):
    x = torch.tensor([0.0, -0.0, 1.5, -2.25, float("nan"), float("inf"), -float("inf"),
                      3e38, -1e-3, 7.0])
    y = torch.tensor([1.0, 2.0, -0.0, 0.5, 1.0, 2.0, float("inf"), 10.0, 3.0, -7.0])
    ops = [lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a - b, lambda a, b: a / b,
           lambda a, b: a > b, lambda a, b: torch.where(a > b, a, b),
           lambda a, b: torch.isclose(a, b), lambda a, b: a.t() if a.dim() > 1 else a[2:7:2],
           lambda a, b: a.to(torch.float16), lambda a, b: (a.abs(), -b),
           lambda a, b: a.isnan()]
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        a, b = x.to(dt), y.to(dt)
        ta, tb = a.to("tpu"), b.to("tpu")
        before = metrics.counters()
        for op in ops:
            want = op(a, b)
            for _ in range(3):
                got = op(ta, tb)
                got = got if isinstance(got, tuple) else (got,)
                exp = want if isinstance(want, tuple) else (want,)
                for g, e in zip(got, exp):
                    torch.testing.assert_close(g.cpu(), e, equal_nan=True, rtol=0, atol=0)
        after = metrics.counters()
        # both paths ran: programs on the host first, then compiled
        assert after["host_runs"] > before["host_runs"]
        assert after["cache_misses"] > before["cache_misses"]


@pytest.mark.parametrize("seed", [0, 1, 2**40 + 5, -3])
def test_threefry_random_bits_as_jax(seed):
    """JAX's default PRNG (threefry2x32, partitionable) on the host: keys from seeds,
    splits, bits of each width, and the integer arithmetic of ``randint``."""
    s64 = np.int64(seed)
    for shape in [(3,), (2, 5), (7,), ()]:
        for dt in (jnp.uint8, jnp.uint16, jnp.uint32, jnp.uint64):
            assert _check(lambda s, d=dt, sh=shape: jax.random.bits(jax.random.key(s), sh, d), s64)
        assert _check(lambda s, sh=shape: jax.random.randint(
            jax.random.split(jax.random.key(s))[1], sh, -5, 1000, jnp.int64), s64)
        assert _check(lambda s, sh=shape: jax.random.randint(
            jax.random.key(s), sh, 0, 2**40, jnp.int64), s64)
        assert _check(lambda s, sh=shape: jax.random.randint(
            jax.random.key(s), sh, -2**31, 2**31 - 1, jnp.int32), np.int32(seed % 2**31))
    assert _check(lambda s: jax.random.key_data(jax.random.split(jax.random.key(s), (2, 3))), s64)


@pytest.mark.parametrize("dt", [np.int8, np.int32, np.int64, np.uint16, np.uint32],
                         ids=lambda d: np.dtype(d).name)
def test_shifts_and_unsigned_division(dt):
    bits = 8 * np.dtype(dt).itemsize
    signed = np.dtype(dt).kind == "i"
    a = np.array([1, -1 if signed else 3, 5, 100, 7, np.iinfo(dt).min, np.iinfo(dt).max], dt)
    for c in (np.array([0, 1, 3, 7, 100, 2, 1], dt),
              np.array([bits, -1 if signed else 99, 2, bits - 1, 0, bits + 3, 1], dt)):
        assert _check(jax.lax.shift_left, a, c)
        assert _check(jax.lax.shift_right_logical, a, c)
        assert _check(jax.lax.shift_right_arithmetic, a, c) == signed
        # XLA's division by zero (all ones, and x % 0 == x) for unsigned; signed: compiled
        assert _check(jax.lax.div, a, c) == (not signed)
        assert _check(jax.lax.rem, a, c) == (not signed)


def test_a_refused_view_program_does_not_refuse_other_views(monkeypatch):
    """Refusals are remembered per program kind, static arguments included: a view chain
    the host cannot evaluate (``diagonal``: a gather) does not send every other view
    program of the dtype to the compiler (it did: PyTorch's ``test_view_ops`` compiled
    1,468 view programs)."""
    import lazyrt
    from lazyrt._ops import control

    monkeypatch.setattr(consts, "COLD_SECONDS", 1e9)  # calls decide, not the load
    monkeypatch.setattr(consts, "_REFUSED", set())
    control.invalidate_compiled()
    x = torch.randn(6, 8)
    t = x.to("tpu")
    lazyrt.sync()
    lazyrt.metrics.reset()
    with lazyrt.set_mode("strict"):
        t.diagonal().cpu()  # refused: compiled
        for i in range(consts.COLD_CALLS):
            assert torch.equal(t[1:4].t().cpu(), x[1:4].t())
            assert torch.equal(t[i % 5].cpu(), x[i % 5])
    c = lazyrt.metrics.counters()
    assert c["host_runs"] >= 2 * consts.COLD_CALLS
    assert c["compiles_by_op"] == {"view": 1}  # the diagonal's

"""complex32 (``torch.chalf``) on tpu, and float16/bfloat16 arithmetic with a Python scalar,
each bit for bit against PyTorch CPU eager, in strict and defer."""
from __future__ import annotations

import warnings

import pytest
import torch
from _util import to_tpu

C32 = torch.complex32


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="ComplexHalf support is experimental")
        warnings.filterwarnings("ignore", message="Casting complex values to real")
        yield


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Values comparable bit for bit (NaNs equal): complex32 and float16 through float32."""
    t = t.detach().cpu()
    if t.dtype == C32:
        t = torch.view_as_real(t.to(torch.complex64))
    elif t.dtype in (torch.float16, torch.bfloat16):
        t = t.float()
    return t


def assert_same(actual, expected):
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.stride() == expected.stride(), (actual.stride(), expected.stride())
    a, e = _bits(actual), _bits(expected)
    same = (a == e) | (a.isnan() & e.isnan()) if a.is_floating_point() else a == e
    assert bool(same.all()), f"{int((~same).sum())} of {same.numel()} elements differ"


def _c32(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, dtype=torch.complex64, generator=g) * 3).to(C32)


# the ops PyTorch's CPU kernels take complex32 for
C32_OPS = {
    "add": lambda x: x + x * 2,
    "sub_scalar": lambda x: x - 1.7,
    "mul": lambda x: x * x,
    "mul_scalar": lambda x: x * 1.3,
    "mul_complex_scalar": lambda x: x * (0.3 - 1.1j),
    "neg": lambda x: -x,
    "abs": lambda x: x.abs(),
    "sgn": lambda x: x.sgn(),
    "eq": lambda x: x == x * 2,
    "isnan_isfinite": lambda x: torch.stack([x.isnan(), x.isfinite(), x.isreal()]),
    "cat": lambda x: torch.cat([x, x[:2]]),
    "stack": lambda x: torch.stack([x, x], 1),
    "where": lambda x: torch.where(x.real > 0, x, x * 2),
    "masked_fill": lambda x: x.masked_fill(x.real > 0, 1.1 + 2.2j),
    "fill": lambda x: x.clone().fill_(1.3 + 2.1j),
    "index": lambda x: x[[0, 2]],
    "index_select": lambda x: x.index_select(0, torch.tensor([3, 0], device=x.device)),
    "transpose_contig": lambda x: x.t().contiguous(),
    "strided_clone": lambda x: x[1:4, ::2].clone(),
    "real_imag": lambda x: torch.stack([x.real, x.imag]),
    "view_as_real": lambda x: torch.view_as_real(x),
    "to_complex64": lambda x: x.to(torch.complex64),
    "to_float32": lambda x: x.to(torch.float32),
    "to_int64": lambda x: x.to(torch.int64),
    "from_complex64": lambda x: (x.to(torch.complex64) * 1.001).to(C32),
    "from_float32": lambda x: (x.real.float() * 1.001).to(C32),
    "from_half": lambda x: x.real.to(C32),
    "half_plus_complex": lambda x: x.real + (1.3 + 0.7j),
    "copy_into": lambda x: torch.empty(x.shape, dtype=C32, device=x.device).copy_(x.to(torch.complex64) * 1.001),
    "mul_out": lambda x: torch.mul(x, x, out=torch.empty_like(x)),
    "view_as_real_write": lambda x: _write(
        x, lambda y: torch.view_as_real(y).add_(torch.ones(2, dtype=torch.float16, device=x.device))),
    "real_write": lambda x: _write(x, lambda y: y.real.fill_(3.3)),
}


def _write(x, f):
    y = x.clone()
    f(y)
    return y


@pytest.mark.parametrize("name", list(C32_OPS))
def test_complex32_ops(mode, name):
    c = _c32(6, 4)
    f = C32_OPS[name]
    assert_same(f(to_tpu(c)), f(c))


@pytest.mark.parametrize("dst", [torch.int32, torch.float32, torch.float16, torch.int16, torch.uint8,
                                 torch.bfloat16, torch.complex64, torch.int64])
def test_complex32_view_dtype(mode, dst):
    c = _c32(4, 4)
    t = to_tpu(c)
    v = t.view(dst)
    assert v.data_ptr() == t.data_ptr()
    assert_same(v, c.view(dst))
    assert_same(v.view(C32), c.view(dst).view(C32))
    assert_same(t[1, 1].view(torch.int32), c[1, 1].view(torch.int32))


def test_complex32_storage_and_factories(mode):
    c = _c32(3, 5)
    t = to_tpu(c)
    assert (t.element_size(), t.nbytes, t.untyped_storage().nbytes()) == \
        (c.element_size(), c.nbytes, c.untyped_storage().nbytes())
    assert t[1, 2].item() == c[1, 2].item()
    assert t.tolist() == c.tolist()
    for f in (lambda d: torch.ones(3, dtype=C32, device=d), lambda d: torch.zeros(2, 2, dtype=C32, device=d),
              lambda d: torch.full((2,), 1.1 + 2.2j, dtype=C32, device=d),
              lambda d: torch.tensor([1.1 + 2.2j, 3.3], dtype=C32, device=d)):
        assert_same(f("tpu"), f("cpu"))


def test_complex32_view_of_other_dtype_writes_through(mode):
    c = torch.randn(4, 6, dtype=torch.float16)
    t = to_tpu(c)
    t.view(C32).mul_(2)
    c.view(C32).mul_(2)
    assert_same(t, c)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["mul", "rmul", "mul_", "div", "div_", "add_alpha", "sub_alpha", "add", "sub"])
def test_reduced_float_with_scalar(mode, dtype, name):
    """ATen computes these in float32 with the scalar unrounded (mul, div) or alpha rounded
    to the dtype (add, sub), rounding once; jnp rounds the scalar first. (512 elements: the
    CPU's vectorized loop computes so; its scalar tail loop, for sizes not a multiple of
    the vector width, rounds ``alpha * b`` once more.)"""
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(512, generator=g) * 3).to(dtype)
    y = (torch.randn(512, generator=g) * 3).to(dtype)
    ops = {"mul": lambda a, b: a * 1.7, "rmul": lambda a, b: 0.3 * a, "div": lambda a, b: a / 1.3,
           "mul_": lambda a, b: a.clone().mul_(1.3), "div_": lambda a, b: a.clone().div_(0.7),
           "add_alpha": lambda a, b: torch.add(a, b, alpha=2.5), "sub_alpha": lambda a, b: torch.sub(a, b, alpha=0.1),
           "add": lambda a, b: a + 1.7, "sub": lambda a, b: a - 0.3}
    f = ops[name]
    assert_same(f(to_tpu(x), to_tpu(y)), f(x, y))


def test_complex32_program_is_not_complex64s(mode):
    """A complex32 op and the same op on complex64 have equal JAX avals (complex32 is held
    as complex64): the persistent cache must not hand complex32's program (which rounds to
    float16 parts) to complex64, nor the reverse."""
    c = torch.randn(37, dtype=torch.complex64) * 3
    for dt in (C32, torch.complex64, C32):
        x = c.to(dt)
        t = to_tpu(x)
        # complex32 bit for bit; complex64 within its own tolerance (XLA's complex product
        # may differ from the CPU's in the last bit), far tighter than a float16 rounding
        check = assert_same if dt == C32 else torch.testing.assert_close
        for f in (lambda v: v * v, lambda v: v + 1.3, lambda v: v.clone().fill_(0.1 + 0.7j)):
            r = f(t)
            assert r.dtype == dt
            check(r.cpu(), f(x))

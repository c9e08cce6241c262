"""Cases where tpu gave a value (or no error) where PyTorch CPU eager gives another value or
raises, each checked against CPU eager in strict and defer: float -> uint32/uint64/uint8
conversions out of range, integer pow to a negative power, normal with a negative std,
complex32 add/sub with alpha, reductions over more than 64 dims."""
from __future__ import annotations

import pytest
import torch

_NAN, _INF = float("nan"), float("inf")
_UVALS = (_NAN, _INF, -_INF, -1.5, -1.0, -0.5, 0.0, 0.7, 1.5, 255.9, 3e9, 4294967295.0, 2.0**31,
          -2.0**31, -2.0**31 - 1, -3e9, 2.0**32, 2.0**33 + 7, 5e9, 1e19, 2.0**63, -2.0**63, 2.0**64,
          1e20, -1e20, -4294967301.0, -70000.0, -300.0)


@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.float16, torch.bfloat16],
                         ids=str)
@pytest.mark.parametrize("dst", [torch.uint32, torch.uint64, torch.uint8], ids=str)
def test_float_to_unsigned_out_of_range(mode, src, dst):
    """Bit for bit as PyTorch's CPU converts (x86): uint64 and uint32 through the unsigned
    route (x >= 2**31 (2**63): x - 2**31 truncated, top bit flipped; x >= 2**32 and inf give
    0, NaN and x < -2**31 give 2**31); uint8 from float64 through int64. XLA saturated.
    (CPU's uint32 loop takes that route in its vectorized body; its scalar tail - the last
    len % 4 elements, a strided input - goes through int64: the length here is a multiple
    of 16, so CPU's every element takes the vectorized one.)"""
    x = torch.tensor(_UVALS, dtype=torch.float64).to(src).repeat(16)
    t = x.to("tpu")
    got, want = t.to(dst).cpu(), x.to(dst)
    assert got.dtype == want.dtype
    bad = [(float(x[i]), int(got[i]), int(want[i])) for i in range(len(_UVALS)) if got[i] != want[i]]
    assert not bad, bad
    assert torch.equal(got, want)
    out = torch.zeros(x.numel(), dtype=dst, device="tpu").copy_(t).cpu()
    assert torch.equal(out, torch.zeros(x.numel(), dtype=dst).copy_(x))


def _same_outcome(f):
    """``f(device)`` on CPU and tpu: the same values, or the same exception and message."""
    try:
        want = f("cpu")
    except Exception as ex:  # the CPU's exception is the expectation
        with pytest.raises(type(ex)) as got:
            r = f("tpu")
            if isinstance(r, torch.Tensor):
                r.cpu()
        assert str(got.value) == str(ex)
        return
    got = f("tpu").cpu()
    assert got.dtype == want.dtype and torch.equal(got, want), (got, want)


def _ints(d, dtype=torch.int64):
    return torch.tensor([-2, -1, 0, 1, 2, 3], dtype=dtype, device=d)


_POW = {
    "uint8_scalar": lambda d: _ints(d).to(torch.uint8) ** -1,
    "int64_pow": lambda d: _ints(d).pow(-2),
    "int32_torch_pow": lambda d: torch.pow(_ints(d, torch.int32), -3),
    "int8_out": lambda d: torch.pow(_ints(d, torch.int8), -1, out=torch.empty(6, dtype=torch.int8, device=d)),
    "bool": lambda d: (_ints(d) > 0).pow(-1),
    "inplace": lambda d: _ints(d).pow_(-1),
    "ipow": lambda d: _ipow(_ints(d, torch.int16)),
    # no error on CPU: a tensor exponent, a scalar base, a float exponent, exponent 0
    "tensor_exponent": lambda d: _ints(d).pow(_ints(d).flip(0)),
    "tensor_exponent_inplace": lambda d: _ints(d).pow_(torch.tensor(-1, device=d)),
    "scalar_base": lambda d: torch.pow(2, _ints(d)),
    "rpow": lambda d: 3 ** _ints(d, torch.int32),
    "float_exponent": lambda d: _ints(d).pow(-1.0),
    "zero": lambda d: _ints(d) ** 0,
}


def _ipow(x):
    x **= -2
    return x


@pytest.mark.parametrize("case", _POW)
def test_int_pow_negative_exponent(mode, case):
    """An integer tensor to a negative integer Python scalar: PyTorch's RuntimeError at the
    op (tpu computed 0/1/-1, as for a tensor exponent, which PyTorch takes)."""
    _same_outcome(_POW[case])

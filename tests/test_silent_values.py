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

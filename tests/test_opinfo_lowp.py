"""OpInfo gradients in bfloat16 and float16: tpu vs CPU autograd in the same dtype.

The entries: every autograd-capable ``op_db`` op of the float32 gradient sweep
(``test_opinfo.py``) whose CPU backward supports the dtype, once per dtype. The samples are
made in that dtype; CPU autograd and tpu autograd differentiate them with the same
cotangents (``randn`` rounded to each output's dtype) and every input gradient must match.

Tolerances (``TOL``), per dtype: ``rtol`` and ``atol * max(1, max |CPU gradient|)``.
bfloat16 keeps 8 significant bits (spacing 2**-7 = 7.8e-3 at 1), float16 11 (9.8e-4 at 1);
a gradient is rounded once per op of its backward on both sides, and the two sides round
at different places (XLA fuses, accumulates in float32 and rounds once; PyTorch's CPU
kernels round each op's result), so the bound is a few units in the last place relative to
the value (rtol) plus two relative to the gradient's largest element (atol, which covers
elements that are differences of larger ones).

Ops that pick one of several equal inputs (sort, topk, max over a dim, max pooling, ...:
``TIE_PICKS``) are ambiguous where low precision makes inputs equal: PyTorch leaves which
element is picked to the implementation, and the gradient goes to the one picked. Where
the input has repeated values, those gradients are compared per group of equal input values
(the sum over each group, which does not depend on the pick); elsewhere elementwise.

CI runs every ``LAZYRT_OPINFO_LOWP_EVERY``-th entry (default 11, odd so that both dtypes are sampled)
plus ``ALWAYS`` (the convolutions, whose backward once failed in low precision), with the
first sample (``LAZYRT_OPINFO_GRAD_SAMPLES``) in ``LAZYRT_OPINFO_GRAD_MODES`` (strict).
Full sweep: ``LAZYRT_OPINFO_LOWP_EVERY=1 python -m pytest -n 2 tests/test_opinfo_lowp.py``
(also run by ``tox -e full-opinfo``). Expected failures: ``XFAIL_GRAD_DTYPE`` (``id@dtype``) in ``opinfo_xfail.py``,
strict (float32's ``XFAIL_GRAD`` does not apply here).
"""
from __future__ import annotations

import os

import pytest
import torch
from opinfo_xfail import XFAIL, XFAIL_DTYPE, XFAIL_GRAD_DTYPE
from test_opinfo import (
    GRAD_MODES,
    GRAD_SAMPLES,
    RANDOM_OPS,
    _check_grad_sample,
    _id,
    _random_sample,
)
from torch.testing._internal.common_methods_invocations import op_db

import lazyrt

pytestmark = pytest.mark.sweep(every=4)

DTYPES = [getattr(torch, d) for d in
          os.environ.get("LAZYRT_OPINFO_LOWP_DTYPES", "bfloat16,float16").split(",")]
EVERY = int(os.environ.get("LAZYRT_OPINFO_LOWP_EVERY", "11"))
TOL = {torch.bfloat16: (3e-2, 1.6e-2), torch.float16: (4e-3, 2e-3)}
ALWAYS = {"nn.functional.conv2d", "nn.functional.conv_transpose2d"}

TIE_PICKS = {
    "sort", "msort", "topk", "kthvalue", "median", "nanmedian", "mode", "max.reduction_with_dim",
    "min.reduction_with_dim", "cummax", "cummin", "nn.functional.max_pool1d",
    "nn.functional.max_pool2d", "nn.functional.max_pool3d", "nn.functional.adaptive_max_pool1d",
    "nn.functional.adaptive_max_pool2d", "nn.functional.adaptive_max_pool3d",
}


def _entries():
    out = []
    k = -1
    for op in op_db:
        if not op.supports_autograd or torch.float32 not in op.supported_dtypes("cpu"):
            continue
        oid = _id(op)
        if oid in RANDOM_OPS or op.name in RANDOM_OPS:
            continue
        for dt in DTYPES:
            if dt not in op.supported_backward_dtypes("cpu"):
                continue
            k += 1
            if k % EVERY and oid not in ALWAYS:
                continue
            dname = str(dt).replace("torch.", "")
            for mode in GRAD_MODES:
                if oid in XFAIL or f"{oid}@{mode}" in XFAIL or f"{oid}@float32" in XFAIL_DTYPE:
                    marks = [pytest.mark.skip(reason="forward is an expected failure")]
                elif f"{oid}@{dname}" in XFAIL_GRAD_DTYPE:
                    marks = [pytest.mark.xfail(reason=XFAIL_GRAD_DTYPE[f"{oid}@{dname}"], strict=True)]
                else:
                    marks = []
                out.append(pytest.param(op, dt, mode, id=f"{oid}-{dname}-grad-{mode}", marks=marks))
    return out


def _group_sums(x, g):
    """Sums of ``g`` over each group of equal values of ``x`` (NaNs one group)."""
    key = torch.where(torch.isnan(x), torch.full_like(x, float("inf")), x).double().flatten()
    _, inv = torch.unique(key, return_inverse=True)
    return torch.zeros(int(inv.max()) + 1, dtype=torch.float64).index_add_(0, inv, g.double().flatten())


def _comparer(op, dtype):
    rtol, atol = TOL[dtype]
    picks = _id(op) in TIE_PICKS

    def compare(i, actual, expected, sample):
        assert actual.dtype == expected.dtype, f"grad of input {i}: dtype {actual.dtype} != {expected.dtype}"
        a, e = actual.double(), expected.double()
        finite = e[torch.isfinite(e)]
        scale = max(1.0, finite.abs().max().item()) if finite.numel() else 1.0
        x = sample.input
        if (picks and i == 0 and isinstance(x, torch.Tensor) and x.shape == e.shape
                and x.numel() != x.detach().unique().numel()):
            a, e = _group_sums(x.detach(), a), _group_sums(x.detach(), e)
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol * scale, equal_nan=True,
                                   msg=lambda m: f"grad of input {i} ({dtype}): {m}")

    return compare


@pytest.mark.parametrize("op,dtype,mode", _entries())
def test_opinfo_grad_lowp(op, dtype, mode):
    """The samples' gradients in ``dtype`` w.r.t. every float input match CPU autograd's."""
    lazyrt.metrics.reset()
    compare = _comparer(op, dtype)
    checked = 0
    for n, sample in enumerate(op.sample_inputs("cpu", dtype, requires_grad=True)):
        if GRAD_SAMPLES and n >= GRAD_SAMPLES:
            break
        if _random_sample(sample):
            continue
        try:
            checked += _check_grad_sample(op, sample, mode, compare)
        except Exception as e:
            e.add_note(f"(OpInfo sample {n} of {_id(op)}, {dtype})")
            raise
    if not checked:
        pytest.skip("no differentiable output")
    assert lazyrt.metrics.counters()["cpu_fallbacks"] == 0

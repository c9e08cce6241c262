"""PyTorch's own OpInfo database, run on tpu and compared with CPU eager.

For every ``op_db`` entry that supports float32: its sample inputs (the first
``LAZYRT_OPINFO_SAMPLES`` of them, default 3; 0 = all) run on CPU and on tpu, in
strict and in defer mode; outputs must match in shape, dtype and value. The
expected failures are listed, each with its reason, in ``opinfo_xfail.py``;
an entry there that passes fails the run (strict xfail), so the list only shrinks.

Full run: ``LAZYRT_OPINFO_SAMPLES=0 python -m pytest tests/test_opinfo.py -n 2``.
Other dtypes: ``LAZYRT_OPINFO_DTYPES=float32,bfloat16,int64``.
"""
from __future__ import annotations

import os

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

import lazyrt
from _util import assert_close, to_cpu, to_tpu
from opinfo_xfail import XFAIL, XFAIL_DTYPE

MAX_SAMPLES = int(os.environ.get("LAZYRT_OPINFO_SAMPLES", "3"))
DTYPES = [getattr(torch, d) for d in os.environ.get("LAZYRT_OPINFO_DTYPES", "float32").split(",")]

# Ops whose values are random: compare shapes and dtypes only.
RANDOM_OPS = {
    "bernoulli", "normal", "normal.number_mean", "rand_like", "randn_like", "randint_like",
    "randint", "multinomial", "nn.functional.dropout", "nn.functional.dropout2d",
    "nn.functional.dropout3d", "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
    "nn.functional.feature_alpha_dropout.with_train", "nn.functional.feature_alpha_dropout.without_train",
    "uniform", "exponential", "geometric", "log_normal", "cauchy", "randn", "rand", "randperm",
    "nn.functional.rrelu", "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided",
    "empty_permuted", "nn.functional.dropout.train", "nn.functional.multi_head_attention_forward",
    "torch.empty", "bernoulli.p",
}
# Tolerances per op (fp32) where XLA's math differs from PyTorch's within reason.
TOL = {
    "default": (1e-4, 1e-5),
}


def _id(op):
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def _ops():
    out = []
    for op in op_db:
        for dt in DTYPES:
            if dt not in op.supported_dtypes("cpu"):
                continue
            oid = _id(op)
            for mode in ("strict", "defer"):
                marks = []
                reason = XFAIL.get(oid) or XFAIL.get(f"{oid}@{mode}")
                if dt != torch.float32:
                    reason = reason or XFAIL_DTYPE.get(f"{oid}@{dt}".replace("torch.", ""))
                if reason:
                    marks.append(pytest.mark.xfail(reason=reason, strict=True))
                dname = str(dt).replace("torch.", "")
                out.append(pytest.param(op, dt, mode, id=f"{oid}-{dname}-{mode}", marks=marks))
    return out


def _tol(op, dtype):
    if dtype in (torch.bfloat16, torch.float16):
        return 2e-2, 2e-2
    return TOL.get(_id(op), TOL["default"])


@pytest.mark.parametrize("op,dtype,mode", _ops())
def test_opinfo(op, dtype, mode):
    samples = op.sample_inputs("cpu", dtype, requires_grad=False)
    rtol, atol = _tol(op, dtype)
    check_values = _id(op) not in RANDOM_OPS and op.name not in RANDOM_OPS
    lazyrt.metrics.reset()
    n = 0
    with lazyrt.set_mode(mode):
        for sample in samples:
            if MAX_SAMPLES and n >= MAX_SAMPLES:
                break
            n += 1
            args = (sample.input,) + tuple(sample.args)
            try:
                expected = op(*args, **sample.kwargs)
            except Exception as e:  # a sample CPU rejects: tpu must reject it too
                with pytest.raises(type(e)):
                    out = op(*to_tpu(args), **to_tpu(sample.kwargs))
                    to_cpu(out)
                continue
            actual = op(*to_tpu(args), **to_tpu(sample.kwargs))
            actual = to_cpu(actual)
            assert_close(actual, to_cpu(expected), rtol=rtol, atol=atol, check_values=check_values)
    assert lazyrt.metrics.counters()["cpu_fallbacks"] == 0

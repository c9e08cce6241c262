"""OpInfo under ``torch.compile`` on tpu: each float32 entry's first sample, compiled with
the ``"tpu"`` backend, against CPU eager (values, shapes, dtypes).

CI runs every ``LAZYRT_OPINFO_COMPILE_EVERY``-th entry (default 25) in strict mode; the
slow run (``-m slow``) every entry in strict and defer. Entries that fail in eager are
``opinfo_xfail``'s business and skipped here; the ones that fail only under compile are
listed in ``XFAIL_COMPILE`` with their reason (strict xfail: the list only shrinks).
"""
from __future__ import annotations

import os

import pytest
import torch
from _util import assert_close, to_cpu, to_tpu
from opinfo_xfail import XFAIL, XFAIL_DTYPE
from test_opinfo import RANDOM_OPS, _id, _to_tpu_args, _tol
from torch.testing._internal.common_methods_invocations import op_db

import lazyrt

pytestmark = pytest.mark.sweep(every=2)

EVERY = int(os.environ.get("LAZYRT_OPINFO_COMPILE_EVERY", "25"))

# entry -> why it fails under torch.compile only
XFAIL_COMPILE: dict[str, str] = {}


def _cases(slow: bool):
    out = []
    k = -1
    for op in op_db:
        if torch.float32 not in op.supported_dtypes("cpu"):
            continue
        k += 1
        oid = _id(op)
        sampled = k % EVERY == 0
        for mode in ("strict", "defer"):
            in_ci = sampled and mode == "strict"
            if in_ci == slow:
                continue
            marks = [pytest.mark.slow] if slow else []
            if oid in XFAIL or f"{oid}@{mode}" in XFAIL or f"{oid}@float32" in XFAIL_DTYPE:
                marks.append(pytest.mark.skip(reason="an expected failure in eager"))
            elif oid in XFAIL_COMPILE:
                marks.append(pytest.mark.xfail(reason=XFAIL_COMPILE[oid], strict=True))
            out.append(pytest.param(op, mode, id=f"{oid}-{mode}", marks=marks))
    return out


def _check(op, mode):
    torch._dynamo.reset()
    sample = next(iter(op.sample_inputs("cpu", torch.float32, requires_grad=False)))
    args = (sample.input,) + tuple(sample.args)
    try:
        expected = op(*args, **sample.kwargs)
    except Exception:
        pytest.skip("CPU rejects the first sample")
    check_values = _id(op) not in RANDOM_OPS and op.name not in RANDOM_OPS
    rtol, atol = _tol(op, torch.float32)

    def fn(*a, **kw):
        return op(*a, **kw)

    with lazyrt.set_mode(mode):
        compiled = torch.compile(fn, backend="tpu")
        actual = to_cpu(compiled(*_to_tpu_args(op, args), **to_tpu(sample.kwargs)))
    assert_close(actual, to_cpu(expected), rtol=rtol, atol=atol, check_values=check_values)
    torch._dynamo.reset()


@pytest.mark.parametrize("op,mode", _cases(slow=False))
def test_opinfo_compiled(op, mode):
    _check(op, mode)


@pytest.mark.parametrize("op,mode", _cases(slow=True))
def test_opinfo_compiled_all(op, mode):
    _check(op, mode)

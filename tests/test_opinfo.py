"""PyTorch's own OpInfo database, run on tpu and compared with CPU eager.

For every ``op_db`` entry that supports float32: its sample inputs (the first
``LAZYRT_OPINFO_SAMPLES`` of them, default 3; 0 = all) run on CPU and on tpu, in
strict and in defer mode; outputs must match in shape, dtype and value. The
expected failures are listed, each with its reason, in ``opinfo_xfail.py``;
an entry there that passes fails the run (strict xfail), so the list only shrinks.

Gradients: the samples of every autograd-capable op (every 4th op in CI) must give the
same input gradients as CPU autograd: the first ``LAZYRT_OPINFO_GRAD_SAMPLES`` of them
(default: ``LAZYRT_OPINFO_SAMPLES`` when that is set, else 1; 0 = all).

Full run: ``LAZYRT_OPINFO_SAMPLES=0 LAZYRT_OPINFO_GRAD_EVERY=1
LAZYRT_OPINFO_GRAD_MODES=strict,defer python -m pytest tests/test_opinfo.py -n 2``.
Other dtypes: ``LAZYRT_OPINFO_DTYPES=float32,bfloat16,int64``.
"""
from __future__ import annotations

import os

import pytest
import torch
from _util import assert_close, to_cpu, to_tpu
from opinfo_xfail import XFAIL, XFAIL_ALL_SAMPLES, XFAIL_DTYPE, XFAIL_GRAD, XFAIL_GRAD_ALL_SAMPLES
from torch.testing._internal.common_methods_invocations import op_db

import lazyrt

MAX_SAMPLES = int(os.environ.get("LAZYRT_OPINFO_SAMPLES", "2"))
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
    # draw their window offsets with torch.rand on the device (values checked with given
    # offsets in tests/test_lowerings_extra.py)
    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
}
# Tolerances per op (fp32) where XLA's math differs from PyTorch's within reason.
TOL = {
    "default": (1e-4, 1e-5),
}


# Sample arguments PyTorch requires on the CPU (OpInfo makes them there whatever the
# device under test): op id -> positions in (input, *args) left on the CPU.
CPU_ARGS = {"tensor_split": (1,)}


def _to_tpu_args(op, args):
    keep = CPU_ARGS.get(_id(op), ())
    return tuple(a if i in keep else to_tpu(a) for i, a in enumerate(args))


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
                if MAX_SAMPLES == 0 or MAX_SAMPLES > 2:
                    reason = reason or XFAIL_ALL_SAMPLES.get(oid)
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


GRAD_MODES = os.environ.get("LAZYRT_OPINFO_GRAD_MODES", "strict").split(",")
# CI checks the gradients of every 4th autograd op (a fixed sample); 1 = all of them.
GRAD_EVERY = int(os.environ.get("LAZYRT_OPINFO_GRAD_EVERY", "4"))
# Samples per op whose gradients are checked (CI: the first one; 0 = all).
GRAD_SAMPLES = int(os.environ.get("LAZYRT_OPINFO_GRAD_SAMPLES",
                                  os.environ.get("LAZYRT_OPINFO_SAMPLES", "1")))


def _grad_ops():
    out = []
    k = -1
    for op in op_db:
        if not op.supports_autograd or torch.float32 not in op.supported_dtypes("cpu"):
            continue
        k += 1
        if k % GRAD_EVERY:
            continue
        oid = _id(op)
        if oid in RANDOM_OPS or op.name in RANDOM_OPS:
            continue
        for mode in GRAD_MODES:
            if oid in XFAIL or f"{oid}@{mode}" in XFAIL or f"{oid}@float32" in XFAIL_DTYPE:
                marks = [pytest.mark.skip(reason="forward is an expected failure")]
            elif oid in XFAIL_GRAD:
                marks = [pytest.mark.xfail(reason=XFAIL_GRAD[oid], strict=True)]
            elif GRAD_SAMPLES != 1 and oid in XFAIL_GRAD_ALL_SAMPLES:
                marks = [pytest.mark.xfail(reason=XFAIL_GRAD_ALL_SAMPLES[oid], strict=True)]
            else:
                marks = []
            out.append(pytest.param(op, mode, id=f"{oid}-grad-{mode}", marks=marks))
    return out


def _flat_tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _flat_tensors(v)]
    return []


def _check_grad_sample(op, sample, mode) -> bool:
    """Gradients of one sample on tpu vs CPU autograd; False if nothing to differentiate."""
    args = (sample.input,) + tuple(sample.args)
    inputs = [t for t in _flat_tensors(args) + _flat_tensors(list(sample.kwargs.values()))
              if t.requires_grad]
    try:
        out = op(*args, **sample.kwargs)
    except Exception:  # a sample CPU rejects: the forward sweep checks tpu rejects it too
        return False
    outs = [o for o in _flat_tensors(out) if o.requires_grad and o.dtype.is_floating_point]
    if not outs or not inputs:
        return False
    g = torch.Generator().manual_seed(0)
    cots = [torch.randn(o.shape, generator=g) for o in outs]
    ref = torch.autograd.grad(outs, inputs, cots, allow_unused=True)
    with lazyrt.set_mode(mode):
        targs = _to_tpu_args(op, args)
        tkw = to_tpu(sample.kwargs)
        tinputs = [t for t in _flat_tensors(targs) + _flat_tensors(list(tkw.values()))
                   if t.requires_grad]
        tout = op(*targs, **tkw)
        touts = [o for o in _flat_tensors(tout) if o.requires_grad and o.dtype.is_floating_point]
        got = torch.autograd.grad(touts, tinputs, [c.to("tpu") for c in cots], allow_unused=True)
        got = [None if x is None else x.cpu() for x in got]
    for i, (a, b) in enumerate(zip(got, ref)):
        if b is None:
            continue
        assert a is not None, f"grad {i} missing"
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4, equal_nan=True,
                                   msg=lambda m, i=i: f"grad of input {i}: {m}")
    return True


@pytest.mark.parametrize("op,mode", _grad_ops())
def test_opinfo_grad(op, mode):
    """The samples' gradients w.r.t. every float input match CPU autograd."""
    lazyrt.metrics.reset()
    checked = 0
    for n, sample in enumerate(op.sample_inputs("cpu", torch.float32, requires_grad=True)):
        if GRAD_SAMPLES and n >= GRAD_SAMPLES:
            break
        try:
            checked += _check_grad_sample(op, sample, mode)
        except Exception as e:
            e.add_note(f"(OpInfo sample {n} of {_id(op)})")
            raise
    if not checked:
        pytest.skip("no differentiable output")
    assert lazyrt.metrics.counters()["cpu_fallbacks"] == 0


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
                    out = op(*_to_tpu_args(op, args), **to_tpu(sample.kwargs))
                    to_cpu(out)
                continue
            actual = op(*_to_tpu_args(op, args), **to_tpu(sample.kwargs))
            actual = to_cpu(actual)
            assert_close(actual, to_cpu(expected), rtol=rtol, atol=atol, check_values=check_values)
    assert lazyrt.metrics.counters()["cpu_fallbacks"] == 0

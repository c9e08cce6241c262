"""PyTorch's own OpInfo database, run on tpu and compared with CPU eager.

For every ``op_db`` entry that supports float32: its sample inputs (the first
``LAZYRT_OPINFO_SAMPLES`` of them, default 3; 0 = all) run on CPU and on tpu, in
strict and in defer mode; outputs must match in shape, dtype and value. The
expected failures are listed, each with its reason, in ``opinfo_xfail.py``;
an entry there that passes fails the run (strict xfail), so the list only shrinks.
The default run samples the entries (``@pytest.mark.sweep``: one in 20, chosen by a stable
hash: a tenth of the ops, each in strict or in defer); ``-m slow`` runs the rest.

Gradients: the samples of every autograd-capable op (every 4th op; a quarter of those by
default, the rest with ``-m slow``) must give the same input gradients as CPU autograd: the first
``LAZYRT_OPINFO_GRAD_SAMPLES`` of them (default: ``LAZYRT_OPINFO_SAMPLES`` when that is
set, else 1; 0 = all).

Full run: ``LAZYRT_OPINFO_SAMPLES=0 LAZYRT_OPINFO_GRAD_EVERY=1
LAZYRT_OPINFO_GRAD_MODES=strict,defer python -m pytest tests/test_opinfo.py -n 2 -m ''``.
Other dtypes: ``LAZYRT_OPINFO_DTYPES=float32,bfloat16,int64``.
"""
from __future__ import annotations

import contextlib
import os

import pytest
import torch
from _util import assert_close, to_cpu, to_tpu
from opinfo_xfail import XFAIL, XFAIL_ALL_SAMPLES, XFAIL_DTYPE, XFAIL_GRAD, XFAIL_GRAD_ALL_SAMPLES
from torch.testing._internal.common_methods_invocations import op_db

import lazyrt

MAX_SAMPLES = int(os.environ.get("LAZYRT_OPINFO_SAMPLES", "2"))
DTYPES = [getattr(torch, d) for d in os.environ.get("LAZYRT_OPINFO_DTYPES", "float32").split(",")]

# Ops whose values are random: compare shapes and dtypes only (so are the samples of
# ``_random_sample``; their gradients are not compared).
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


def _random_sample(sample) -> bool:
    """A sample of a deterministic op that draws random numbers (SDPA with dropout)."""
    return bool(sample.kwargs.get("dropout_p"))


# Tolerances per op (fp32) where XLA's math differs from PyTorch's within reason.
TOL = {
    "default": (1e-4, 1e-5),
    # PyTorch's own OpInfo tolerance for float32 (toleranceOverride atol=5e-5, TestCommon)
    "nn.functional.scaled_dot_product_attention": (1e-4, 5e-5),
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


# Outputs PyTorch defines only up to a gauge (an eigen- or singular vector's sign or phase,
# the basis of a null space): compared in what the op defines (values, the matrix the
# factors rebuild, orthonormal factors), as PyTorch's own linalg tests do.
FACTORIZATIONS = {"linalg.eigh", "svd", "linalg.svd", "svd_lowrank", "pca_lowrank"}
# Randomized ops whose draws are ``torch.randn`` calls in Python: the CPU run replays the
# tpu run's draws (``_RandnTape``), so the result is checked exactly, not just its shape.
REPLAYED_RANDOM = {"svd_lowrank", "pca_lowrank"}
# Ops whose non-CPU semantics differ from CPU's by PyTorch's design: the CPU result is
# mapped to what PyTorch's other devices (CUDA, and its meta kernels) return.
NON_CPU = {}


def _batch_norm_non_cpu(expected, args):
    # eval mode: CPU returns empty save_mean/save_invstd; CUDA and the meta kernel return
    # the running mean and 1/sqrt(running_var + eps) (torch._decomp's native_batch_norm)
    if len(args) < 8:  # the no_stats overload: always training
        return expected
    training, eps = args[5], args[7]
    if training:
        return expected
    mean, var = args[3], args[4]
    return (expected[0], mean.float().clone(), torch.rsqrt(var.float() + eps)) + tuple(expected[3:])


def _stats_in_float(first, last=None):
    # reduced-precision input: CPU returns the saved statistics in the input's dtype; CUDA
    # and the meta kernels (torch._refs) in float32
    def f(expected, args):
        if args[0].dtype not in (torch.bfloat16, torch.float16):
            return expected
        stats = tuple(t.float() for t in expected[first:last])
        return tuple(expected[:first]) + stats + tuple(expected[last:] if last else ())
    return f


def _batch_norm(expected, args):
    return _stats_in_float(1, 3)(_batch_norm_non_cpu(expected, args), args)


NON_CPU["native_batch_norm"] = NON_CPU["_native_batch_norm_legit"] = _batch_norm
NON_CPU["native_layer_norm"] = _stats_in_float(1)
NON_CPU["_batch_norm_with_update"] = _stats_in_float(1, 3)


class _RandnTape:
    """Records the values ``torch.randn`` returns in one run, and returns them again, in
    order and on the caller's device, in the next."""

    def __init__(self):
        self.draws = []

    def _patched(self, fn):
        real = torch.randn
        torch.randn = fn
        try:
            yield
        finally:
            torch.randn = real

    @contextlib.contextmanager
    def record(self):
        real = torch.randn

        def randn(*a, **k):
            r = real(*a, **k)
            self.draws.append(r.detach().cpu())
            return r

        yield from self._patched(randn)

    @contextlib.contextmanager
    def replay(self):
        draws = iter(self.draws)

        def randn(*a, device=None, **k):
            r = next(draws)
            return r.to(device) if device is not None else r

        yield from self._patched(randn)


# Ops that return indices of equal values in an order PyTorch leaves to the implementation
# (unless ``stable=True``): each index must point at the value CPU's points at.
TIE_ORDER = {"sort", "argsort", "topk", "kthvalue"}


def _tie_dim(oid, sample):
    a, kw = sample.args, sample.kwargs
    if oid in ("sort", "argsort"):
        return kw.get("dim", a[0] if a else -1), True
    keep = oid == "topk" or (a[2] if len(a) > 2 else kw.get("keepdim", False))
    return (a[1] if len(a) > 1 else kw.get("dim", -1)), keep


def _compare_ties(oid, sample, actual, expected, rtol, atol):
    actual, expected = to_cpu(actual), to_cpu(expected)
    assert_close(actual, expected, check_values=False)
    x = sample.input
    dim, keep = _tie_dim(oid, sample)

    def picked(idx):
        if x.dim() == 0:
            return x.expand(idx.shape)
        return torch.take_along_dim(x, idx if keep else idx.unsqueeze(dim), dim)

    if oid == "argsort":
        actual, expected = (actual,), (expected,)
    else:
        assert_close(actual[0], expected[0], rtol, atol, path="values")
    assert_close(picked(actual[-1]), picked(expected[-1]), rtol, atol,
                 path="the values at the indices")


def _orthonormal(q, path):
    eye = torch.eye(q.shape[-1], dtype=q.dtype).expand(q.mH.shape[:-1] + (q.shape[-1],))
    torch.testing.assert_close(q.mH @ q, eye, rtol=0, atol=1e-4,
                               msg=lambda m: f"{path}: columns not orthonormal: {m}")


def _compare_factorization(oid, actual, expected, rtol, atol):
    actual, expected = to_cpu(actual), to_cpu(expected)
    assert_close(actual, expected, check_values=False)
    if oid == "linalg.eigh":
        (wa, qa), (we, qe) = actual, expected
        assert_close(wa, we, rtol, atol, path="eigenvalues")
        parts = [(qa, wa, qa), (qe, we, qe)]
        vectors = (("eigenvectors", qa),)
    else:
        (ua, sa, va), (ue, se, ve) = actual, expected
        if oid == "linalg.svd":
            va, ve = va.mH, ve.mH
        assert_close(sa, se, rtol, atol, path="singular values")
        if not ue.abs().sum() and not ve.abs().sum():  # torch.svd(compute_uv=False)
            assert_close((ua, va), (ue, ve), rtol, atol)
            return
        k = se.shape[-1]
        parts = [(ua[..., :k], sa, va[..., :k]), (ue[..., :k], se, ve[..., :k])]
        vectors = (("U", ua), ("V", va))
    (l1, d1, r1), (l2, d2, r2) = parts
    scale = 1 + (d2.abs().max().item() if d2.numel() else 0)
    assert_close((l1 * d1.unsqueeze(-2).to(l1.dtype)) @ r1.mH,
                 (l2 * d2.unsqueeze(-2).to(l2.dtype)) @ r2.mH, rtol, atol * scale,
                 path="the factors' product")
    for name, q in vectors:
        if q.numel():
            _orthonormal(q, name)


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


def _assert_grad_close(i, actual, expected, sample):
    torch.testing.assert_close(actual, expected, rtol=1e-3, atol=1e-4, equal_nan=True,
                               msg=lambda m: f"grad of input {i}: {m}")


def _check_grad_sample(op, sample, mode, compare=_assert_grad_close) -> bool:
    """Gradients of one sample on tpu vs CPU autograd, both in the sample's dtypes, compared
    by ``compare(i, tpu_grad, cpu_grad, sample)``; False if nothing to differentiate."""
    args = (sample.input,) + tuple(sample.args)
    inputs = [t for t in _flat_tensors(args) + _flat_tensors(list(sample.kwargs.values()))
              if t.requires_grad]
    # the sample's own gauge-invariant view of the outputs (PyTorch's gradcheck uses it)
    post = sample.output_process_fn_grad

    def tpu_forward():
        with lazyrt.set_mode(mode):
            targs = _to_tpu_args(op, args)
            tkw = to_tpu(sample.kwargs)
            tinputs = [t for t in _flat_tensors(targs) + _flat_tensors(list(tkw.values()))
                       if t.requires_grad]
            return tinputs, post(op(*targs, **tkw))

    tape = _RandnTape() if _id(op) in REPLAYED_RANDOM else None
    if tape is not None:  # the tpu run draws, the CPU run replays its draws
        with tape.record():
            tinputs, tout = tpu_forward()
        with tape.replay():
            out = post(op(*args, **sample.kwargs))
    else:
        try:
            out = post(op(*args, **sample.kwargs))
        except Exception:  # a sample CPU rejects: the forward sweep checks tpu rejects it too
            return False
        tinputs = tout = None
    outs = [o for o in _flat_tensors(out) if o.requires_grad and o.dtype.is_floating_point]
    if not outs or not inputs:
        return False
    g = torch.Generator().manual_seed(0)
    cots = [torch.randn(o.shape, generator=g).to(o.dtype) for o in outs]
    ref = torch.autograd.grad(outs, inputs, cots, allow_unused=True)
    if tout is None:
        tinputs, tout = tpu_forward()
    with lazyrt.set_mode(mode):
        touts = [o for o in _flat_tensors(tout) if o.requires_grad and o.dtype.is_floating_point]
        got = torch.autograd.grad(touts, tinputs, [c.to("tpu") for c in cots], allow_unused=True)
        got = [None if x is None else x.cpu() for x in got]
    for i, (a, b) in enumerate(zip(got, ref)):
        if b is None:
            continue
        assert a is not None, f"grad {i} missing"
        compare(i, a, b, sample)
    return True


@pytest.mark.sweep(every=4)
@pytest.mark.parametrize("op,mode", _grad_ops())
def test_opinfo_grad(op, mode):
    """The samples' gradients w.r.t. every float input match CPU autograd."""
    lazyrt.metrics.reset()
    checked = 0
    for n, sample in enumerate(op.sample_inputs("cpu", torch.float32, requires_grad=True)):
        if GRAD_SAMPLES and n >= GRAD_SAMPLES:
            break
        if _random_sample(sample):
            continue
        try:
            checked += _check_grad_sample(op, sample, mode)
        except Exception as e:
            e.add_note(f"(OpInfo sample {n} of {_id(op)})")
            raise
    if not checked:
        pytest.skip("no differentiable output")
    assert lazyrt.metrics.counters()["cpu_fallbacks"] == 0


@pytest.mark.sweep(every=20)
@pytest.mark.parametrize("op,dtype,mode", _ops())
def test_opinfo(op, dtype, mode):
    samples = op.sample_inputs("cpu", dtype, requires_grad=False)
    rtol, atol = _tol(op, dtype)
    oid = _id(op)
    check_values = oid not in RANDOM_OPS and op.name not in RANDOM_OPS
    lazyrt.metrics.reset()
    n = 0
    with lazyrt.set_mode(mode):
        for sample in samples:
            if MAX_SAMPLES and n >= MAX_SAMPLES:
                break
            n += 1
            args = (sample.input,) + tuple(sample.args)
            tape = _RandnTape() if oid in REPLAYED_RANDOM else None
            if tape is not None:  # the tpu run draws, the CPU run replays its draws
                with tape.record():
                    actual = to_cpu(op(*_to_tpu_args(op, args), **to_tpu(sample.kwargs)))
                with tape.replay():
                    expected = op(*args, **sample.kwargs)
            else:
                try:
                    expected = op(*args, **sample.kwargs)
                except Exception as e:  # a sample CPU rejects: tpu must reject it too
                    with pytest.raises(type(e)):
                        out = op(*_to_tpu_args(op, args), **to_tpu(sample.kwargs))
                        to_cpu(out)
                    continue
                actual = to_cpu(op(*_to_tpu_args(op, args), **to_tpu(sample.kwargs)))
            if oid in NON_CPU:
                expected = NON_CPU[oid](expected, args)
            if oid in FACTORIZATIONS:
                _compare_factorization(oid, actual, expected, rtol, atol)
            elif oid in TIE_ORDER and not sample.kwargs.get("stable"):
                _compare_ties(oid, sample, actual, expected, rtol, atol)
            else:
                assert_close(actual, to_cpu(expected), rtol=rtol, atol=atol,
                             check_values=check_values and not _random_sample(sample))
    assert lazyrt.metrics.counters()["cpu_fallbacks"] == 0

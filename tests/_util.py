"""Helpers shared by the tests: move structures to tpu and back, compare with CPU."""
from __future__ import annotations

import pytest
import torch


def to_tpu(x):
    """``x`` on tpu; a CPU view keeps its layout: its whole storage moves and the tpu
    tensor is the same strided view of it (sizes, strides, storage offset), as a sample
    made on the device would be."""
    if isinstance(x, torch.Tensor):
        t = _to_tpu_layout(x.detach())
        if x.requires_grad:
            t.requires_grad_(True)
        return t
    if isinstance(x, list):
        return [to_tpu(v) for v in x]
    if isinstance(x, tuple):
        return tuple(to_tpu(v) for v in x)
    if isinstance(x, dict):
        return {k: to_tpu(v) for k, v in x.items()}
    return x


def _to_tpu_layout(x):
    if x.device.type != "cpu" or x.layout != torch.strided or x.numel() == 0:
        return x.to("tpu")
    n_storage = x.untyped_storage().nbytes() // x.element_size()
    if x.is_contiguous() and x.storage_offset() == 0 and n_storage == x.numel():
        return x.to("tpu")
    flat = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage(), 0, (n_storage,), (1,))
    return flat.to("tpu").as_strided(x.shape, x.stride(), x.storage_offset())


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu() if x.device.type == "tpu" else x.detach()
    if isinstance(x, list):
        return [to_cpu(v) for v in x]
    if isinstance(x, tuple):
        return tuple(to_cpu(v) for v in x)
    if isinstance(x, dict):
        return {k: to_cpu(v) for k, v in x.items()}
    return x


def assert_close(actual, expected, rtol=1e-4, atol=1e-5, check_values=True, path="out"):
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: expected a tensor, got {type(actual)}"
        a = to_cpu(actual)
        assert a.shape == expected.shape, f"{path}: shape {tuple(a.shape)} != {tuple(expected.shape)}"
        assert a.dtype == expected.dtype, f"{path}: dtype {a.dtype} != {expected.dtype}"
        if check_values:
            torch.testing.assert_close(a, expected, rtol=rtol, atol=atol, equal_nan=True,
                                       msg=lambda m: f"{path}: {m}")
    elif isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)), f"{path}: expected a sequence, got {type(actual)}"
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_close(a, e, rtol, atol, check_values, f"{path}[{i}]")
    elif isinstance(expected, float) and check_values:
        assert abs(actual - expected) <= atol + rtol * abs(expected) or (actual != actual and expected != expected), \
            f"{path}: {actual} != {expected}"
    elif check_values:
        assert actual == expected, f"{path}: {actual} != {expected}"


def gen(seed: int = 0) -> torch.Generator:
    """A CPU generator seeded with ``seed`` (test data independent of the global stream)."""
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(tuple(shape), generator=gen(seed)).to(dtype)


def fallbacks() -> int:
    import lazyrt

    return lazyrt.metrics.counters()["cpu_fallbacks"]


def check_op(fn, *args, rtol=1e-4, atol=1e-5, **kwargs):
    """``fn`` (an op or function) on the tpu copies of its arguments against CPU: values,
    shapes, dtypes; no op fell back to the CPU. Returns the tpu result."""
    expected = fn(*args, **kwargs)
    actual = fn(*to_tpu(args), **to_tpu(kwargs))
    assert_close(to_cpu(actual), expected, rtol=rtol, atol=atol)
    assert fallbacks() == 0
    return actual


def grad_check(fn, *inputs, seed=0, rtol=1e-4, atol=1e-5):
    """The output of ``fn`` and the gradients of its floating inputs on tpu against CPU;
    the gradient fed back is ``randn(*out.shape, seed=seed)`` (a plain dense tensor); no
    op fell back to the CPU."""
    results = []
    for dev in ("cpu", "tpu"):
        xs = [x.detach().clone().to(dev).requires_grad_(x.is_floating_point()) for x in inputs]
        out = fn(*xs)
        cot = randn(*out.shape, seed=seed).to(dev)
        grads = torch.autograd.grad(out, [x for x in xs if x.requires_grad], cot)
        results.append((out.detach(), list(grads)))
    (out_c, grads_c), (out_t, grads_t) = results
    assert_close(out_t, out_c, rtol, atol)
    assert_close(grads_t, grads_c, rtol, atol, path="grad")
    assert fallbacks() == 0


def needs(feature: str):
    """Skip the test on a torch without ``feature`` (``lazyrt._base.compat.FEATURES``); the
    reason names the feature and the torch that has it."""
    from lazyrt._base import compat

    return pytest.mark.skipif(not compat.has(feature), reason=compat.message(feature))


def op_param(qualname: str):
    """``aten.x.overload`` as a ``pytest.param``: skipped, naming the op, on a torch without it."""
    from lazyrt._base import compat

    op = compat.op(qualname)
    return pytest.param(op or qualname, id=qualname.split(".", 1)[1], marks=pytest.mark.skipif(
        op is None, reason=f"torch {compat.TORCH} has no {qualname}"))

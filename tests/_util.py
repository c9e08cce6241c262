"""Helpers shared by the tests: move structures to tpu and back, compare with CPU."""
from __future__ import annotations

import torch


def to_tpu(x):
    if isinstance(x, torch.Tensor):
        t = x.detach().to("tpu")
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

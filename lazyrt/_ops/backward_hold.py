"""Errors raised by ops inside ``backward()``, held until ``backward()`` returns.

NOTE (torch 2.13): PyTorch aborts the process ("terminate called without an active
exception") when a Python exception leaves a PrivateUse1 kernel called by a C++
autograd node. So inside backward an op's error is kept here, the op returns zeros
of the right shape, and the error is raised when the engine returns
(``_patches`` wraps ``torch.autograd.graph._engine_run_backward`` with ``run_backward``).
"""
from __future__ import annotations

import jax.numpy as jnp
import torch

from .._base import dtypes as _dtypes
from .._base.tensor import contiguous_spec
from .._exec.values import new_tensor
from .plan import meta_run

_held: list = []


def hold(e, args, kwargs, ex: Exception):
    """Keep ``ex`` (the first one of this backward pass); return zeros shaped like the
    op's outputs so the engine can finish."""
    if not _held:
        _held.append(ex)
    try:
        mout, _, _ = meta_run(e, args, kwargs)
    except Exception:
        mout = args[0] if args else None

    def zeros(m):
        if isinstance(m, torch.Tensor):
            shape = tuple(m.shape)
            return new_tensor(jnp.zeros(shape, _dtypes.to_jax(m.dtype)),
                              contiguous_spec(shape, m.dtype))
        if isinstance(m, (list, tuple)):
            return type(m)(zeros(x) for x in m)
        return m

    return zeros(mout)


def run_backward(orig):
    """``orig`` (the autograd engine's entry), raising the held error when it returns."""

    def _engine_run_backward(*args, **kwargs):
        _held.clear()
        try:
            out = orig(*args, **kwargs)
        except BaseException:
            if _held:
                err = _held.pop()
                _held.clear()
                raise err from None
            raise
        if _held:
            err = _held.pop()
            _held.clear()
            raise err
        return out

    return _engine_run_backward

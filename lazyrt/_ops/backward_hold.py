"""Errors raised by ops inside ``backward()``, held until ``backward()`` returns.

NOTE (torch 2.13): PyTorch aborts the process ("terminate called without an active
exception") when a Python exception leaves a PrivateUse1 kernel called by a C++
autograd node. So inside backward an op's error is kept here, the op returns zeros
of the right shape, and the error is raised when the engine returns
(``_patches`` wraps ``torch.autograd.graph._engine_run_backward`` with ``run_backward``).

Errors are held per backward pass (autograd's graph task), not per process: every
backward on tpu runs on autograd's one device thread, whichever thread called it, so
two threads in ``backward()`` at once each get the error of their own pass. A pass
learns its graph task's id from a pre-hook on its root nodes.
"""
from __future__ import annotations

import threading

import jax.numpy as jnp
import torch

from .._base import dtypes as _dtypes
from .._base.tensor import contiguous_spec
from .._exec.values import new_tensor
from .plan import meta_run

_current_graph_task_id = torch._C._current_graph_task_id
_LOCK = threading.Lock()
_held: dict[int, Exception] = {}  # graph task id -> the first error of that pass
_MAX_HELD = 64  # passes that never came back through ``run_backward`` are dropped


def hold(e, args, kwargs, ex: Exception):
    """Keep ``ex`` (the first one of this backward pass); return zeros shaped like the
    op's outputs so the engine can finish."""
    task = _current_graph_task_id()
    with _LOCK:
        if task not in _held:
            if len(_held) >= _MAX_HELD:
                _held.pop(next(iter(_held)))
            _held[task] = ex
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


def _roots(t_outputs) -> list:
    """The autograd nodes a backward pass starts from (tensors or GradientEdges)."""
    if isinstance(t_outputs, (torch.Tensor, torch.autograd.graph.GradientEdge)):
        t_outputs = (t_outputs,)
    nodes = []
    for t in t_outputs:
        n = t.grad_fn if isinstance(t, torch.Tensor) else t.node
        if n is not None and n not in nodes:
            nodes.append(n)
    return nodes


def _take(tasks: list) -> Exception | None:
    with _LOCK:
        errs = [_held.pop(t) for t in tasks if t in _held]
    return errs[0] if errs else None


def run_backward(orig):
    """``orig`` (the autograd engine's entry), raising the held error of this pass when
    it returns."""

    def _engine_run_backward(t_outputs, *args, **kwargs):
        tasks: list = []

        def note(_grads):
            tasks.append(_current_graph_task_id())

        handles = [n.register_prehook(note) for n in _roots(t_outputs)]
        try:
            out = orig(t_outputs, *args, **kwargs)
        except BaseException:
            err = _take(tasks)
            if err is not None:
                raise err from None
            raise
        finally:
            for h in handles:
                h.remove()
        err = _take(tasks)
        if err is not None:
            raise err
        return out

    return _engine_run_backward

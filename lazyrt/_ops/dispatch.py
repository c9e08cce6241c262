"""The entry point: every ATen op on a ``tpu`` tensor comes here.

``TpuTensor.__torch_dispatch__`` (installed by this module) looks up the op's entry
(``_resolve``: resolved once per op), calls its handler (``_handlers`` / ``_special``),
and routes errors. In defer mode the whole op runs under the pending trace's lock, so
an op's recording, storage registration and write-back are never split by a flush
from another thread.

Following ``a + b``: ``_dispatch`` -> ``_resolve.resolve(aten.add.Tensor)`` (once) ->
``_handlers.functional`` -> ``_plan.plan_for`` (argument walk, plan cache; a miss builds
the plan: meta kernel, output layout, Prog) -> ``_values.run`` -> ``_strict.run``
(compile once via ``_xla``, execute) or ``_defer.record`` (a node of the pending trace,
run at the next flush) -> ``_values.new_tensor`` wraps the result.
"""
from __future__ import annotations

import torch
from torch._ops import OpOverload

from .._base.config import config
from .._base.metrics import COUNTERS
from .._base.tensor import TpuTensor
from .._exec.defer import LOCK
from .._exec.values import to_cpu
from .args import TracingArgument
from .backward_hold import hold
from .fallback import compare_with_cpu
from .resolve import BY_ID, resolve

_current_autograd_node = torch._C._current_autograd_node


def _torch_dispatch(cls, func: OpOverload, types, args: tuple = (), kwargs: dict | None = None):
    COUNTERS["ops_dispatched"] += 1
    e = BY_ID.get(id(func))
    if e is None:
        e = resolve(func)
    if kwargs is None:
        kwargs = {}
    try:
        if config.mode == "defer":
            with LOCK:
                return e.handler(e, args, kwargs)
        if config.debug_compare and config.mode == "debug":
            out = e.handler(e, args, kwargs)
            compare_with_cpu(e, args, kwargs, out)
            return out
        return e.handler(e, args, kwargs)
    except TracingArgument:
        return _for_tracer(func, args, kwargs)
    except Exception as ex:
        if _current_autograd_node() is None:
            raise
        return hold(e, args, kwargs, ex)


def _for_tracer(func: OpOverload, args: tuple, kwargs: dict):
    """``func`` got real tpu tensors beside tracing (fake/functional) tensors: Dynamo or
    AOTAutograd is tracing, and a C++ path made a real tensor on the device (``x[[0, 1]]``
    builds its index tensor so). Hand the tracer CPU copies of the real tensors: it
    records them as constants of the graph, as it does for CUDA's."""

    def host(a):
        if type(a) is TpuTensor:
            return to_cpu(a)
        if type(a) in (list, tuple):
            return type(a)(host(x) for x in a)
        return a

    return func(*host(args), **{k: host(v) for k, v in kwargs.items()})


def dispatch(func: OpOverload, args: tuple, kwargs: dict):
    """Run ``func`` on tpu arguments (the PrivateUse1 kernels lazyrt registers call this)."""
    return _torch_dispatch(TpuTensor, func, None, args, kwargs)


TpuTensor.__torch_dispatch__ = classmethod(_torch_dispatch)

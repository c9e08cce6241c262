"""The host side of a compiled graph (``graph._GraphPlan``): its CPU inputs and the CPU
work on them (the optimizer's step counters), read and run at each call as eager does.
"""
from __future__ import annotations

import torch

from .._base.tensor import TpuTensor
from .._ops.args import _TRACING_TYPES, walk
from .refs import value


class _GraphEntry:
    """What ``_args.walk`` needs of an op, for a graph's own inputs."""

    name = "torch.compile graph"
    packet = "compiled_graph"


_ENTRY = _GraphEntry()


def _is_cpu_tensor(a) -> bool:
    return isinstance(a, torch.Tensor) and type(a) is not TpuTensor and a.device.type == "cpu"


def _input_key(a, vals: list, scal: list):
    """``walk`` for a graph input, except that a 0-d CPU tensor (the optimizer's step
    counter) stays on the host: the plan reads it there, or passes it as a runtime scalar,
    instead of a transfer at every call."""
    if _is_cpu_tensor(a) and a.dim() == 0 and type(a).__name__ not in _TRACING_TYPES:
        return ("cpu", (), a.dtype)
    return walk(_ENTRY, a, vals, scal, True)


class _HostRef:
    """A node value (its ``refs.Ref``) in a host step's arguments."""

    __slots__ = ("ref",)

    def __init__(self, ref):
        self.ref = ref


def _host_args(a, tables):
    """Host-step arguments: refs replaced by their values (``refs.value``'s ``tables``)."""
    if type(a) is _HostRef:
        return value(a.ref, tables)
    if isinstance(a, (list, tuple)):
        return type(a)(_host_args(x, tables) for x in a)
    if isinstance(a, dict):
        return {k: _host_args(v, tables) for k, v in a.items()}
    return a

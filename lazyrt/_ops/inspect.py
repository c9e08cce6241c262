"""Looking at what lazyrt will run: the pending trace, its StableHLO, op coverage."""
from __future__ import annotations

from .._base.ir import Pending
from .._base.tensor import TpuTensor
from .._exec import defer as _defer
from .._exec import program as _program
from .._exec.values import value
from .coverage import coverage

__all__ = ["graph", "hlo", "coverage"]


def _pending_of(tensors) -> list[Pending]:
    out = []
    for t in tensors:
        if isinstance(t, TpuTensor):
            v = value(t)
            if type(v) is Pending and not v.trace.done:
                out.append(v)
    return out


def graph(*tensors) -> str:
    """The pending trace as readable text: one line per op with shapes and (when
    source recording is on) the user's source line. With tensors given, only the
    ops they depend on."""
    with _defer.LOCK:
        tr = _defer.current()
        only = _program.needed_for(tr, _pending_of(tensors)) if tensors else None
        return _defer.graph_text(tr, only)


def hlo(*tensors) -> str:
    """StableHLO text of the computation a flush would run to produce ``tensors``
    (all live pending tensors if none are given)."""
    with _defer.LOCK:
        tr = _defer.current()
        pend = _pending_of(tensors) if tensors else _defer.live_output_values(tr)
        return _program.hlo_text(tr, pend)

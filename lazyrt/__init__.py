"""lazyrt: PyTorch's ``tpu`` device on XLA (via JAX), op by op or deferred and fused.

``import lazyrt`` registers the device; then ``.to("tpu")``.

Modes (``TORCH_TPU_MODE`` at import, ``lazyrt.set_mode`` in code):
  strict  each ATen op compiled on its own and run at once (default)
  debug   strict, but blocking, with NaN/Inf checks naming the op and source line
  defer   DeferAndFuse: ops recorded, flushed at sync points as ONE computation

This module is the public surface only; the machinery is in the private modules
(``_dispatch`` is where an op enters; its docstring follows ``a + b`` to XLA).
"""
from __future__ import annotations

from . import _install, memory, metrics
from ._base.config import config
from ._base.platform import VERSION
from ._base.tensor import TpuTensor
from ._ops.control import (
    EagerMode,
    get_mode,
    set_cpu_fallback,
    set_eager_mode,
    set_mode,
    set_pallas,
    sync,
)
from ._ops.inspect import coverage, graph, hlo
from ._ops.jax_op import jax_op

__version__ = VERSION
__all__ = [
    "set_mode", "get_mode", "sync", "graph", "hlo", "metrics", "memory", "coverage",
    "set_cpu_fallback", "set_pallas", "EagerMode", "set_eager_mode", "config", "TpuTensor",
    "jax_op",
]

_install.install()

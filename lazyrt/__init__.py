"""lazyrt: PyTorch's ``tpu`` device on XLA (via JAX), op by op or deferred and fused.

``import lazyrt`` registers the device; then ``.to("tpu")``.

Modes (``TORCH_TPU_MODE`` at import, ``lazyrt.set_mode`` in code):
  strict  each ATen op compiled on its own and run at once (default)
  debug   strict, but blocking, with NaN/Inf checks naming the op and source line
  defer   DeferAndFuse: ops recorded, flushed at sync points as ONE computation
"""
from __future__ import annotations

import torch

from . import _device

_device.register()  # first: creates the "tpu" device type

from . import lowering  # noqa: E402,F401  (fills the lowering table)
from . import _defer, _dispatch, memory, metrics  # noqa: E402
from ._config import config
from ._device import EagerMode, get_mode, set_eager_mode, set_mode, sync
from ._tensor import TpuTensor

__version__ = "0.1.0"
__all__ = [
    "set_mode", "get_mode", "sync", "graph", "hlo", "metrics", "memory", "coverage",
    "set_cpu_fallback", "set_pallas", "EagerMode", "set_eager_mode", "config", "TpuTensor",
]

_dispatch._late_specials()

from . import _autocast  # noqa: E402

_autocast.register()


def _enable_persistent_cache(path: str) -> None:
    """Compiled executables persist across processes in JAX's compilation cache."""
    import jax

    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


if config.cache_dir:
    _enable_persistent_cache(config.cache_dir)


def set_pallas(policy: str) -> str:
    """Set the Pallas policy ('auto', 'on', 'off'; as ``LAZYRT_PALLAS``) and drop the
    compiled forms of the routed ops so it takes effect at once. Returns the old one."""
    from . import _pallas

    return _pallas.set_policy(policy)


def set_cpu_fallback(enabled: bool = True) -> None:
    """Run ops with no tpu lowering on the CPU (warning once per op) instead of raising."""
    config.cpu_fallback = bool(enabled)


def _pending_of(tensors):
    from ._ir import Pending

    out = []
    for t in tensors:
        if isinstance(t, TpuTensor):
            v = _dispatch.value(t)
            if type(v) is Pending and not v.trace.done:
                out.append(v)
    return out


def graph(*tensors) -> str:
    """The pending trace as readable text: one line per op with shapes and (when
    source recording is on) the user's source line. With tensors given, only the
    ops they depend on."""
    tr = _defer.current()
    only = None
    if tensors:
        only = _defer.needed_for(tr, _pending_of(tensors))
    return _defer.graph_text(tr, only)


def hlo(*tensors) -> str:
    """StableHLO text of the computation a flush would run to produce ``tensors``
    (all live pending tensors if none are given)."""
    tr = _defer.current()
    if tensors:
        pend = _pending_of(tensors)
    else:
        pend = [st.value for st, _ in _defer._live_outputs(tr)[0]]
    return _defer.hlo_text(tr, pend)


def coverage(op=None):
    """Which ATen ops lazyrt lowers, derives, decomposes, or lacks (see ``lazyrt._coverage``).

    ``lazyrt.coverage()`` -> {"lowered": [...], "derived": [...], "decomposed": [...],
    "functional": [...], "missing": [...], "counts": {...}};
    ``lazyrt.coverage("aten.add.Tensor")`` -> "lowered".
    """
    from ._coverage import coverage as _cov

    return _cov(op)


_orig_set_prec = torch.set_float32_matmul_precision


def _set_float32_matmul_precision(precision: str) -> None:
    _orig_set_prec(precision)
    # Plans bake the matmul precision into their compiled form: drop them.
    for e in _dispatch._ENTRIES.values():
        e.plans.clear()
    _dispatch._chain_progs.clear()
    _dispatch._write_progs.clear()
    _defer._cache.clear()


torch.set_float32_matmul_precision = _set_float32_matmul_precision

# The c10d backends "tpu"/"tpu_dist" (registering them costs ~30 us; the backend itself,
# torch.distributed's process groups and jax.distributed load at init_process_group).
from .distributed import register_backends as _register_dist_backends  # noqa: E402

_register_dist_backends()

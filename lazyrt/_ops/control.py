"""The switches that change how ops run: the mode, the sync point, the Pallas policy,
matmul precision, the CPU fallback.

A switch that changes what an op compiles to (Pallas policy, matmul precision) goes
through ONE path, ``invalidate_compiled``: flush the pending work first (it was recorded
under the old setting), then drop the compiled plans it affects.
"""
from __future__ import annotations

import enum
import time

import jax

from .._base import memory
from .._base.config import MODES, config
from .._base.metrics import COUNTERS
from .._exec import asserts as _asserts
from .._exec import defer as _defer
from .._exec import profile as _profile
from .._exec import strict as _strict
from .._exec import views as _views
from . import flat_draws as _flat_draws
from . import resolve as _resolve


class EagerMode(enum.Enum):
    """TorchTPU's eager modes, mapped to lazyrt's."""

    DEFER_AND_FUSE = "defer"
    DEFER_NEVER = "strict"
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "debug"


class _ModeContext:
    """Sets a mode at once; as a context manager, restores the previous one on exit."""

    def __init__(self, mode: str):
        self.prev = config.mode
        _switch(mode)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _switch(self.prev)
        return False

    def __repr__(self):
        return f"<lazyrt mode {config.mode!r}>"


def _switch(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"lazyrt: unknown mode {mode!r}; valid modes are "
                         + ", ".join(repr(m) for m in MODES))
    # NOTE: under the pending trace's lock: no defer op is half way through (it holds the
    # lock from dispatch to write-back) when the mode changes (``_exec.values.run``)
    with _defer.LOCK:
        try:
            if config.mode == "defer" and mode != "defer":
                _defer.flush(reason="mode switch")
        finally:  # switched even when the flush raises (a failed assert it read)
            config.mode = mode


def set_mode(mode: str | EagerMode) -> _ModeContext:
    """Set the execution mode ('strict', 'debug' or 'defer'); usable as a context manager."""
    if isinstance(mode, EagerMode):
        mode = mode.value
    return _ModeContext(mode)


def get_mode() -> str:
    return config.mode


def set_eager_mode(mode: EagerMode) -> _ModeContext:
    """TorchTPU's API: ``torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)``."""
    if not isinstance(mode, EagerMode):
        raise TypeError(f"set_eager_mode expects a torch.tpu.EagerMode, got {mode!r}")
    return _ModeContext(mode.value)


def eager_mode() -> EagerMode:
    return {v.value: v for v in EagerMode}[config.mode]


def sync() -> None:
    """The sync point: flush the pending trace (defer), then wait until every value a tpu
    tensor holds is computed (and so everything it was computed from).

    NOTE: XLA:CPU runs independent executions side by side, not in dispatch order, so a
    fresh computation is no barrier: waiting on ``device_put(0) + 0`` returned while an
    SDPA backward dispatched before it was still running (tests/test_streams.py)."""
    _defer.flush(reason="lazyrt.sync")
    t0 = time.perf_counter()
    arrays = memory.live_arrays()
    with _profile.span(_profile.SYNC):
        if arrays:
            jax.block_until_ready(arrays)
        jax.effects_barrier()
    COUNTERS["wait_seconds"] += time.perf_counter() - t0
    _asserts.check()


def all_ready() -> bool:
    """Whether every value a tpu tensor holds is computed (``query`` of streams and
    events); pending defer work counts as not done."""
    if config.mode == "defer" and _defer.pending_count():
        return False
    return all(a.is_ready() for a in memory.live_arrays())


def flush_pending(reason: str) -> None:
    """Run the pending trace now (defer mode; nothing to do otherwise or when empty)."""
    if config.mode == "defer" and _defer.pending_count():
        _defer.flush(reason=reason)


def invalidate_compiled(ops=None, change=None) -> None:
    """THE plan-invalidation path. Flush pending work (lowerings are traced at the flush,
    so it must run under the old setting), apply ``change()``, then drop the compiled
    plans of ``ops`` (and their in-place/out= variants), or of everything when ``ops`` is
    None (view programs and defer executables too). The next call re-plans."""
    sync()
    if change is not None:
        change()
    dropped = _resolve.invalidate_plans(ops)
    _strict.drop(dropped)
    if ops is None:
        _views.clear()
        _defer.clear_cache()
        _flat_draws.clear()


def set_pallas(policy: str) -> str:
    """Set the Pallas policy ('auto', 'on', 'off'; as ``LAZYRT_PALLAS``) and drop the
    compiled forms of the routed ops so it takes effect at once. Returns the old one."""
    from ..lowering import pallas_router as _pallas

    policy = str(policy).strip().lower()
    if policy not in _pallas.POLICIES:
        raise ValueError(f"lazyrt: pallas policy {policy!r} must be one of {_pallas.POLICIES}")
    prev = config.pallas
    if policy != prev:
        invalidate_compiled(_pallas.routed_ops(), change=lambda: setattr(config, "pallas", policy))
    return prev


def set_matmul_precision(set_precision, precision: str) -> None:
    """``torch.set_float32_matmul_precision(precision)`` (``set_precision`` is torch's own):
    lowerings and compiled plans bake the precision in."""
    invalidate_compiled(None, change=lambda: set_precision(precision))


def set_cpu_fallback(enabled: bool = True) -> None:
    """Run ops with no tpu lowering on the CPU (warning once per op) instead of raising."""
    config.cpu_fallback = bool(enabled)

"""The one door from ``lazyrt.distributed`` into lazyrt's runtime internals.

Everything the distributed package needs from the core (making a tpu tensor from a
``jax.Array``, reading a tensor's value, writing a new value into a tensor in place,
running or recording a ``Prog``, flushing the pending trace, registering op handlers)
goes through the functions below, so a refactor of the core only has to re-point this
file. Nothing here holds state of its own.
"""
from __future__ import annotations

import jax
import torch

from .._base import dtypes as _dtypes
from .._base import memory
from .._base.config import config
from .._base.ir import Pending, Prog
from .._base.tensor import TpuTensor, contiguous_strides
from .._exec import (
    defer as _defer,
)
from .._exec import (
    lean as _lean,
)
from .._exec import (
    strict as _strict,
)
from .._exec import (
    values as _values,
)
from .._exec import (
    xla as _xla,
)
from .._ops import resolve as _resolve
from ..lowering import _registry

__all__ = [
    "TpuTensor", "Prog", "Pending", "is_tpu", "mode", "deferring", "from_array", "array_of",
    "value_of", "write", "run", "flush", "pending_count", "current_trace", "compile_lowered",
    "register_handler", "register_lowering", "to_jax_dtype", "to_torch_dtype", "X64",
    "set_spmd_runner", "host_to_device", "to_cpu", "track", "set_sharding_keys", "lean_lower",
    "locked", "base_storage",
]

X64 = jax.enable_x64


def is_tpu(t) -> bool:
    return isinstance(t, TpuTensor)


def mode() -> str:
    return config.mode


def deferring() -> bool:
    return config.mode == "defer"


def to_jax_dtype(dtype: torch.dtype):
    return _dtypes.to_jax(dtype)


def to_torch_dtype(dtype) -> torch.dtype:
    return _dtypes.to_torch(dtype)


def track(arr, nbytes: int | None = None) -> None:
    """Count a fresh device array in lazyrt's memory accounting."""
    memory.track(arr, nbytes)


def from_array(value, dtype: torch.dtype | None = None) -> TpuTensor:
    """A fresh contiguous tpu tensor holding ``value`` (a ``jax.Array`` or a ``Pending``)."""
    shape = tuple(value.shape)
    if dtype is None:
        dtype = _dtypes.to_torch(value.dtype)
    if type(value) is not Pending:
        memory.track(value)
    return _values.new_tensor(value, (shape, contiguous_strides(shape), dtype, 0))


def value_of(t: TpuTensor):
    """``t``'s current value: a ``jax.Array``, or a ``Pending`` in defer mode."""
    return _values.value(t)


def array_of(t: TpuTensor):
    """``t``'s value as a ``jax.Array`` (flushes the pending trace if it is pending)."""
    return _values.concrete(t)


def write(t: TpuTensor, value) -> None:
    """Give ``t`` (and every alias of it) the new value ``value`` (array or Pending),
    as an in-place op would; ``value`` has ``t``'s shape and dtype."""
    if type(value) is not Pending:
        memory.track(value)
    _values.write(t, value)


def base_storage(t: TpuTensor):
    """``t``'s storage if ``t`` is a base tensor (not a view), else None: a key for what
    holds while the storage's value is unchanged (aliases share it)."""
    return t._st if t._chain is None else None


def locked():
    """The pending trace's lock (re-entrant), as a context manager. A c10d call holds it
    from recording its collective to writing the results into its tensors, as the
    dispatcher holds it for an op, so another thread's flush never splits the two."""
    return _defer.LOCK


def run(prog: Prog, inputs, scalars=()):
    """Run ``prog`` now (strict/debug) or record it into the pending trace (defer);
    returns its output values (arrays, or Pendings)."""
    return _values.run(prog, list(inputs), list(scalars))


def flush(reason: str) -> None:
    """Run the pending trace (defer mode); a no-op when nothing is pending."""
    _defer.flush(reason=reason)


def pending_count() -> int:
    return _defer.pending_count()


def current_trace():
    return _defer.current()


def compile_lowered(lowered):
    """Compile a ``jax.stages.Lowered`` with lazyrt's XLA options."""
    return _xla.compile(lowered)


def lean_lower(jitted, args: tuple):
    """``jitted`` traced at ``args``, simplified as every defer flush is, and lowered."""
    return _lean.lower(jitted, args)


def register_handler(op, handler) -> None:
    """Route ``op`` (an ``OpOverload``) to ``handler(entry, args, kwargs)``."""
    _resolve.set_special(op, handler)


def register_lowering(op, fn) -> None:
    """Register ``fn`` as the pure-JAX lowering of ``op`` (see ``lazyrt.lowering``)."""
    if op not in _registry.LOWERINGS:
        _registry.lower(op)(fn)
        _resolve.forget(op)


def set_spmd_runner(fn) -> None:
    """``fn(trace, reason)`` is asked at every defer flush; it returns None, or an object
    whose ``compile(fn, donated, kept, scalars)`` builds the flush's executable (an SPMD
    program over a device mesh, for traces holding fused collectives)."""
    _defer.spmd_runner = fn


def set_sharding_keys(on: bool = True) -> None:
    """Key the defer cache on the sharding of every input (once a Mesh exists)."""
    _defer.KEY_SHARDING = bool(on)


def host_to_device(c: torch.Tensor):
    return _values.host_to_device(c)


def to_cpu(t: TpuTensor) -> torch.Tensor:
    return _values.to_cpu(t)


def strict_run(prog: Prog, arrays, scalars=()):
    """Run ``prog`` at once on concrete arrays, whatever the mode."""
    return _strict.run(prog, list(arrays), list(scalars))


_apply_progs: dict = {}


def apply(fn, value, name: str):
    """``fn`` (a pure JAX function of one array) applied to ``value`` (array or Pending),
    run at once or recorded like an op; one Prog per (name, input aval)."""
    aval = (tuple(value.shape), value.dtype)
    key = (name, aval)
    prog = _apply_progs.get(key)
    if prog is None:
        with X64(True):
            o = jax.eval_shape(fn, jax.ShapeDtypeStruct(*aval))
        prog = Prog(f"dist.{name}", lambda a: (fn(a),), (), ((tuple(o.shape), o.dtype),), name)
        _apply_progs[key] = prog
    return run(prog, [value])[0]


def sync_device() -> None:
    """``lazyrt.sync()``: flush, then wait for all dispatched device work."""
    from .._ops.control import sync

    sync()


def user_line() -> str:
    """The user's source line that led here (outside lazyrt, torch and the stdlib)."""
    from .._base import source as _source

    return _source.user_line(3)


def wait_ready(t: TpuTensor) -> None:
    """Block until the device has computed ``t``'s storage (its base value; no op is run
    to derive a view)."""
    v = t._st.value
    if type(v) is Pending:
        flush(reason="wait_ready")
        v = t._st.value
    v.block_until_ready()


def memory_analysis(compiled):
    return memory.MemoryAnalysis.of(compiled)


def note_compile(seconds: float) -> None:
    """Count a compile lazyrt.distributed did for the core (cache_misses, compile_seconds)."""
    from .._base.metrics import COUNTERS

    COUNTERS["cache_misses"] += 1
    COUNTERS["compile_seconds"] += seconds


def install_torch_patches(engine) -> None:
    """FSDP2's storage no-ops and flush points and DTensor's rank-dependent chunks
    (``lazyrt._torch.patches.install_distributed``; ``engine`` gives the hooks)."""
    from .._torch import patches as _patches

    _patches.install_distributed(engine)

"""Values of tpu tensors: reading, writing, making, running, and host transfers.

A tensor's value is a ``jax.Array`` or, in defer mode, a ``Pending``. ``run`` is the
one place a Prog is executed or recorded: strict/debug run it now (``_strict``),
defer records it (``_defer``). Everything that computes a value goes through it.

Threads (defer mode): the dispatcher holds ``_defer.LOCK`` for the whole of each op,
so ``run`` + ``new_tensor``/``write`` of one op are never split by another thread's
flush. Functions here that may record outside an op (``value`` of a view) take it.
"""
from __future__ import annotations

import atexit
import time

import jax
import numpy as np
import torch

from .._base import dtypes as _dtypes
from .._base import memory
from .._base.config import config
from .._base.ir import Pending, Prog
from .._base.metrics import COUNTERS
from .._base.tensor import Storage, TpuTensor, contiguous_spec
from . import asserts as _asserts
from . import defer as _defer
from . import profile as _profile
from . import strict as _strict
from . import views as _views

_X64 = jax.enable_x64
_owned = _defer.LOCK._is_owned
atexit.register(_asserts.at_exit, _defer.materialize)


def run(prog: Prog, inputs: list, scalars: list) -> list:
    """Run (strict/debug) or record (defer) ``prog``; returns its output values.

    An op's mode is the one it started in: a defer op holds the pending trace's lock from
    the dispatcher on, and a mode switch takes that lock, so an op that started in strict
    mode (no lock) while another thread switched to defer still runs strictly."""
    if config.mode == "defer" and _owned():
        if not prog.const or not _defer.eager_const(inputs):
            return _defer.record(prog, inputs, scalars)
        return _strict.run(prog, inputs, scalars)
    for v in inputs:
        if type(v) is Pending:  # recorded in defer mode before a switch to strict
            inputs = [_defer.materialize(v) if type(v) is Pending else v for v in inputs]
            break
    return _strict.run(prog, inputs, scalars)


def _cached(t: TpuTensor):
    """View ``t``'s cached value while its storage is unchanged (an array, or a Pending
    not yet run), else None."""
    c = t._cache
    if t._cver != t._st.version or c is None:
        return None
    if type(c) is Pending and c.result is not None:
        t._cache = c = c.result
    return c


def value(t: TpuTensor):
    """The current value of ``t`` (array or Pending), derived through its view chain."""
    if t._chain is None:
        return t._st.value
    st = t._st
    c = _cached(t)
    if c is not None and (type(c) is not Pending or not c.trace.done):
        return c
    with _defer.LOCK:
        v = run(_views.chain_prog(t._chain), [st.value], _views.chain_scalars(t._chain))[0]
        t._cache = v
        t._cver = st.version
    return v


def aval(t: TpuTensor):
    """``t``'s shape and dtype as a ``jax.ShapeDtypeStruct`` (nothing derived or recorded)."""
    return jax.ShapeDtypeStruct(t._spec[0], _dtypes.to_jax(t._spec[2]))


def concrete(t: TpuTensor):
    """``t``'s value as a ``jax.Array``, flushing the pending trace if needed."""
    if t._chain is None:
        v = t._st.value
        return _defer.materialize(v) if type(v) is Pending else v
    st = t._st
    c = _cached(t)
    if c is not None and type(c) is not Pending:
        return c
    # NOTE: live views are not flush outputs (autograd keeps many, e.g. the transposed
    # weights): materialize the base, then derive this view from it with the same strict
    # execution as any op (debug checks included). Nothing is recorded: a view node left
    # in the trace would change the next flush's program.
    with _defer.LOCK:
        base = _defer.materialize(st.value) if type(st.value) is Pending else st.value
        v = _strict.run(_views.chain_prog(t._chain), [base],
                        _views.chain_scalars(t._chain))[0]
        t._cache = v
        t._cver = st.version
    return v


def write(t: TpuTensor, v) -> None:
    """Rebind ``t`` (and so every alias of it) to the new value ``v``."""
    st = t._st
    old = st.value
    if t._chain is None:
        st.value = v
        st.version += 1
    else:
        st.value = run(_views.write_prog(t._chain), [old, v],
                       _views.chain_scalars(t._chain))[0]
        st.version += 1
        t._cache = v
        t._cver = st.version
    if type(st.value) is Pending:
        _defer.note_storage(st, old)


def new_tensor(v, spec: tuple | None = None) -> TpuTensor:
    """A fresh base tensor holding ``v`` (array or Pending); contiguous unless ``spec``."""
    if spec is None:
        spec = contiguous_spec(v.shape, _dtypes.to_torch(v.dtype))
    st = Storage(v, spec[2] if spec[2] in _dtypes.WIDENED else None)
    t = TpuTensor._wrap(spec, st)
    if type(v) is Pending:
        _defer.note_storage(st, None)
    return t


# ---------------------------------------------------------------------------
# host transfers
# ---------------------------------------------------------------------------


def host_to_device(c: torch.Tensor):
    """The one host->device transfer: a CPU tensor to a tracked jax.Array.

    NOTE: under enable_x64, or JAX would silently truncate int64/float64 to 32 bits; and
    from a copy: XLA:CPU keeps the numpy buffer it is given (``may_alias=False`` does not
    stop it, jax 0.10.2), so a later in-place write to the CPU tensor changed the tpu one.
    """
    host = np.array(_dtypes.torch_to_numpy(c.detach().cpu().contiguous()), copy=True)
    with _X64(True), _profile.span(_profile.TO_DEVICE):
        arr = jax.device_put(host)
    memory.track(arr)
    COUNTERS["transfers_to_device"] += 1
    return arr


def from_cpu(c: torch.Tensor) -> TpuTensor:
    return new_tensor(host_to_device(c), contiguous_spec(c.shape, c.dtype))


def to_cpu(t: TpuTensor) -> torch.Tensor:
    """The one device->host transfer (a sync point in defer mode)."""
    c = _dtypes.numpy_to_torch(to_host(concrete(t)))
    return c.to(t.dtype) if t.dtype in _dtypes.WIDENED else c


def to_host(arr) -> np.ndarray:
    """``arr`` on the host: waits for it (timed, ``wait_seconds``) and counts the transfer."""
    COUNTERS["transfers_to_host"] += 1
    t0 = time.perf_counter()
    with _profile.span(_profile.TO_HOST):
        host = np.asarray(arr)
    COUNTERS["wait_seconds"] += time.perf_counter() - t0
    _asserts.check()  # a host read is a sync point
    return host


def to_cpu_tree(a, originals: dict | None = None):
    """``a`` with every tpu tensor copied to the CPU (and tpu devices made cpu);
    ``originals`` maps id(copy) -> the tpu tensor it came from."""
    if isinstance(a, TpuTensor):
        c = to_cpu(a)
        if originals is not None:
            originals[id(c)] = a
        return c
    if type(a) is list:
        return [to_cpu_tree(x, originals) for x in a]
    if type(a) is tuple:
        return tuple(to_cpu_tree(x, originals) for x in a)
    if isinstance(a, torch.device) and a.type == "tpu":
        return torch.device("cpu")
    return a

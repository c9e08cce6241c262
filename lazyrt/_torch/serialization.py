"""Pickling tpu tensors (``torch.save``/``torch.load``, ``pickle``) as PyTorch pickles CPU ones.

Saving (``reduce_ex``, ``TpuTensor.__reduce_ex__``): a tpu tensor pickles as PyTorch's own
``torch._utils._rebuild_device_tensor_from_cpu_tensor`` (what XLA uses; allowed by
``weights_only=True``) of a CPU tensor with the tpu tensor's sizes, strides and offset over a
CPU copy of its whole storage. Tensors of one storage pickled in one ``torch.save`` share that
copy, so ``torch.save`` writes it once and records the sharing, as it does for CPU views.
A tpu parameter pickles as ``torch._utils._rebuild_parameter(_with_state)`` of its data, as
an ``nn.Parameter`` does. A checkpoint names only PyTorch's functions: PyTorch without lazyrt
loads it with ``map_location="cpu"``.

Loading (``to_tpu``, called by ``_patches``' wrappers of that rebuild function and of
``torch.load``): the CPU tensors of one CPU storage become tpu tensors of one tpu storage
(the first one covering its storage whole becomes the base, the others views of it), for the
length of one ``torch.load`` (``loading``).

Layouts: lazyrt reads a storage as its base value laid out C-contiguously (``as_strided``
does); a tensor whose storage is laid out otherwise (a base with permuted strides and its
views) or one of a grown (append-buffered) storage is saved as its own contiguous copy, so
a save always writes what each tensor holds.
"""
from __future__ import annotations

import contextlib
import threading
import weakref
from collections import OrderedDict

import torch

from .._base import dtypes as _dtypes
from .._base.tensor import TpuTensor, contiguous_spec, contiguous_strides
from .._exec.values import from_cpu, new_tensor, to_cpu
from .._ops import append as _append

# lazyrt's own attributes of a tpu tensor (the rest of its __dict__ is the user's)
_INTERNAL = frozenset(("_spec", "_st", "_chain", "_cache", "_cver", "_is_param"))

# Storage -> (version, weak reference to a CPU tensor on the storage's CPU copy): while a
# pickler holds that tensor (its memo does, for one torch.save), the storage's other tensors
# pickle onto the same copy.
_HOST: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_host_lock = threading.Lock()


def reduce_ex(t: TpuTensor, proto):
    if getattr(t, "_is_param", False):
        hooks = torch.utils.hooks.warn_if_has_hooks(t)
        if hooks is None:
            hooks = OrderedDict()
        state = {k: v for k, v in t.__dict__.items() if k not in _INTERNAL}
        if state:
            return (torch._utils._rebuild_parameter_with_state,
                    (t.detach(), t.requires_grad, hooks, state))
        return (torch._utils._rebuild_parameter, (t.detach(), t.requires_grad, hooks))
    return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
            (host_view(t), t.dtype, str(t.device), t.requires_grad))


def _mirrors_storage(t: TpuTensor) -> bool:
    """Whether ``t``'s sizes, strides and offset address its storage as lazyrt lays it out
    (its base value, C-contiguous)."""
    st = t._st
    if st in _append._GROWN or t.dtype != _dtypes.to_torch(st.value.dtype):
        return False
    if t._chain is None:
        shape, stride, _, offset = t._spec
        return offset == 0 and tuple(shape) == tuple(st.value.shape) \
            and tuple(stride) == contiguous_strides(shape)
    return True


def _dense(t: torch.Tensor) -> bool:
    return torch._prims_common.is_non_overlapping_and_dense_or_false(t)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(-1).view(torch.uint8),
                       b.contiguous().view(-1).view(torch.uint8))


def _own_copy(t: TpuTensor) -> torch.Tensor:
    """``t``'s values on the CPU in a storage of their own, with ``t``'s strides where they
    are dense (a permuted layout, channels_last), else contiguous."""
    c = to_cpu(t)
    if not t.is_contiguous() and _dense(t):
        c = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).copy_(c)
    return c


def host_view(t: TpuTensor) -> torch.Tensor:
    """A CPU tensor holding what ``t`` holds: ``t``'s sizes, strides and offset on a CPU copy
    of its whole storage where the layout allows, else ``t``'s own copy."""
    if not _mirrors_storage(t):
        return _own_copy(t)
    st = t._st
    with _host_lock:
        e = _HOST.get(st)
        held = e[1]() if e is not None and e[0] == st.version else None
    if held is None:
        if t._chain is None:
            view = to_cpu(t)  # a base covering its storage: its copy is the storage's
            with _host_lock:
                _HOST[st] = (st.version, weakref.ref(view))
            return view
        root = TpuTensor._wrap(contiguous_spec(st.value.shape, t.dtype), st)
        held = to_cpu(root)
    storage = held.untyped_storage()
    view = torch.empty(0, dtype=t.dtype).set_(storage, t.storage_offset(), t.shape, t.stride())
    if t._chain is not None and not _bits_equal(view, to_cpu(t)):
        # a view of a base laid out otherwise (permuted strides): its own copy
        return _own_copy(t)
    with _host_lock:
        _HOST[st] = (st.version, weakref.ref(view))
    return view


# ---- loading --------------------------------------------------------------------------------

_load = threading.local()


@contextlib.contextmanager
def loading():
    """One ``torch.load``: CPU storages met while it runs map to one tpu storage each
    (nested loads, e.g. a pickled storage's own ``torch.load``, share the outer one's map)."""
    outer = getattr(_load, "memo", None)
    if outer is None:
        _load.memo = {}
    try:
        yield
    finally:
        if outer is None:
            _load.memo = None


def to_tpu(c: torch.Tensor, memo: dict | None = None) -> TpuTensor:
    """CPU tensor ``c`` on tpu. Within one load (``loading``), tensors of one CPU storage
    become tensors of one tpu storage, laid out as on the CPU."""
    if c.layout != torch.strided:
        return c.detach().to("tpu")
    if memo is None:
        memo = getattr(_load, "memo", None)
        if memo is None:
            memo = {}
    s = c.untyped_storage()
    size = c.element_size()
    key = (s._cdata, c.dtype)
    st = memo.get(key)
    if st is None and c.storage_offset() == 0 and c.numel() * size == s.nbytes() and _dense(c):
        t = from_cpu(c)
        if c.is_contiguous():
            memo[key] = t._st
            return t
        # NOTE: a permuted layout (channels_last) stays a base with its strides, and out of
        # the map: lazyrt reads a storage C-contiguously, so views of it get their own copy.
        return new_tensor(t._st.value, (tuple(c.shape), tuple(c.stride()), c.dtype, 0))
    if st is None:
        if s.nbytes() % size:
            return c.detach().to("tpu")
        flat = torch.empty(0, dtype=c.dtype).set_(s, 0, (s.nbytes() // size,), (1,))
        st = from_cpu(flat)._st
        memo[key] = st
    root = TpuTensor._wrap(contiguous_spec(st.value.shape, c.dtype), st)
    with torch.no_grad():
        return torch.as_strided(root, c.shape, c.stride(), c.storage_offset()).detach()


PATCH = "tensor_pickling"  # its name for LAZYRT_DISABLE_PATCH


def install() -> None:
    """``TpuTensor.__reduce_ex__`` (patch ``tensor_pickling``): tpu tensors pickle as
    PyTorch pickles CPU ones (above)."""
    from . import patchset

    if patchset.enabled(PATCH):
        TpuTensor.__reduce_ex__ = reduce_ex

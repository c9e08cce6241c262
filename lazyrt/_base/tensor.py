"""The ``tpu`` tensor: a wrapper subclass whose value lives in a shared Storage.

Aliasing is lazyrt's own (not PyTorch's functionalization, see ARCHITECTURE):

* a base tensor and all its views share one ``Storage``; the storage holds the
  base's value (a ``jax.Array`` or a ``Pending``) and a version counter;
* a view keeps ``_chain``: the view steps (plan, output index) that derive it
  from the base value, and a cached value tagged with the storage version;
* an in-place op computes the new value functionally and rebinds the storage;
  writing through a view scatters the new value into the base (one helper
  computation), so every other alias sees it on its next read.

Storage identity (what ``data_ptr()``, ``untyped_storage()`` and ``nbytes()`` report,
for the libraries that detect shared or tied tensors by pointer): each ``Storage`` gets,
on the first query, an address from a bump allocator that never hands one out twice,
far above any host pointer, and the wrapper's own C++ storage is given a non-owning
data pointer at that address with the storage's size (views: the base's storage, at
their offset). Nothing ever reads through that pointer; ops never look at it.

This module knows nothing of how ops run: ``lazyrt._ops.dispatch`` installs itself as
``TpuTensor.__torch_dispatch__`` when it is imported (``import lazyrt`` does that).
"""
from __future__ import annotations

import bisect
import math
import threading
import weakref

import numpy as np
import torch

from . import compat
from .device import DEVICE


class Storage:
    """A tpu tensor's storage: its base's value (a ``jax.Array`` or a ``Pending``), a version
    counter, and ``narrow``: the torch dtype of its elements where the value holds them in
    a wider JAX dtype (``dtypes.WIDENED``: complex32 as complex64), else None."""

    __slots__ = ("value", "version", "narrow", "__weakref__")

    def __init__(self, value, narrow=None):
        self.value = value
        self.version = 0
        self.narrow = narrow


def storage_dtype(st: Storage) -> torch.dtype:
    """The torch dtype of ``st``'s elements."""
    from .dtypes import to_torch
    return st.narrow or to_torch(st.value.dtype)


def storage_itemsize(st: Storage) -> int:
    return st.narrow.itemsize if st.narrow is not None else np.dtype(st.value.dtype).itemsize


# ---- storage identity ------------------------------------------------------------------

# NOTE: 2**60 is above every user-space address of x86-64 and aarch64, so a tpu address
# never equals a CPU pointer (accelerate keys one dict by both); each storage takes a
# multiple of 512 bytes (CUDA's alignment), at least 512, so even empty storages differ.
_ADDR_BASE = 1 << 60
_ALIGN = 512
_ids_lock = threading.Lock()
_next_addr = _ADDR_BASE
_IDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Storage -> (addr, reserved)
_AT: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # addr -> Storage
_ADDRS: list = []  # the addresses given, ascending (dead ones pruned now and then)
_C_untyped_storage = torch._C.TensorBase.untyped_storage
_C_data_ptr = torch._C.TensorBase.data_ptr
_fake_storage = torch._C._construct_storage_from_data_pointer
_SWAP_DATA_PTR = compat.has("storage_swap_data_ptr")


def storage_nbytes(st: Storage) -> int:
    """Bytes of the value ``st`` holds (its base tensor's elements)."""
    return math.prod(st.value.shape) * storage_itemsize(st)


def storage_identity(st: Storage) -> tuple:
    """``(address, nbytes)`` of ``st``: the address is given on the first call and kept for
    the storage's life; never given to another storage, even after this one is freed."""
    global _next_addr
    nbytes = storage_nbytes(st)
    with _ids_lock:
        e = _IDS.get(st)
        if e is None or nbytes > e[1]:
            # NOTE: a storage grown past what it reserved (resize_) moves, as on CUDA.
            reserved = max(_ALIGN, -(-nbytes // _ALIGN) * _ALIGN)
            e = (_next_addr, reserved)
            _next_addr += reserved
            _IDS[st] = e
            _AT[e[0]] = st
            if len(_ADDRS) > 2 * len(_AT) + 1024:
                _ADDRS[:] = sorted(_AT.keys())
            _ADDRS.append(e[0])
    return e[0], nbytes


def storage_at(addr: int) -> tuple:
    """``(storage, byte offset)`` of the live storage whose bytes ``addr`` (a tpu storage's
    ``data_ptr()``; a slice of one points inside it) falls in, or ``(None, 0)``."""
    with _ids_lock:
        i = bisect.bisect_right(_ADDRS, addr) - 1
        base = _ADDRS[i] if i >= 0 else None
        st = _AT.get(base) if base is not None else None
        if st is None or addr - base >= _IDS[st][1]:
            return None, 0
    return st, addr - base


def _stamped_storage(t: TpuTensor) -> torch.UntypedStorage:
    """``t``'s C++ storage, given its storage's identity first if it lacks it."""
    addr, nbytes = storage_identity(t._st)
    if not _SWAP_DATA_PTR:
        # NOTE: a torch without _swap_data_ptr_ (2.11): a non-owning storage at the identity,
        # new on each call (data_ptr and nbytes as with it; not the same object each time).
        return _fake_storage(addr, DEVICE, nbytes)
    s = _C_untyped_storage(t)
    if (_C_data_ptr(t) == addr + t.storage_offset() * t.element_size()
            and s.nbytes() == nbytes):
        return s
    # NOTE: _swap_data_ptr_ swaps the data pointer and size of two storages of equal size
    # or where one is empty: a wrapper's own storage (sized to its own extent) goes through
    # an empty one at the address first. The pointers have no deleter (non-owning).
    if s.nbytes() != nbytes:
        s._swap_data_ptr_(_fake_storage(addr, DEVICE, 0))
    s._swap_data_ptr_(_fake_storage(addr, DEVICE, nbytes))
    return s


def contiguous_strides(shape) -> tuple:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(out))


def storage_extent(shape, stride) -> int:
    """Elements of storage a strided view spans from its offset (PyTorch's
    ``computeStorageNbytes`` in elements: 0 for an empty view)."""
    if 0 in shape:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride))


def contiguous_spec(shape, dtype: torch.dtype) -> tuple:
    """The spec (shape, strides, dtype, storage offset) of a fresh contiguous tensor."""
    shape = tuple(shape)
    return (shape, contiguous_strides(shape), dtype, 0)


_make_wrapper = torch.Tensor._make_wrapper_subclass


class TpuTensor(torch.Tensor):
    """A tensor on the ``tpu`` device. Users never build one directly."""

    _st: Storage
    _spec: tuple
    # A base tensor keeps these class defaults (set per instance only on views): two
    # attribute writes per op fewer on the hot path.
    _chain: tuple | None = None
    _cache = None
    _cver = -1

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, data=None, requires_grad=True):
        """``type(p)(data, requires_grad=...)``, as libraries rebuild a parameter (a tpu
        parameter's type is this class): ``nn.Parameter(data, requires_grad)``, on
        ``data``'s device. lazyrt makes its tensors with ``_wrap``."""
        return torch.nn.Parameter(data, requires_grad)

    @staticmethod
    def _wrap(spec, st, chain=None, cache=None, cver=-1):
        """The tensor of ``spec`` (shape, strides, dtype, offset) on storage ``st``; a view
        has ``chain`` from its base (and a cached value of storage version ``cver``)."""
        shape, stride, dtype, offset = spec
        # NOTE: storage_offset and requires_grad only when not the default: each keyword
        # costs _make_wrapper_subclass ~0.2 us, on every op.
        if offset:
            r = _make_wrapper(TpuTensor, shape, strides=stride, storage_offset=offset,
                              dtype=dtype, device=DEVICE)
        else:
            r = _make_wrapper(TpuTensor, shape, strides=stride, dtype=dtype, device=DEVICE)
        r._spec = spec
        r._st = st
        if chain is not None:
            r._chain = chain
            r._cache = cache
            r._cver = cver
        return r

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError("lazyrt: the dispatcher is not installed (import lazyrt)")

    # ---- storage identity (see the module docstring) ----------------------------

    def untyped_storage(self) -> torch.UntypedStorage:
        return _stamped_storage(self)

    def data_ptr(self) -> int:
        if not _SWAP_DATA_PTR:
            return storage_identity(self._st)[0] + self.storage_offset() * self.element_size()
        _stamped_storage(self)
        return _C_data_ptr(self)

    # ---- host-side conveniences -------------------------------------------------

    def __repr__(self, *, tensor_contents=None) -> str:
        return _repr(self)

    __str__ = __repr__

    def __format__(self, spec):
        if self.dim() == 0 and not self.is_meta:
            return self.item().__format__(spec)
        return object.__format__(self, spec)

    def tolist(self):
        return self.cpu().tolist()

    def numpy(self, *, force: bool = False):
        if force:
            return self.detach().cpu().numpy()
        raise TypeError(
            f"can't convert {self.device} device type tensor to numpy. "
            "Use Tensor.cpu() to copy the tensor to host memory first.")

    def __array__(self, dtype=None, copy=None):
        return self.numpy()

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        with torch.no_grad():
            new = self.clone()
        if getattr(self, "_is_param", False):
            new = torch.nn.Parameter(new, requires_grad=self.requires_grad)
        else:
            new.requires_grad_(self.requires_grad)
        if self.grad is not None:
            new.grad = self.grad.__deepcopy__(memo)
        memo[id(self)] = new
        return new

    # __reduce_ex__ (pickling, torch.save): lazyrt._torch.serialization installs it.

    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
        # AOTAutograd (torch.compile) checks each runtime tangent against the plain tensor
        # it traced with; a tpu tensor is one.
        return self

    @property
    def data(self):
        return self.detach()

    @data.setter
    def data(self, other):
        if not isinstance(other, TpuTensor):
            raise RuntimeError(
                f"data set to a tensor that requires gradients must be a tpu tensor; "
                f"got a tensor on {other.device}")
        self._rebind(other)

    def _rebind(self, other: TpuTensor) -> None:
        """Make this same Python object alias ``other`` (sizes, strides, storage, view)."""
        torch._C.TensorBase.data.__set__(self, other)
        self._spec = other._spec
        self._st = other._st
        self._chain = other._chain
        self._cache = other._cache
        self._cver = other._cver


def _repr(t: TpuTensor) -> str:
    """PyTorch's tensor printing of a CPU copy, with the tpu device and grad suffixes."""
    from torch import _tensor_str as ts

    prefix = "tensor("
    indent = len(prefix)
    suffixes = [f"device='{t.device}'"]
    with torch.no_grad():
        c = t.detach().cpu()
    if c.numel() == 0:
        if c.dim() != 1:
            suffixes.append("size=" + str(tuple(c.shape)))
        body = "[]"
    else:
        body = ts._tensor_str(c, indent)
    default_complex = torch.cdouble if torch.get_default_dtype() == torch.double else torch.cfloat
    if t.dtype not in (torch.get_default_dtype(), default_complex, torch.int64, torch.bool):
        suffixes.append("dtype=" + str(t.dtype))
    if t.grad_fn is not None:
        name = type(t.grad_fn).__name__
        if name == "CppFunction":
            name = t.grad_fn.name().rsplit("::", 1)[-1]
        suffixes.append(f"grad_fn=<{name}>")
    elif t.requires_grad:
        suffixes.append("requires_grad=True")
    return ts._add_suffixes(prefix + body, suffixes, indent, force_newline=False)

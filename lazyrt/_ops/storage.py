"""``resize_`` and ``set_``: a tpu tensor's storage changed or shared in place (``special``'s
part for storage; a tpu storage is a JAX array rebound by writes, ``_base.tensor``)."""
from __future__ import annotations

import torch

from .._base.tensor import TpuTensor, contiguous_spec, storage_at, storage_dtype
from .args import to_meta
from .handlers import restride

aten = torch.ops.aten


def resize_(e, args, kwargs):
    """``t.resize_(size)``: PyTorch's checks and new strides (its meta kernel's), then the
    storage reinterpreted at ``t``'s offset (``_handlers.restride``)."""
    self, size = args[0], tuple(args[1])
    fmt = args[2] if len(args) > 2 else kwargs.get("memory_format")
    m = to_meta(self).resize_(size, memory_format=fmt)
    if tuple(m.shape) == tuple(self.shape) and tuple(m.stride()) == tuple(self.stride()):
        return self
    restride(self, tuple(m.shape), tuple(m.stride()))
    return self


def resize_as_(e, args, kwargs):
    self, template = args[0], args[1]
    fmt = args[2] if len(args) > 2 else kwargs.get("memory_format")
    resize_(e, (self, tuple(template.shape)), {})
    if fmt is not None:
        if fmt is torch.preserve_format:
            fmt = torch._prims_common.suggest_memory_format(template)
        stride = torch.empty(tuple(self.shape), memory_format=fmt, device="meta").stride()
        if tuple(stride) != tuple(self.stride()):
            restride(self, tuple(self.shape), tuple(stride))
    return self


def _set_check(self, src):
    if src.dtype != self.dtype:
        raise RuntimeError(f"Could not set tensor of type {_type_name(src.dtype)} to a tensor "
                           f"of type {_type_name(self.dtype)}")
    if not isinstance(src, TpuTensor):
        raise RuntimeError(f"Expected a tpu tensor as the source of set_, got one on {src.device}")


def _type_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def set_source(e, args, kwargs):
    """``t.set_(src)``: ``t`` shares ``src``'s storage, sizes, strides and offset."""
    self, src = args[0], args[1]
    _set_check(self, src)
    self._rebind(src)
    return self


def _alias(storage, dtype, offset, size, stride) -> TpuTensor:
    """The tpu tensor of ``dtype``, ``offset``, ``size`` and ``stride`` on ``storage`` (a tpu
    storage object, found by its address while a tensor of it lives). Read in another dtype
    (bytes), it is the storage's values reinterpreted, as one run."""
    st, skip = storage_at(storage.data_ptr()) if storage.device.type == "tpu" else (None, 0)
    if st is None:
        raise RuntimeError(f"lazyrt: a tpu tensor on a storage on {storage.device} that no "
                           "live tpu tensor has (a tpu storage holds no bytes of its own)")
    size1 = dtype.itemsize
    if skip % size1:
        raise NotImplementedError(f"lazyrt: a tpu storage slice at byte {skip} read as {dtype}")
    offset += skip // size1
    size, stride = tuple(size), tuple(stride)
    root = TpuTensor._wrap(contiguous_spec(st.value.shape, storage_dtype(st)), st)
    if root.dtype == dtype:
        return aten.as_strided.default(root, size, stride, offset)
    if len(size) == 1 and (stride == (1,) or size[0] <= 1):
        flat = aten.view.dtype(aten.view.default(root, [-1]), dtype)
        return aten.slice.Tensor(flat, 0, offset, offset + size[0])
    raise NotImplementedError(
        f"lazyrt: a {root.dtype} tpu storage read as {dtype} with sizes {list(size)} and "
        f"strides {list(stride)}: only its values as one run of {dtype} are supported")


def over_storage(t: torch.Tensor) -> TpuTensor:
    """A plain tensor C++ made on a tpu storage's address (``at::from_blob``, as the legacy
    serializer does) as the tpu tensor it reads."""
    return _alias(t.untyped_storage(), t.dtype, t.storage_offset(), t.shape, t.stride())


def set_storage(e, args, kwargs):
    """``t.set_(storage[, offset, size, stride])`` with a tpu tensor's storage (what storage
    methods and TorchScript's serializer do): ``t`` aliases that tensor's storage."""
    self, source = args[0], args[1]
    rest = list(args[2:]) + [kwargs[k] for k in ("storage_offset", "size", "stride") if k in kwargs]
    if not rest:
        rest = (0, (source.nbytes() // self.element_size(),), (1,))
    self._rebind(_alias(source, self.dtype, *rest))
    return self


def is_set_to(e, args, kwargs):
    """Whether both tensors are the same storage, offset, sizes and strides."""
    a, b = args[0], args[1]
    return (isinstance(b, TpuTensor) and a._st is b._st and a._spec == b._spec
            and a._chain == b._chain)


def set_empty(e, args, kwargs):
    """``t.set_()``: an empty tensor on a new storage."""
    self = args[0]
    self._rebind(aten.empty.memory_format([0], dtype=self.dtype, device=self.device))
    return self


def special_handlers() -> dict:
    """op -> handler, merged into ``special.SPECIAL``."""
    return {
        aten.resize_.default: resize_,
        aten.resize_as_.default: resize_as_,
        aten.set_.source_Tensor: set_source,
        aten.set_.source_Storage: set_storage,
        aten.set_.source_Storage_storage_offset: set_storage,
        aten.set_.default: set_empty,
        aten.is_set_to.default: is_set_to,
    }

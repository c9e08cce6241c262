"""Ops the generic handlers cannot express: host transfers, host-visible results, and
boolean-mask indexing. ``SPECIAL`` maps each to its handler; the resolver gives it
precedence over everything else (the op's lowering, if any, stays on the entry as
``entry.fn`` for the handler to use).
"""
from __future__ import annotations

import torch

from .._base import dtypes as _dtypes
from .._base import source as _source
from .._base.config import config
from .._base.ir import Pending
from .._base.tensor import TpuTensor, contiguous_spec, storage_at
from .._exec import asserts as _asserts
from .._exec import defer as _defer
from .._exec.values import (
    concrete,
    from_cpu,
    host_to_device,
    new_tensor,
    run,
    to_cpu,
    to_host,
    value,
    write,
)
from . import append as _append
from .args import to_meta
from .handlers import functional, mutating, restride, via_functional

aten = torch.ops.aten


def to_copy(e, args, kwargs):
    """``_to_copy``: to another device (a host transfer) or a dtype/layout change on tpu."""
    x = args[0]
    dev = kwargs.get("device")
    if dev is not None and torch.device(dev).type != "tpu":
        c = to_cpu(x)
        dtype = kwargs.get("dtype")
        if dtype is not None and dtype != c.dtype:
            c = c.to(dtype)
        mf = kwargs.get("memory_format")
        if mf is not None and mf is not torch.preserve_format:
            c = c.contiguous(memory_format=mf)
        return c.to(dev) if torch.device(dev).type != "cpu" else c
    kw = dict(kwargs)
    kw.pop("non_blocking", None)
    g = _append.whole(x) if type(x) is TpuTensor and x._chain is not None else None
    if g is not None and set(kw) <= {"dtype", "device"}:
        # a cast of a grown tensor: of its buffer, and the result grows as it did
        return _append.grown_view(functional(e, [_append.root(x)], kw), g.dim, x.shape[g.dim])
    return functional(e, [x], kw)


def copy_(e, args, kwargs):
    dst, src = args[0], args[1]
    if not isinstance(dst, TpuTensor):
        # tpu -> cpu (or another device)
        if not isinstance(src, TpuTensor):
            src = _over_storage(src)  # made in C++ on a tpu storage's address (from_blob)
        dst.copy_(to_cpu(src))
        return dst
    if isinstance(src, TpuTensor):
        return mutating(e, args, kwargs)
    # host -> tpu: one transfer, then the same broadcast/cast rule
    if src.device.type == "meta":
        raise NotImplementedError("Cannot copy out of meta tensor; no data!")
    if _replaces_whole(dst, src):
        # ``x.to("tpu")``: the transfer IS the new value of dst's whole storage; nothing
        # to compute. In defer mode the ``empty`` that made dst is unrecorded too, so a
        # tensor moved before a loop is not part of the first step's program.
        with _defer.LOCK:
            old = dst._st.value
            write(dst, host_to_device(src.detach()))
            if type(old) is Pending:
                _defer.forget_last(old)
        return dst
    return mutating(e, (dst, from_cpu(src.detach())) + tuple(args[2:]), kwargs)


def _replaces_whole(dst: TpuTensor, src: torch.Tensor) -> bool:
    """Whether copying the CPU tensor ``src`` into ``dst`` overwrites all of dst's storage
    with src's values as they are: same shape and dtype, and dst a base tensor (its
    storage holds its own value, whatever its strides)."""
    shape = dst._spec[0]
    return (dst._chain is None and src.dtype == dst.dtype and tuple(src.shape) == shape
            and dst._spec[3] == 0 and tuple(dst._st.value.shape) == shape)


def cat(e, args, kwargs):
    """``torch.cat``; appending to a grown tensor (integer/bool, or floating with gradients
    off) goes through its buffer (``_append``: the programs do not change with its length)."""
    ts = args[0] if args else kwargs["tensors"]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    d = _append.appendable(ts[0], ts[1], dim) if len(ts) == 2 else None
    if d is None:
        return functional(e, args, kwargs)
    x, y = ts
    g = _append.whole(x)
    if g is None or g.dim != d:
        return _append.mark(functional(e, args, kwargs), d)
    m = x.shape[d] + y.shape[d]
    cap = x._st.value.shape[d] if g.chain is not None else 0
    if m <= cap:  # room left: the buffer less its first k, then the piece
        head = aten.slice.Tensor(_append.root(x), d, y.shape[d], cap)
    else:  # the first buffer, or the next bucket: x right-aligned in it
        cap = _append.bucket(m)
        head = aten.constant_pad_nd.default(x, [0, 0] * (x.dim() - 1 - d) + [cap - m, 0], 0)
    return _append.grown_view(functional(e, ([head, y], d), {}), d, m)


def constant_pad_nd(e, args, kwargs):
    """``F.pad``; the end of a grown tensor's dim padded to a fixed length is one program
    for every length it had (``_append.pad_right``)."""
    x = args[0]
    pad = args[1] if len(args) > 1 else kwargs["pad"]
    value = args[2] if len(args) > 2 else kwargs.get("value", 0)
    p = _append.pad_right(x, pad, value) if type(x) is TpuTensor else None
    if p is None:
        return functional(e, args, kwargs)
    prog, n = p
    return new_tensor(run(prog, [x._st.value], [n])[0])


def sdpa_fused(e, args, kwargs):
    """The fused SDPA op (``F.scaled_dot_product_attention`` on tpu); with gradients off,
    keys and values grown by ``torch.cat`` along the sequence (a decoding KV cache) are
    read as their whole buffers with a mask of their length (``_append.sdpa_keys``)."""
    bias = args[3] if len(args) > 3 else kwargs.get("attn_bias")
    dropout = args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)
    causal = args[5] if len(args) > 5 else kwargs.get("is_causal", False)
    if bias is not None or dropout or causal or torch.is_grad_enabled() \
            or type(args[1]) is not TpuTensor or type(args[2]) is not TpuTensor:
        return functional(e, args, kwargs)
    kv = _append.sdpa_keys(args[1], args[2])
    if kv is None:
        return functional(e, args, kwargs)
    n, k, v = kv
    mask = new_tensor(run(_append.valid_mask_prog(k.shape[2]), [], [n])[0])
    debug = args[6] if len(args) > 6 else kwargs.get("return_debug_mask", False)
    out = functional(e, (args[0], k, v, mask, 0.0, False, debug),
                     {"scale": kwargs["scale"]} if "scale" in kwargs else {})
    # the length the caller gave (max_k), not the buffer's
    return out[:5] + (n,) + out[6:]


def _new_factory(factory):
    """``x.new_zeros(size)`` and friends: the factory with ``x``'s dtype and device; no
    program depends on ``x``'s shape or layout."""

    def handler(e, args, kwargs):
        x = args[0]
        kw = dict(kwargs)
        if kw.get("dtype") is None:
            kw["dtype"] = x.dtype
        if kw.get("device") is None:
            kw["device"] = x.device
        return factory(*args[1:], **kw)

    return handler


def local_scalar_dense(e, args, kwargs):
    t = args[0]
    arr = to_host(concrete(t))
    v = arr.reshape(()).item()
    if t.dtype == torch.bool:
        return bool(v)
    if t.dtype.is_floating_point:
        return float(v)
    if t.dtype.is_complex:
        return complex(v)
    return int(v)


def equal(e, args, kwargs):
    a, b = args
    if a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return bool(aten.eq.Tensor(a, b).all().item())


def allclose(e, args, kwargs):
    a, b = args[0], args[1]
    rest = dict(zip(("rtol", "atol", "equal_nan"), args[2:]))
    rest.update(kwargs)
    return bool(aten.isclose.default(a, b, **rest).all().item())


def is_nonzero(e, args, kwargs):
    t = args[0]
    n = t.numel()
    if n == 0:
        raise RuntimeError("Boolean value of Tensor with no values is ambiguous")
    if n > 1:
        raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
    return bool(local_scalar_dense(e, (t,), {}))


def _bool_to_long_indices(indices):
    """PyTorch's expandTensors: a bool/uint8 mask index becomes its nonzero coordinates."""
    out = []
    for idx in indices:
        if idx is not None and idx.dtype in (torch.bool, torch.uint8):
            nz = aten.nonzero.default(idx if isinstance(idx, TpuTensor) else idx.to("tpu"))
            for j in range(idx.dim()):
                out.append(aten.select.int(nz, 1, j))
        else:
            out.append(idx)
    return out


def index(e, args, kwargs):
    x, indices = args[0], args[1]
    return functional(e, (x, _bool_to_long_indices(indices)) + tuple(args[2:]), kwargs)


def index_put(e, args, kwargs):
    x, indices, values = args[0], args[1], args[2]
    rest = tuple(args[3:])
    # x[mask] = scalar-like: a where(), no sync.
    if (len(indices) == 1 and indices[0] is not None and indices[0].dtype == torch.bool
            and isinstance(indices[0], TpuTensor) and values.numel() == 1
            and tuple(indices[0].shape) == tuple(x.shape[: indices[0].dim()])):
        accumulate = rest[0] if rest else kwargs.get("accumulate", False)
        if not accumulate:
            mask = indices[0]
            for _ in range(x.dim() - mask.dim()):
                mask = aten.unsqueeze.default(mask, -1)
            v = values if isinstance(values, TpuTensor) else from_cpu(values)
            v = aten.reshape.default(v, []) if v.dim() else v
            newv = aten.where.self(mask, aten._to_copy.default(v, dtype=x.dtype), x)
            if e.mut:
                return aten.copy_.default(x, newv)
            return newv
    handler = mutating if e.mut else functional
    return handler(e, (x, _bool_to_long_indices(indices), values) + rest, kwargs)


def is_pinned(e, args, kwargs):
    return False


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
    root = TpuTensor._wrap(contiguous_spec(st.value.shape, _dtypes.to_torch(st.value.dtype)), st)
    if root.dtype == dtype:
        return aten.as_strided.default(root, size, stride, offset)
    if len(size) == 1 and (stride == (1,) or size[0] <= 1):
        flat = aten.view.dtype(aten.view.default(root, [-1]), dtype)
        return aten.slice.Tensor(flat, 0, offset, offset + size[0])
    raise NotImplementedError(
        f"lazyrt: a {root.dtype} tpu storage read as {dtype} with sizes {list(size)} and "
        f"strides {list(stride)}: only its values as one run of {dtype} are supported")


def _over_storage(t: torch.Tensor) -> TpuTensor:
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


def det_of_strided(e, args, kwargs):
    """``_linalg_det``/``_linalg_slogdet`` of a non-contiguous real tensor: PyTorch factors
    A itself there (A^T when contiguous, which the lowering does), so the lowering gets the
    transposed view; the determinant is the same."""
    a = args[0]
    if not a.is_contiguous() and not a.is_complex() and a.dim() >= 2:
        return functional(e, (aten.transpose.int(a, -2, -1),) + tuple(args[1:]), kwargs)
    return functional(e, args, kwargs)


def pack_padded_sequence(e, args, kwargs):
    """``_pack_padded_sequence`` as ATen's kernel: the rows of each time step that are
    still running, step after step; ``batch_sizes`` on the CPU (it is read on the host,
    by the RNN kernels and ``pad_packed_sequence``)."""
    inp, lengths, batch_first = args[0], args[1], args[2]
    x = aten.transpose.int(inp, 0, 1) if batch_first else inp
    lens = (to_cpu(lengths) if isinstance(lengths, TpuTensor) else lengths).tolist()
    batch = x.shape[1]
    if x.numel() == 0:
        raise RuntimeError("Cannot pack empty tensors.")
    if len(lens) != batch:
        raise RuntimeError(f"Expected `len(lengths)` to be equal to batch_size, but got "
                           f"{len(lens)} (batch_size={batch})")
    if lens[-1] <= 0:
        raise RuntimeError("Length of all samples has to be greater than 0, but found an "
                           "element in 'lengths' that is <= 0")
    if any(a < b for a, b in zip(lens, lens[1:])):
        raise RuntimeError(
            "`lengths` array must be sorted in decreasing order when `enforce_sorted` is "
            "True. You can pass `enforce_sorted=False` to pack_padded_sequence and/or "
            "pack_sequence to sidestep this requirement if you do not need ONNX "
            "exportability.")
    steps, sizes, prev = [], [], 0
    for i in range(batch):
        n = lens[batch - 1 - i]
        if n > prev:
            block = aten.slice.Tensor(aten.slice.Tensor(x, 0, prev, n), 1, 0, batch - i)
            steps.append(aten.reshape.default(block, [-1, *x.shape[2:]]))
            sizes += [batch - i] * (n - prev)
            prev = n
    return aten.cat.default(steps), torch.tensor(sizes, dtype=torch.int64)


def record_stream(e, args, kwargs):
    return None


def _scalars_read(op, name: str):
    """``linspace``/``logspace`` with tensor endpoints, as ATen's composite kernel: each
    endpoint must be 0-d; its value is read (a sync point) and the Scalar overload runs on
    whatever device ``device=`` names."""

    def handler(e, args, kwargs):
        start, end = args[0], args[1]
        dims = [f"{what} with {t.dim()} dimension(s)" for what, t in (("start", start), ("end", end))
                if isinstance(t, torch.Tensor)]
        if any(t.dim() for t in (start, end) if isinstance(t, torch.Tensor)):
            raise RuntimeError(f"{name} only supports 0-dimensional start and end tensors, "
                               f"but got {' and '.join(dims)}.")
        start = start.item() if isinstance(start, torch.Tensor) else start
        end = end.item() if isinstance(end, torch.Tensor) else end
        return op(start, end, *args[2:], **kwargs)

    return handler


_ASSERT_MSG = "Expected Tensor with single nonzero value, but got zero"


def assert_async(e, args, kwargs):
    """``torch._assert_async(cond[, msg])`` (and ``_functional_assert_async``, which returns
    a copy of its ``dep_token``): the condition is read at the next sync point, or at once
    in debug mode (``_exec.asserts``); its element count is checked here, as PyTorch does."""
    cond = args[0]
    msg = args[1] if len(args) > 1 else kwargs.get("assert_msg", _ASSERT_MSG)
    n = cond.numel()
    if n != 1:
        what = "no values" if n == 0 else "more than one value"
        raise RuntimeError(f"Boolean value of Tensor with {what} is ambiguous")
    where = f"{e.name} at {_source.user_line(2)}"
    if config.mode == "debug":
        _asserts.check_now(concrete(cond), msg, where)
    else:
        _asserts.add(new_tensor(value(cond))._st, msg, where)
    if e.n_returns:
        dep = args[2] if len(args) > 2 else kwargs["dep_token"]
        return aten.clone.default(dep)
    return None


def _scalar_type_name(dtype: torch.dtype) -> str:
    """PyTorch's C++ name of a dtype in its messages: ``Float``, ``Long``, ``ComplexDouble``."""
    return torch.empty(0, dtype=dtype).type()[len("torch."):-len("Tensor")]


def nonzero_out(e, args, kwargs):
    """``nonzero(x, out=t)``: PyTorch's checks of ``t`` (on ``x``'s device, Long), then
    the op, copied into ``t``."""
    self, out = args[0], kwargs["out"]
    if out.device != self.device:
        raise RuntimeError(f"expected self and out to be on the same device, but got out on "
                           f"{out.device} and self on {self.device}")
    if out.dtype != torch.long:
        raise RuntimeError(f"nonzero: Expected out tensor to have scalar type Long but got scalar "
                           f"type{_scalar_type_name(out.dtype)}")
    return via_functional(e, args, kwargs)


def sparse_dim(e, args, kwargs):
    """A tpu tensor is strided: no sparse dims (PyTorch's ``sparse_dim_default``)."""
    return 0


def dense_dim(e, args, kwargs):
    return args[0].dim()


def no_such_backend(e, args, kwargs):
    """Sparse and quantized tensors do not exist on tpu: PyTorch's own error for a backend
    without the op's kernel, raised at the op (the CPU fallback would hand back a CPU
    sparse or quantized tensor, so it is not offered)."""
    raise NotImplementedError(
        f"Could not run '{e.op._schema.name}' with arguments from the 'tpu' backend. This could "
        f"be because the operator doesn't exist for this backend, or was omitted during the "
        f"selective/custom build process (if using custom build). (lazyrt: tpu has no sparse or "
        f"quantized tensors.)")


def clamp_checked(e, args, kwargs):
    """``clamp`` with neither bound: PyTorch's RuntimeError (the meta kernel, a Python ref,
    raises ValueError)."""
    lo = args[1] if len(args) > 1 else kwargs.get("min")
    hi = args[2] if len(args) > 2 else kwargs.get("max")
    if lo is None and hi is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    return (mutating if e.mut else functional)(e, args, kwargs)


_NO_BACKEND = [aten.quantize_per_tensor.default, aten.quantize_per_tensor.tensor_qparams,
               aten.quantize_per_tensor.tensors, aten.quantize_per_channel.default,
               aten.quantize_per_tensor_dynamic.default, aten._to_sparse.default,
               aten._to_sparse.sparse_dim, aten._to_sparse_csr.default, aten._to_sparse_csc.default,
               aten._to_sparse_bsr.default, aten._to_sparse_bsc.default]
_CLAMP = [aten.clamp.default, aten.clamp.Tensor, aten.clamp_.default, aten.clamp_.Tensor,
          aten.clamp.out, aten.clamp.Tensor_out]


SPECIAL = {
    aten._assert_async.default: assert_async,
    aten._assert_async.msg: assert_async,
    aten._functional_assert_async.msg: assert_async,
    aten._to_copy.default: to_copy,
    aten.copy_.default: copy_,
    aten.cat.default: cat,
    aten.constant_pad_nd.default: constant_pad_nd,
    aten._scaled_dot_product_fused_attention_overrideable.default: sdpa_fused,
    aten.new_zeros.default: _new_factory(aten.zeros.default),
    aten.new_ones.default: _new_factory(aten.ones.default),
    aten.new_empty.default: _new_factory(aten.empty.memory_format),
    aten.new_full.default: _new_factory(aten.full.default),
    aten.new_empty_strided.default: _new_factory(aten.empty_strided.default),
    aten._local_scalar_dense.default: local_scalar_dense,
    aten.equal.default: equal,
    aten.allclose.default: allclose,
    aten.is_nonzero.default: is_nonzero,
    aten.is_pinned.default: is_pinned,
    aten.resize_.default: resize_,
    aten.resize_as_.default: resize_as_,
    aten.record_stream.default: record_stream,
    aten.set_.source_Tensor: set_source,
    aten.set_.source_Storage: set_storage,
    aten.set_.source_Storage_storage_offset: set_storage,
    aten.set_.default: set_empty,
    aten.is_set_to.default: is_set_to,
    aten._linalg_det.default: det_of_strided,
    aten._pack_padded_sequence.default: pack_padded_sequence,
    aten._linalg_slogdet.default: det_of_strided,
    aten.linspace.Tensor_Tensor: _scalars_read(aten.linspace.default, "linspace"),
    aten.linspace.Tensor_Scalar: _scalars_read(aten.linspace.default, "linspace"),
    aten.linspace.Scalar_Tensor: _scalars_read(aten.linspace.default, "linspace"),
    aten.logspace.Tensor_Tensor: _scalars_read(aten.logspace.default, "logspace"),
    aten.logspace.Tensor_Scalar: _scalars_read(aten.logspace.default, "logspace"),
    aten.logspace.Scalar_Tensor: _scalars_read(aten.logspace.default, "logspace"),
    aten.index.Tensor: index,
    aten.index_put.default: index_put,
    aten.index_put_.default: index_put,
    aten.nonzero.out: nonzero_out,
    aten.sparse_dim.default: sparse_dim,
    aten.dense_dim.default: dense_dim,
    **dict.fromkeys(_NO_BACKEND, no_such_backend),
    **dict.fromkeys(_CLAMP, clamp_checked),
}

"""Ops the generic handlers cannot express: host transfers, host-visible results, and
boolean-mask indexing. ``SPECIAL`` maps each to its handler; the resolver gives it
precedence over everything else (the op's lowering, if any, stays on the entry as
``entry.fn`` for the handler to use).
"""
from __future__ import annotations

import warnings

import torch

from .._base import source as _source
from .._base.config import config
from .._base.dtypes import scalar_type_name
from .._base.ir import Pending
from .._base.tensor import TpuTensor
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
from . import bounds as _bounds
from . import checks as _checks
from . import int_checks as _int_checks
from . import narrow_views as _narrow_views
from . import positions as _positions
from . import random_checks as _random_checks
from . import storage as _storage
from .handlers import functional, mutating

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
            src = _storage.over_storage(src)  # made in C++ on a tpu storage's address (from_blob)
        dst.copy_(to_cpu(src))
        return dst
    if isinstance(src, TpuTensor):
        before = dst._st.version
        out = mutating(e, args, kwargs)
        _bounds.note_host_write(dst, before, src)
        return out
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
            _bounds.note_transfer(dst, src)
            if type(old) is Pending:
                _defer.forget_last(old)
        return dst
    before = dst._st.version
    out = mutating(e, (dst, from_cpu(src.detach())) + tuple(args[2:]), kwargs)
    _bounds.note_host_write(dst, before, src)
    return out


def _constant_factory(value_of):
    """``zeros``/``ones``/``full``: as lowered, and an integer result's values noted as
    known on the host (an index made so and then edited is checked at the op)."""

    def handler(e, args, kwargs):
        out = functional(e, args, kwargs)
        if type(out) is TpuTensor:
            _bounds.note_constant(out, value_of(args, kwargs))
        return out

    return handler


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


_UINT8_MASK = ("indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool "
               "instead.")


def _warn_at_user(msg):
    """A ``UserWarning`` at the user's line, as ATen's ``TORCH_WARN`` (the Python frame that
    called the op): two indexings on two lines warn twice under the default filter."""
    f = _source.user_frame(2)
    if f is None:
        warnings.warn(msg, UserWarning, stacklevel=3)
        return
    g = f.f_globals
    warnings.warn_explicit(msg, UserWarning, f.f_code.co_filename, f.f_lineno,
                           module=g.get("__name__"), registry=g.setdefault("__warningregistry__", {}),
                           module_globals=g)


def _bool_to_long_indices(indices):
    """PyTorch's expandTensors: a bool/uint8 mask index becomes its nonzero coordinates."""
    out = []
    for idx in indices:
        if idx is not None and idx.dtype in (torch.bool, torch.uint8):
            if idx.dtype == torch.uint8:
                _warn_at_user(_UINT8_MASK)
            nz = aten.nonzero.default(idx if isinstance(idx, TpuTensor) else idx.to("tpu"))
            for j in range(idx.dim()):
                out.append(aten.select.int(nz, 1, j))
        else:
            out.append(idx)
    return out


def index(e, args, kwargs):
    """``x[indices]``: the integer indices checked against their dims (``_bounds``)."""
    x, indices = args[0], args[1]
    checks = _bounds.index_checks(x, indices)
    return _bounds.run_checked(e, (x, _bool_to_long_indices(indices)) + tuple(args[2:]), kwargs,
                               checks)


def index_put(e, args, kwargs):
    x, indices, values = args[0], args[1], args[2]
    rest = tuple(args[3:])
    if values.dtype != x.dtype:  # ATen's index_put_ (``x[i] = v`` too): no cast
        raise RuntimeError(
            "Index put requires the source and destination dtypes match, got "
            f"{scalar_type_name(x.dtype)} for the destination and "
            f"{scalar_type_name(values.dtype)} for the source.")
    checks = _bounds.index_checks(x, indices)
    # x[mask] = v, v one value or a row of x's trailing dims: a where(), no sync and one
    # program per shape (a mask's nonzero count would make a new program per count)
    mask = indices[0] if len(indices) == 1 else None
    if mask is not None and mask.dtype == torch.bool and tuple(mask.shape) == tuple(x.shape[:mask.dim()]):
        rest_shape = tuple(x.shape[mask.dim():])
        vs = tuple(values.shape)
        if len(vs) == len(rest_shape) + 1 and vs[0] == 1:
            vs = vs[1:]  # (values broadcast to the result [n, *rest_shape])
        accumulate = rest[0] if rest else kwargs.get("accumulate", False)
        fits = len(vs) <= len(rest_shape) and all(
            a in (1, b) for a, b in zip(reversed(vs), reversed(rest_shape)))
        if fits or (not accumulate and values.numel() == 1):
            return _masked_put(e, x, mask, values, accumulate)
    long_indices = _bool_to_long_indices(indices)
    if values.dim():
        _bounds.values_shape_check(x, long_indices, values)
    return _bounds.run_checked(e, (x, long_indices, values) + rest, kwargs, checks)



def _masked_put(e, x, mask, values, accumulate):
    """``index_put_(x, (mask,), values)`` for a bool mask over x's leading dims and values
    that broadcast to one masked row (or one value, not accumulating: ATen's ``masked_fill_``
path): ``where(mask, values, x)`` (``x + values`` where
    accumulating: each masked element is written once)."""
    if not isinstance(mask, TpuTensor):
        mask = from_cpu(mask)  # (a CPU mask indexes a tpu tensor, as on CUDA)
    v = values if isinstance(values, TpuTensor) else from_cpu(values)
    if not accumulate and v.numel() == 1:
        v = aten.reshape.default(v, [])  # (ATen: a masked_fill_, whatever the value's shape)
    elif v.dim() == x.dim() - mask.dim() + 1:
        v = aten.squeeze.dim(v, 0)  # (its size-1 leading dim, the masked rows')
    for _ in range(x.dim() - mask.dim()):
        mask = aten.unsqueeze.default(mask, -1)
    v = aten._to_copy.default(v, dtype=x.dtype)
    newv = aten.where.self(mask, aten.add.Tensor(x, v) if accumulate else v, x)
    if e.mut:
        return aten.copy_.default(x, newv)
    return newv


def is_pinned(e, args, kwargs):
    return False


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


def roll(e, args, kwargs):
    """``torch.roll``: its shifts are runtime positions (``_positions``)."""
    return functional(e, *_positions.roll_args(args, kwargs))


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


SPECIAL = {
    aten._assert_async.default: assert_async,
    aten._assert_async.msg: assert_async,
    aten._functional_assert_async.msg: assert_async,
    aten._to_copy.default: to_copy,
    aten.copy_.default: copy_,
    aten.cat.default: cat,
    aten.constant_pad_nd.default: constant_pad_nd,
    aten._scaled_dot_product_fused_attention_overrideable.default: sdpa_fused,
    aten.zeros.default: _constant_factory(lambda a, k: 0),
    aten.ones.default: _constant_factory(lambda a, k: 1),
    aten.full.default: _constant_factory(lambda a, k: a[1] if len(a) > 1 else k["fill_value"]),
    aten.scalar_tensor.default: _constant_factory(lambda a, k: a[0] if a else k["s"]),
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
    aten.record_stream.default: record_stream,
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
    **_bounds.special_handlers(),
    aten.roll.default: roll,
    **_checks.special_handlers(),
    **_storage.special_handlers(),
    **_narrow_views.special_handlers(),
    **_random_checks.special_handlers(),
    **_int_checks.special_handlers(),
}

for _op, _names in _int_checks.checked_scalar_ops().items():
    SPECIAL[_op] = _int_checks.scalar_checked(SPECIAL.get(_op), _names)
for _op in _int_checks.value_tensor_ops():
    SPECIAL[_op] = _int_checks.value_tensor_checked(SPECIAL.get(_op))

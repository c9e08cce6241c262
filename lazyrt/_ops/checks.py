"""Handlers that give an op PyTorch's own checks and errors where the lowering alone would
not (``special``'s part for conformance: PyTorch's device-generic tests, docs/conformance.md)."""
from __future__ import annotations

import math
import warnings

import torch

from .._base import source as _source
from .._base.config import config
from .._base.dtypes import scalar_type_name as _scalar_type_name
from .._exec import asserts as _asserts
from .._exec.values import concrete, new_tensor, value
from .handlers import functional, mutating, restride, via_functional

aten = torch.ops.aten


def require(e, ok, message: str) -> None:
    """ATen's check of a tensor's values: ``ok`` (one bool element) false raises
    ``RuntimeError(message)``; at once where ``ok`` is on the CPU, else by an asynchronous
    assert read at the next sync point (``_exec.asserts``; at once in debug mode), as
    CUDA's device-side assert."""
    if ok.device.type == "cpu":
        if not ok.item():
            raise RuntimeError(message)
        return
    where = f"{e.name} at {_source.user_line(3)}"
    if config.mode == "debug":
        _asserts.check_now(concrete(ok), message, where)
    else:
        _asserts.add(new_tensor(value(ok))._st, message, where)


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


# caffe2's TypeMeta names, as PyTorch's C++ checks print a dtype
_CXX_NAME = {torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
             torch.bfloat16: "c10::BFloat16", torch.int64: "long int", torch.int32: "int",
             torch.int16: "short int", torch.int8: "signed char", torch.uint8: "unsigned char",
             torch.bool: "bool", torch.complex64: "c10::complex<float>",
             torch.complex128: "c10::complex<double>"}


def frexp_out(e, args, kwargs):
    """``frexp(x, out=(mantissa, exponent))``: PyTorch's checks (mantissa of x's dtype,
    exponent int32; the meta kernel resizes or casts instead), then the op."""
    x = args[0]
    mant = kwargs.get("mantissa", args[1] if len(args) > 1 else None)
    expo = kwargs.get("exponent", args[2] if len(args) > 2 else None)
    if x.dtype.is_floating_point:
        if mant.dtype != x.dtype:
            raise RuntimeError(f"torch.frexp() expects mantissa to have dtype "
                               f"{_CXX_NAME.get(x.dtype, x.dtype)} but got "
                               f"{_CXX_NAME.get(mant.dtype, mant.dtype)}")
        if expo.dtype != torch.int32:
            raise RuntimeError(f"torch.frexp() expects exponent to have int dtype but got "
                               f"{_CXX_NAME.get(expo.dtype, expo.dtype)}")
    return mutating(e, args, kwargs)


def abs_inplace(e, args, kwargs):
    """``abs_`` of a complex tensor: PyTorch's error (the meta kernel's is about out dtypes)."""
    if args[0].dtype.is_complex:
        raise RuntimeError("In-place abs is not supported for complex tensors.")
    return mutating(e, args, kwargs)


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


def linspace_checked(e, args, kwargs):
    """``linspace``/``logspace`` with a complex endpoint and a real ``dtype``: ATen's
    RuntimeError, with its ``torch.linspace():`` prefix (the Python ref's lacks it)."""
    dtype = kwargs.get("dtype")
    if dtype is not None and not dtype.is_complex and any(isinstance(a, complex) for a in args[:2]):
        inferred = torch.complex128 if torch.get_default_dtype() == torch.float64 else torch.complex64
        raise RuntimeError(f"torch.{e.packet}(): inferred dtype {_CXX_NAME[inferred]} can't be safely "
                           f"cast to passed dtype {_scalar_type_name(dtype)}")
    return functional(e, args, kwargs)


def block_diag_checked(e, args, kwargs):
    """``block_diag``: ATen's checks and messages (the Python ref used as its decomposition
    words them differently), then the op."""
    tensors = args[0] if args else kwargs["tensors"]
    device = tensors[0].device if tensors else None
    for i, t in enumerate(tensors):
        if t.dim() > 2:
            raise RuntimeError(f"torch.block_diag: Input tensors must have 2 or fewer dimensions. "
                               f"Input {i} has {t.dim()} dimensions")
        if t.device != device:
            raise RuntimeError(f"torch.block_diag: input tensors must all be on the same device. "
                               f"Input 0 is on device {device} and input {i} is on device {t.device}")
    from torch._decomp import decomposition_table

    return decomposition_table[aten.block_diag.default](*args, **kwargs)


_OVERLAP = ("unsupported operation: more than one element of the written-to tensor refers to a "
            "single memory location. Please clone() the tensor before performing the operation.")


def range_factory_out(e, args, kwargs):
    """``arange``/``range``/``linspace``/``logspace`` with ``out=``, as ATen's range
    factories: computed in ``out``'s dtype; an ``out`` with as many elements as the result
    keeps its shape and strides and takes the values in its logical order (a
    non-contiguous ``out`` included); any other is resized to 1-D (``arange`` warns). The
    Python refs' ``out_wrapper`` would resize every ``out`` that is not 1-D."""
    out = kwargs["out"]
    _no_internal_overlap(out)
    op, head = _RANGE_OUT[e.op]
    if op is None:
        res = _range(*args).to(out.dtype)
    else:
        res = op(*head, *args, dtype=out.dtype, device=out.device)
    n = res.numel()
    if out.numel() != n:
        if e.op in (aten.arange.out, aten.arange.start_out) and out.numel() > 0:
            warnings.warn(
                f"The number of elements in the out tensor of shape {list(out.shape)} is "
                f"{out.numel()} which does not match the computed number of elements {n}. Note "
                f"that this may occur as a result of rounding error. The out tensor will be "
                f"resized to a tensor of shape ({n},).", UserWarning, stacklevel=2)
        restride(out, (n,), (1,))
    torch.ops.aten.copy_.default(out, res.reshape(out.shape))
    return out


def _no_internal_overlap(t) -> None:
    """ATen's ``assert_no_internal_overlap`` for a written-to tensor: an expanded dimension
    (stride 0, size > 1) writes one element twice."""
    if any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride())):
        raise RuntimeError(_OVERLAP)


def cat_out_checked(e, args, kwargs):
    """``cat(..., out=t)`` with an expanded ``t``: ATen's internal-overlap error."""
    _no_internal_overlap(kwargs["out"])
    return via_functional(e, args, kwargs)


def _range(start, end, step=1):
    """``torch.range``'s values, as ATen computes them: ``start + i * step`` in double for
    ``i`` up to ``floor((end - start) / step)``, with its checks (``aten.range`` itself
    calls ``range.out``)."""
    start, end, step = float(start), float(end), float(step)
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if not ((step > 0 and end >= start) or (step < 0 and end <= start)):
        raise RuntimeError("upper bound and larger bound inconsistent with step sign")
    n = int(math.floor((end - start) / step)) + 1
    return aten.arange.start_step(0, n, 1, dtype=torch.float64, device="tpu") * step + start


def all_any_out_checked(e, args, kwargs):
    """``all``/``any`` with ``out=``: ATen takes only a Bool (or Byte) result."""
    out = kwargs["out"]
    if out.dtype not in (torch.bool, torch.uint8):
        name = e.op._schema.name.split("::")[-1]
        raise RuntimeError(f"{name} only supports bool tensor for result, got: "
                           f"{_scalar_type_name(out.dtype)}")
    return via_functional(e, args, kwargs)


def arange_checked(e, args, kwargs):
    """``arange``: ATen's ``arange_check_bounds``, in its order (the meta kernel checks the
    step's sign first, with other words)."""
    vals = [float(v.real if isinstance(v, complex) else v) for v in args[:3]]
    start, end, step = ([0.0] + vals + [1.0])[:3] if len(vals) == 1 else (vals + [1.0])[:3]
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if not (math.isfinite(start) and math.isfinite(end)):
        raise RuntimeError(f"unsupported range: {start:g} -> {end:g}")
    if not ((step > 0 and end >= start) or (step < 0 and end <= start)):
        raise RuntimeError("upper bound and lower bound inconsistent with step sign")
    if (end - start) / step > 2.0 ** 63 - 1:
        raise RuntimeError("invalid size, possible overflow?")
    return functional(e, args, kwargs)


_COMPLEX_OF = {torch.float16: torch.complex32, torch.float32: torch.complex64,
               torch.float64: torch.complex128}


def complex_checked(e, args, kwargs):
    """``torch.complex``/``torch.polar`` (and their ``out=``): ATen's
    ``complex_check_dtype`` (the Python refs say "real must be floating point")."""
    a, b = args[0], args[1]
    if a.dtype not in _COMPLEX_OF or b.dtype not in _COMPLEX_OF:
        raise RuntimeError(f"Expected both inputs to be Half, Float or Double tensors but got "
                           f"{_scalar_type_name(a.dtype)} and {_scalar_type_name(b.dtype)}")
    if a.dtype != b.dtype:
        raise RuntimeError(f"Expected object of scalar type {_scalar_type_name(a.dtype)} but got "
                           f"scalar type {_scalar_type_name(b.dtype)} for second argument")
    out = kwargs.get("out")
    if out is not None and out.dtype != _COMPLEX_OF[a.dtype]:
        raise RuntimeError(f"Expected object of scalar type {_scalar_type_name(_COMPLEX_OF[a.dtype])} "
                           f"but got scalar type {_scalar_type_name(out.dtype)} for argument 'out'")
    return (mutating if e.mut else functional)(e, args, kwargs)


def zeros_ones_out(e, args, kwargs):
    """``torch.zeros(size, out=t)``/``ones``: ATen's ``zeros_out``/``ones_out``: ``t``
    resized to ``size`` (``resize_``, no warning), then filled."""
    out = kwargs["out"]
    out.resize_(list(args[0]))
    return out.zero_() if e.packet == "zeros" else out.fill_(1)


def rand_out(e, args, kwargs):
    """``torch.rand(size, out=t)``: ATen's ``rand_out``, ``t.resize_(size).uniform_(0, 1)``
    (what ``randn(out=)`` is already: a composite of ``resize_`` and ``normal_``); the same
    seed gives ``rand(size, dtype=t.dtype)``'s values."""
    out, gen = kwargs["out"], kwargs.get("generator", args[1] if len(args) > 1 else None)
    out.resize_(list(args[0]))
    return out.uniform_(0, 1, generator=gen)


_RANDPERM_LIMIT = {torch.float16: ((1 << 11) + 1, "2049 for Half"), torch.float32: ((1 << 24) + 1, "2^24+1 for Float"),
                   torch.float64: ((1 << 53) + 1, "2^53+1 for Double")}


def _randperm_check(n: int, dtype, out: bool = False) -> None:
    """ATen's ``check_supported_max_int_with_precision``: n - 1 must fit the result's dtype
    (and be exact in a float one)."""
    if n < 0:  # (ATen's randperm makes its result, sized n, first; randperm.out checks)
        raise RuntimeError(f"n must be non-negative, got{n}" if out else
                           f"Trying to create tensor with negative dimension {n}: [{n}]")
    if dtype in _RANDPERM_LIMIT:
        lim, text = _RANDPERM_LIMIT[dtype]
        if n > lim:
            raise RuntimeError(f"n cannot be greater than {text} type.")
    elif not dtype.is_floating_point and dtype != torch.bool and n - 1 > torch.iinfo(dtype).max:
        raise RuntimeError(f"n is too large for result tensor type: '{_scalar_type_name(dtype)}'")


def randperm_checked(e, args, kwargs):
    _randperm_check(args[0], kwargs.get("dtype") or torch.int64)
    return functional(e, args, kwargs)


def randperm_out(e, args, kwargs):
    """``torch.randperm(n, out=t)``: ``t`` resized to ``(n,)``, holding what ``randperm(n,
    dtype=t.dtype)`` draws (ATen's ``randperm_out``)."""
    out, n = kwargs["out"], args[0]
    _randperm_check(n, out.dtype, out=True)
    gen = kwargs.get("generator", args[1] if len(args) > 1 else None)
    if gen is None:
        r = aten.randperm.default(n, dtype=out.dtype, device=out.device)
    else:
        r = aten.randperm.generator(n, generator=gen, dtype=out.dtype, device=out.device)
    out.resize_([n])
    return out.copy_(r)


def heaviside_checked(e, args, kwargs):
    """``heaviside``: ATen takes one dtype only (the Python ref promotes)."""
    a, b = args[0], args[1]
    if isinstance(b, torch.Tensor) and a.dtype != b.dtype:
        raise RuntimeError("heaviside is not yet implemented for tensors with different dtypes.")
    return (mutating if e.mut else functional)(e, args, kwargs)


def pow_checked(e, args, kwargs):
    """``pow(x, k)`` of an integer (or bool) tensor to a negative integer Python scalar:
    ATen's error at the op (the lowering computes 0/1/-1 as for a tensor exponent, which
    ATen takes)."""
    a, k = args[0], args[1] if len(args) > 1 else kwargs["exponent"]
    if (not a.dtype.is_floating_point and not a.dtype.is_complex
            and isinstance(k, (int, bool)) and k < 0):
        raise RuntimeError("Integers to negative integer powers are not allowed.")
    return (mutating if e.mut else functional)(e, args, kwargs)


_POW_SCALAR = [aten.pow.Tensor_Scalar, aten.pow.Tensor_Scalar_out, aten.pow_.Scalar]
_HEAVISIDE = [aten.heaviside.default, aten.heaviside.out, aten.heaviside_.default]
_COMPLEX = [aten.complex.default, aten.complex.out, aten.polar.default, aten.polar.out]
_ARANGE = [aten.arange.default, aten.arange.start, aten.arange.start_step]
_ALL_ANY_OUT = [getattr(getattr(aten, n), ov) for n in ("all", "any")
                for ov in ("out", "dims_out", "all_out") if hasattr(getattr(aten, n), ov)]
_RANGE_OUT = {
    aten.arange.out: (aten.arange.start_step, (0,)),
    aten.arange.start_out: (aten.arange.start_step, ()),
    aten.range.out: (None, ()),
    aten.linspace.out: (aten.linspace.default, ()),
    aten.logspace.out: (aten.logspace.default, ()),
}
_NO_BACKEND = [aten.quantize_per_tensor.default, aten.quantize_per_tensor.tensor_qparams,
               aten.quantize_per_tensor.tensors, aten.quantize_per_channel.default,
               aten.quantize_per_tensor_dynamic.default, aten._to_sparse.default,
               aten._to_sparse.sparse_dim, aten._to_sparse_csr.default, aten._to_sparse_csc.default,
               aten._to_sparse_bsr.default, aten._to_sparse_bsc.default]
_CLAMP = [aten.clamp.default, aten.clamp.Tensor, aten.clamp_.default, aten.clamp_.Tensor,
          aten.clamp.out, aten.clamp.Tensor_out]


def special_handlers() -> dict:
    """op -> handler, merged into ``special.SPECIAL``."""
    return {
        aten.nonzero.out: nonzero_out,
        aten.frexp.Tensor_out: frexp_out,
        aten.abs_.default: abs_inplace,
        aten.sparse_dim.default: sparse_dim,
        aten.dense_dim.default: dense_dim,
        **dict.fromkeys(_NO_BACKEND, no_such_backend),
        **dict.fromkeys(_CLAMP, clamp_checked),
        aten.block_diag.default: block_diag_checked,
        aten.linspace.default: linspace_checked,
        aten.logspace.default: linspace_checked,
        aten.cat.out: cat_out_checked,
        **dict.fromkeys(_ARANGE, arange_checked),
        **dict.fromkeys(_COMPLEX, complex_checked),
        aten.zeros.out: zeros_ones_out,
        **dict.fromkeys(_HEAVISIDE, heaviside_checked),
        **dict.fromkeys(_POW_SCALAR, pow_checked),
        aten.randperm.out: randperm_out,
        aten.randperm.default: randperm_checked,
        aten.randperm.generator: randperm_checked,
        aten.randperm.generator_out: randperm_out,
        aten.rand.out: rand_out,
        aten.rand.generator_out: rand_out,
        aten.ones.out: zeros_ones_out,
        **dict.fromkeys(_ALL_ANY_OUT, all_any_out_checked),
        **dict.fromkeys(_RANGE_OUT, range_factory_out),
    }

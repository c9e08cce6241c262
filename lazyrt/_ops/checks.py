"""Handlers that give an op PyTorch's own checks and errors where the lowering alone would
not (``special``'s part for conformance: PyTorch's device-generic tests, docs/conformance.md)."""
from __future__ import annotations

import torch

from .handlers import functional, mutating, via_functional
from .handlers import scalar_type_name as _scalar_type_name

aten = torch.ops.aten


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
    }

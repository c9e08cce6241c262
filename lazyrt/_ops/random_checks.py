"""``random_``, ``uniform_`` and ``normal``: ATen's checks, messages and warnings (its
DistributionTemplates.h: ``random_impl``, ``random_from_to_impl``,
``check_from_to_in_range``, ``uniform_impl_``; the CPU kernels' dtype dispatch), then the
op. The values' ranges are the lowerings' (``lowering.random_ops``), which move ``from``
and ``to`` as ATen's ``update_from``/``update_to`` do."""
from __future__ import annotations

import sys
import warnings

import torch

from .._base.dtypes import scalar_type_name as _scalar_type_name
from .._base.source import is_library_file
from ..lowering import random_ops as _r
from .checks import require
from .handlers import functional, mutating

aten = torch.ops.aten

# caffe2 TypeMeta names, as ATen prints ``self.dtype()``
_META = {torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
         torch.bfloat16: "c10::BFloat16", torch.int64: "long int", torch.int32: "int",
         torch.int16: "short int", torch.int8: "signed char", torch.uint8: "unsigned char",
         torch.bool: "bool", torch.uint16: "short unsigned int", torch.uint32: "unsigned int",
         torch.uint64: "long unsigned int"}
_FP = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
       torch.float64: "float64"}
# AT_DISPATCH_ALL_TYPES_AND3(Half, BFloat16, Bool) of random_kernel_cpu
_RANDOM_KERNEL = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                            torch.float32, torch.float64, torch.float16, torch.bfloat16,
                            torch.bool})
# random_full_64_bits_range_kernel_cpu: AT_DISPATCH_ALL_TYPES_AND(BFloat16), then these
_FULL_DISPATCH = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                            torch.float32, torch.float64, torch.bfloat16})
_FULL_KERNEL = frozenset({torch.int64, torch.float64, torch.float32, torch.bfloat16})
_INTEGRAL = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                       torch.bool, torch.uint16, torch.uint32, torch.uint64})


def _not_implemented(kernel: str, dtype) -> NotImplementedError:
    return NotImplementedError(f'"{kernel}" not implemented for \'{_scalar_type_name(dtype)}\'')


def torch_warn(msg: str) -> None:
    """``TORCH_WARN``: a UserWarning attributed to the user's line that called the op."""
    f, level = sys._getframe(1), 2
    while f is not None and is_library_file(f.f_code.co_filename):
        f, level = f.f_back, level + 1
    warnings.warn(msg, UserWarning, stacklevel=level if f is not None else 2)


def _check_bounds(var, name, lo, hi, dtype) -> None:
    if not (var >= lo and var <= hi):
        raise RuntimeError(f"{name} is out of bounds for {_META[dtype]}")


def _warn_bounds(var, name, digits, dtype) -> None:
    if var < -(1 << digits) or var > (1 << digits):
        torch_warn(f"{name} is out of bounds [-(2^{digits}), 2^{digits}]. Due to precision "
                   f"limitations {_META[dtype]} can support discrete uniform distribution only "
                   f"within this range. This warning will become an error in version 1.7 "
                   f"release, please fix the code in advance")


def check_from_to_in_range(from_: int, to_inc: int, dtype) -> None:
    """ATen's ``check_from_to_in_range``."""
    if dtype in _FP:
        info = torch.finfo(dtype)
        _check_bounds(from_, "from", info.min, info.max, dtype)
        _check_bounds(to_inc, "to - 1", info.min, info.max, dtype)
        digits = _r.FP_DIGITS[_FP[dtype]]
        _warn_bounds(from_, "from", digits, dtype)
        _warn_bounds(to_inc, "to - 1", digits, dtype)
    elif dtype == torch.uint64:
        _check_bounds(from_, "from", 0, _r.INT64_MAX, dtype)
        _check_bounds(to_inc, "to - 1", 0, _r.INT64_MAX, dtype)
    elif dtype in _INTEGRAL:
        lo, hi = (0, 1) if dtype == torch.bool else (torch.iinfo(dtype).min, torch.iinfo(dtype).max)
        _check_bounds(from_, "from", lo, hi, dtype)
        _check_bounds(to_inc, "to - 1", lo, hi, dtype)
    else:
        raise RuntimeError("check_random_bounds handles only integral, floating-point and "
                           "boolean types")


def check_random_from_to(self, from_: int, to) -> None:
    """``random_from_to_impl``'s checks and warnings, in its order."""
    dtype = self.dtype
    fp = _FP.get(dtype)
    if to is not None:
        if not from_ < to:
            raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got "
                               f"from={from_} >= to={to}")
        if fp is not None:
            from_, to = _r.update_from(from_, fp), _r.update_to(to, fp)
            if not from_ < to:
                raise RuntimeError(f"random_ expects 'from' casted to dtype to be less than "
                                   f"'to' casted to dtype, but got from={from_} >= to={to}")
        check_from_to_in_range(from_, to - 1, dtype)
    elif from_ != _r.INT64_MIN:
        if fp is not None:
            to_inc = min(1 << _r.FP_DIGITS[fp], _r.INT64_MAX)
            from_ = _r.update_from(from_, fp)
            if not from_ < to_inc:
                raise RuntimeError(f"random_ expects 'from' casted to dtype to be less than or "
                                   f"equal to 'to_inc' casted to dtype, but got from={from_} > "
                                   f"to_inc={to_inc}")
        elif dtype in _INTEGRAL:
            to_inc = 1 if dtype == torch.bool else torch.iinfo(dtype).max
        else:
            raise RuntimeError("random_from_to_impl handles only integral, floating-point and "
                               "boolean types")
        check_from_to_in_range(from_, to_inc, dtype)
    elif self.numel():
        if dtype not in _FULL_DISPATCH:
            raise _not_implemented("random_full_64_bits_range_kernel_cpu", dtype)
        if dtype not in _FULL_KERNEL:
            raise RuntimeError("random_full_64_bits_range_kernel_cpu handles only int64, double, "
                               "float and bfloat16")


def _arg(e, args, kwargs, name, default=None):
    """The argument ``name`` of ``e``'s schema, positional or keyword."""
    for i, a in enumerate(e.op._schema.arguments):
        if a.name == name:
            if i < len(args):
                return args[i]
            return kwargs.get(name, default)
    return default


def _run(e, args, kwargs):
    self = args[0]
    if not self.numel() and not e.out_names:  # CHECK_EMPTY_AND_RETURN: no kernel runs
        return self if e.mut else aten.empty_like.default(self)
    return (mutating if e.mut else functional)(e, args, kwargs)


def random_checked(e, args, kwargs):
    """``random_()``, ``random_(to)``, ``random_(from, to)`` (``to`` None: to the dtype's
    top) and their functional and out= forms: ATen's checks, warnings and errors."""
    self = args[0]
    overload = e.op._schema.overload_name
    if overload in ("from", "from_out", "from_functional"):
        check_random_from_to(self, _arg(e, args, kwargs, "from"), _arg(e, args, kwargs, "to"))
    elif overload in ("to", "to_out", "to_functional"):
        check_random_from_to(self, 0, _arg(e, args, kwargs, "to"))
    elif self.numel() and self.dtype not in _RANDOM_KERNEL:
        raise _not_implemented("random_kernel_cpu", self.dtype)
    return _run(e, args, kwargs)


def _g(x: float) -> str:
    """A double as C++'s ``operator<<`` prints it (``%g``)."""
    return "nan" if x != x else format(x, "g")


def check_uniform(self, from_: float, to: float) -> None:
    """``uniform_impl_``'s checks (a complex tensor: its real dtype's, unless empty)."""
    dtype = self.dtype
    if dtype.is_complex:
        if not self.numel():
            return
        dtype = dtype.to_real()
    if dtype not in _FP:
        raise _not_implemented("check_uniform_bounds", dtype)
    info = torch.finfo(dtype)
    _check_bounds(from_, "from", info.min, info.max, dtype)
    _check_bounds(to, "to", info.min, info.max, dtype)
    if not from_ <= to:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found "
                           f"from={_g(from_)} > to={_g(to)}")
    if not (to - from_) <= info.max:
        raise RuntimeError(f"uniform_ expects to-from <= std::numeric_limits<"
                           f"{_scalar_type_name(dtype)}>::max(), but found to={_g(to)} and "
                           f"from={_g(from_)} which result in to-from to exceed the limit")


def uniform_checked(e, args, kwargs):
    """``uniform_(from, to)`` and its functional and out= forms: ATen's checks."""
    self = args[0]
    check_uniform(self, float(_arg(e, args, kwargs, "from", 0.0)),
                  float(_arg(e, args, kwargs, "to", 1.0)))
    return _run(e, args, kwargs)


_STD_TENSOR_MSG = "normal expects all elements of std >= 0.0"


def check_normal_std(e, std) -> None:
    """ATen's ``CHECK_NORMAL_STD`` (a float ``std``, at the op, printed as C++ prints a
    double) and ``CHECK_NORMAL_TENSOR_STD`` (a tensor: ``std.min() >= 0``, NaN failing,
    read on the host where it lives there, else on the device, as an asynchronous assert
    read at the next sync point (``_exec.asserts``; at once in debug mode))."""
    if not isinstance(std, torch.Tensor):
        if not std >= 0.0:
            raise RuntimeError(f"normal expects std >= 0.0, but found std {_g(float(std))}")
        return
    if std.is_complex():
        raise RuntimeError("normal expects standard deviation to be non-complex")
    if not std.numel():
        return
    require(e, aten.ge.Scalar(aten.min.default(std.detach()), 0), _STD_TENSOR_MSG)


def normal_checked(e, args, kwargs):
    """``normal`` (mean and std tensors or floats, ``out=``) and ``normal_``: ATen's check
    of ``std`` first, then the op."""
    check_normal_std(e, _arg(e, args, kwargs, "std", 1.0))
    return (mutating if e.mut else functional)(e, args, kwargs)


# (normal.float_float_out and normal.out decompose into normal.float_float and normal_)
_NORMAL = [aten.normal.Tensor_float, aten.normal.Tensor_float_out, aten.normal.float_Tensor,
           aten.normal.float_Tensor_out, aten.normal.Tensor_Tensor, aten.normal.Tensor_Tensor_out,
           aten.normal.float_float, aten.normal_.default]


def _overloads(packet) -> list:
    return [getattr(packet, n) for n in packet.overloads()]


def special_handlers() -> dict:
    """op -> handler, merged into ``special.SPECIAL``."""
    return {
        **dict.fromkeys(_overloads(aten.random_) + _overloads(aten.random), random_checked),
        **dict.fromkeys(_overloads(aten.uniform_) + _overloads(aten.uniform), uniform_checked),
        **dict.fromkeys(_NORMAL, normal_checked),
    }

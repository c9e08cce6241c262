"""complex32 (``torch.chalf``): JAX has no complex32, so a complex32 tensor's value is
complex64 rounded to float16 parts (``_base.dtypes.WIDENED``); here, the rounding of an op's
Python operands (``round_operands``, from ``plan.plan_for``). Its views in other dtypes:
``narrow_views``."""
from __future__ import annotations

import numpy as np
import torch

aten = torch.ops.aten
C32 = torch.complex32


def _half(v):
    if type(v) is complex:
        return complex(float(np.float16(v.real)), float(np.float16(v.imag)))
    return float(np.float16(v))


def round_operands(args):
    """``args`` with their Python float and complex operands rounded to complex32's float16
    parts where the op computes in complex32 (a complex32 tensor among them, or a complex
    number with float16 tensors only): ATen converts such an operand to the op's complex32
    type (TensorIterator's common dtype) before the complex64 arithmetic; None where
    nothing changes (keyword arguments, ``alpha``, are never operands)."""
    dts = {a.dtype for a in args if isinstance(a, torch.Tensor)}
    if C32 not in dts and not (dts and dts <= {torch.float16, C32}):
        return None
    out = list(args)
    changed = False
    for i, a in enumerate(args):
        if type(a) in (float, complex):
            r = _half(a)
            if r != a and a == a:  # NaN stays NaN
                out[i], changed = r, True
    return tuple(out) if changed else None


def computes_in_c32(args) -> bool:
    """The op's common dtype is complex32: a complex32 tensor among ``args`` and no tensor
    of a wider floating or complex dtype (ATen computes such an op in ``complex<Half>``)."""
    dts = {a.dtype for a in args if isinstance(a, torch.Tensor)}
    return C32 in dts and all(d in (C32, torch.float16) or not (d.is_floating_point or d.is_complex)
                              for d in dts)

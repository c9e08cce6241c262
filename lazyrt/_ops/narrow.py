"""Views that read complex32 (``torch.chalf``) bytes as another dtype, or other bytes as
complex32: JAX has no complex32, so a complex32 tensor's value is complex64 rounded to
float16 parts (``_base.dtypes.WIDENED``), and a lowering of ``view.dtype`` sees complex64.
Its bytes are its (real, imag) pairs of float16 (``view_as_real``), so such a view is that
view's composition with a float16 one, a view of the same storage as PyTorch's."""
from __future__ import annotations

import numpy as np
import torch

from .._base.tensor import TpuTensor

aten = torch.ops.aten
C32 = torch.complex32


def view_dtype(e, args, kwargs):
    from .handlers import view
    self = args[0]
    dtype = args[1] if len(args) > 1 else kwargs["dtype"]
    if type(self) is not TpuTensor or C32 not in (self.dtype, dtype) or self.dtype == dtype:
        return view(e, args, kwargs)
    shape = torch.empty_strided(tuple(self.shape), tuple(self.stride()), dtype=self.dtype,
                                device="meta").view(dtype).shape  # PyTorch's checks
    if self.dtype == C32:
        parts = aten.view_as_real.default(self)  # (..., 2) float16
        if self.dim():
            parts = aten.view.default(parts, list(self.shape[:-1]) + [2 * self.shape[-1]])
        return aten.view.default(aten.view.dtype(parts, dtype), list(shape))
    halves = aten.view.dtype(self.reshape(-1) if self.dim() == 0 else self, torch.float16)
    pairs = aten.view.default(halves, list(shape) + [2])
    return aten.view_as_complex.default(pairs)


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


def special_handlers() -> dict:
    return {aten.view.dtype: view_dtype}

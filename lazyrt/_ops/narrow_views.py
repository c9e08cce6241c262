"""Views that read complex32 (``torch.chalf``) bytes as another dtype, or other bytes as
complex32: a complex32 tensor's value is complex64 (``narrow``), and a lowering of
``view.dtype`` sees complex64. Its bytes are its (real, imag) pairs of float16
(``view_as_real``), so such a view is that view's composition with a float16 one, a view of
the same storage as PyTorch's."""
from __future__ import annotations

import torch

from .._base.tensor import TpuTensor
from .handlers import view
from .narrow import C32

aten = torch.ops.aten


def view_dtype(e, args, kwargs):
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


def special_handlers() -> dict:
    return {aten.view.dtype: view_dtype}

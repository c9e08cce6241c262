"""torch <-> JAX dtype mapping."""
from __future__ import annotations

import threading

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch

TORCH_TO_JAX: dict[torch.dtype, np.dtype] = {
    torch.float32: jnp.dtype(jnp.float32),
    torch.float64: jnp.dtype(jnp.float64),
    torch.float16: jnp.dtype(jnp.float16),
    torch.bfloat16: jnp.dtype(jnp.bfloat16),
    torch.int64: jnp.dtype(jnp.int64),
    torch.int32: jnp.dtype(jnp.int32),
    torch.int16: jnp.dtype(jnp.int16),
    torch.int8: jnp.dtype(jnp.int8),
    torch.uint8: jnp.dtype(jnp.uint8),
    torch.uint16: jnp.dtype(jnp.uint16),
    torch.uint32: jnp.dtype(jnp.uint32),
    torch.uint64: jnp.dtype(jnp.uint64),
    torch.bool: jnp.dtype(jnp.bool_),
    torch.complex64: jnp.dtype(jnp.complex64),
    torch.complex128: jnp.dtype(jnp.complex128),
    torch.float8_e4m3fn: jnp.dtype(ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: jnp.dtype(ml_dtypes.float8_e5m2),
    torch.float8_e4m3fnuz: jnp.dtype(ml_dtypes.float8_e4m3fnuz),
    torch.float8_e5m2fnuz: jnp.dtype(ml_dtypes.float8_e5m2fnuz),
}
# dtypes numpy lacks, moved between torch and numpy as their bits: (unsigned of that width
# in numpy, in torch)
_BITS = {torch.bfloat16: (np.uint16, torch.uint16), torch.float8_e4m3fn: (np.uint8, torch.uint8),
         torch.float8_e5m2: (np.uint8, torch.uint8), torch.float8_e4m3fnuz: (np.uint8, torch.uint8),
         torch.float8_e5m2fnuz: (np.uint8, torch.uint8)}
_BITS_OF_NUMPY = {TORCH_TO_JAX[t]: (t, *b) for t, b in _BITS.items()}
JAX_TO_TORCH: dict[np.dtype, torch.dtype] = {v: k for k, v in TORCH_TO_JAX.items()}
# torch dtypes JAX lacks, held in a wider JAX dtype: their values are the wider type's,
# rounded to theirs at every program output (``round_narrow``), as PyTorch computes them
# (complex32 arithmetic is complex64's, each part rounded to float16).
WIDENED: dict[torch.dtype, torch.dtype] = {torch.complex32: torch.complex64}
TORCH_TO_JAX[torch.complex32] = TORCH_TO_JAX[torch.complex64]


# set while an op that computes in complex32 (its common dtype, a complex32 tensor among
# its operands) is traced: a lowering whose intermediate ATen rounds to complex32 (add/sub's
# ``alpha * other``) reads it (``c32_math``); the ops' own results are rounded anyway
_C32_MATH = threading.local()


def c32_math() -> bool:
    """The op traced now computes in complex32 (``in_c32_math``)."""
    return getattr(_C32_MATH, "on", False)


def in_c32_math(f, *args, **kwargs):
    """``f(*args, **kwargs)`` with ``c32_math()`` true."""
    prev = c32_math()
    _C32_MATH.on = True
    try:
        return f(*args, **kwargs)
    finally:
        _C32_MATH.on = prev


def round_narrow(x, dtype: torch.dtype):
    """``x`` (a JAX value of ``dtype``'s wider type) rounded to ``dtype`` (in ``WIDENED``)."""
    from jax import lax
    f16, f32 = jnp.float16, jnp.float32
    return lax.complex(jnp.real(x).astype(f16).astype(f32), jnp.imag(x).astype(f16).astype(f32))


def to_jax(dtype: torch.dtype) -> np.dtype:
    try:
        return TORCH_TO_JAX[dtype]
    except KeyError:
        raise TypeError(f"lazyrt: dtype {dtype} is not supported on the tpu device") from None


def to_torch(dtype) -> torch.dtype:
    return JAX_TO_TORCH[jnp.dtype(dtype)]


def numpy_to_torch(a: np.ndarray) -> torch.Tensor:
    """Host numpy array (possibly bfloat16/float8) to a CPU torch tensor (copying)."""
    bits = _BITS_OF_NUMPY.get(a.dtype)
    if bits is not None:
        return torch.from_numpy(np.array(a, copy=True).view(bits[1]).copy()).view(bits[0])
    return torch.from_numpy(np.array(a, copy=True))


def torch_to_numpy(t: torch.Tensor) -> np.ndarray:
    """CPU torch tensor to a numpy array with the matching JAX-compatible dtype."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.dtype in WIDENED:
        t = t.to(WIDENED[t.dtype])
    bits = _BITS.get(t.dtype)
    if bits is not None:
        return t.contiguous().view(bits[1]).numpy().view(TORCH_TO_JAX[t.dtype])
    return t.numpy()


def scalar_type_name(dtype: torch.dtype) -> str:
    """PyTorch's C++ name of a dtype in its messages: ``Float``, ``Long``, ``ComplexDouble``."""
    return torch.empty(0, dtype=dtype).type()[len("torch."):-len("Tensor")]


def check_result_cast(result: torch.dtype, out: torch.dtype) -> None:
    """TensorIterator's rule for an op writing into ``out`` (``out=``, in-place): the result
    dtype must cast to it, with PyTorch's message."""
    if not torch.can_cast(result, out):
        raise RuntimeError(f"result type {scalar_type_name(result)} can't be cast to the desired "
                           f"output type {scalar_type_name(out)}")

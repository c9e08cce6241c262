"""Helpers shared by the Pallas kernels: backend choice, dtypes, padding, block sizes."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# Input dtypes the kernels accept; accumulation is always float32.
SUPPORTED_DTYPES: tuple[np.dtype, ...] = (
    np.dtype(jnp.float32),
    np.dtype(jnp.bfloat16),
    np.dtype(jnp.float16),
)

# NOTE: Triton (the GPU Pallas backend) needs tiles of at least 16 rows/cols for
# `tl.dot`, so a small problem is rounded up to a 16-wide tile rather than a tiny one.
MIN_BLOCK = 16


def default_interpret() -> bool:
    """True when kernels must run in Pallas interpret mode (the default backend is CPU).

    On ``gpu``/``tpu`` the kernels are compiled; pass ``interpret=`` to any kernel to
    override this choice.
    """
    return jax.default_backend() == "cpu"


def resolve_interpret(interpret: bool | None) -> bool:
    return default_interpret() if interpret is None else bool(interpret)


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def is_pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def round_up(n: int, multiple: int) -> int:
    return cdiv(n, multiple) * multiple


def effective_block(requested: int, extent: int) -> int:
    """The tile actually used along an axis of length ``extent``.

    Never larger than needed: a 37-long axis with a requested 128 tile uses 64.
    """
    return min(requested, max(MIN_BLOCK, next_pow2(extent)))


def check_block(name: str, value: Any) -> None:
    """Raise TypeError unless ``value`` is an int, ValueError unless a power of two."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if not is_pow2(int(value)):
        raise ValueError(f"{name} must be a positive power of two, got {value}")


def as_dtype(dtype: Any) -> np.dtype:
    """Normalize a jnp/numpy/str/torch dtype to a numpy dtype (ValueError if unknown)."""
    if isinstance(dtype, np.dtype):
        return dtype
    text = str(dtype)
    if text.startswith("torch."):
        # NOTE: torch dtypes are not numpy-convertible; map by name (torch.bfloat16 ->
        # "bfloat16") so a router can ask with the dtype of a torch tensor.
        text = text[len("torch."):]
        dtype = {"float": "float32", "half": "float16", "double": "float64"}.get(text, text)
    try:
        return np.dtype(jnp.dtype(dtype))
    except TypeError as e:
        raise ValueError(f"unknown dtype {dtype!r}") from e


def pad_axis(x: jax.Array, axis: int, size: int, value: float = 0.0) -> jax.Array:
    """Pad ``x`` along ``axis`` at the end up to ``size`` (no-op when already there)."""
    extra = size - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def compiler_params(interpret: bool, *, num_warps: int = 4, num_stages: int = 2) -> Any:
    """Backend compiler parameters: Triton's on GPU, None (the defaults) elsewhere."""
    if interpret or jax.default_backend() != "gpu":
        return None
    # NOTE: imported lazily: the Triton module is only needed (and only meaningful) on GPU.
    from jax.experimental.pallas import triton as pltriton

    # NOTE: an explicit Triton CompilerParams also pins the Triton backend even when
    # `jax_pallas_use_mosaic_gpu` is set; these kernels are written for Triton's model
    # (independent programs, no cross-program accumulation).
    return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)

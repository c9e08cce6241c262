"""Helpers shared by the Pallas kernels: backend choice, dtypes, padding, block sizes."""

from __future__ import annotations

import functools
import os
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


@functools.cache
def gpu_backend() -> str | None:
    """The Pallas GPU backend these kernels compile with: "triton", or None where this JAX
    has no usable one for them.

    NOTE: the kernels are written in Triton's model: values loaded from refs and
    contracted with ``lax.dot_general`` inside the kernel. Pallas's default GPU lowering
    since JAX 0.9 (``jax_pallas_use_mosaic_gpu``, on by default) is Mosaic GPU, whose
    ``pallas_call`` lowering has no rule for ``dot_general`` (JAX 0.10.2 and 0.11.1's
    ``jax/_src/pallas/mosaic_gpu/lowering.py``: matrix products go through
    ``plgpu.wgmma`` on shared-memory refs), so left to the default every kernel would fail
    to lower. They ask for Triton explicitly, while JAX has it: 0.11 deprecates it
    (a ``DeprecationWarning`` per lowering, id ``jax-pallas-triton``); where it is gone or
    the deprecation is made an error (``jax._src.deprecations.accelerate``), this is
    None, the ``supports_*`` predicates answer False on GPU (so lazyrt's router runs
    XLA's path) and a direct call raises ``NotImplementedError``.
    ``KERNELS_PALLAS_GPU_BACKEND=none`` forces None (to check that fallback)."""
    if os.environ.get("KERNELS_PALLAS_GPU_BACKEND", "").lower() == "none":
        return None
    try:
        from jax.experimental.pallas import triton as pltriton  # noqa: F401
    except ImportError:
        return None
    try:
        from jax._src import deprecations

        if deprecations.is_accelerated("jax-pallas-triton"):
            return None
    except (ImportError, AttributeError, KeyError, ValueError):
        pass  # an older JAX: no such deprecation registered
    return "triton"


def compiled_backend_available() -> bool:
    """Whether the kernels can be compiled (not interpreted) on the default backend."""
    return jax.default_backend() != "gpu" or gpu_backend() is not None


def compiler_params(interpret: bool, *, num_warps: int = 4, num_stages: int = 2) -> Any:
    """Backend compiler parameters: Triton's on GPU (``gpu_backend``), None (the
    defaults) elsewhere."""
    if interpret or jax.default_backend() != "gpu":
        return None
    if gpu_backend() != "triton":
        raise NotImplementedError(
            "kernels_pallas: this JAX has no Pallas GPU backend these kernels lower with "
            "(they need Triton's; Mosaic GPU lowers no dot_general): run with "
            "interpret=True or use XLA's path")
    # NOTE: imported lazily: the Triton module is only needed (and only meaningful) on GPU.
    from jax.experimental.pallas import triton as pltriton

    # NOTE: an explicit Triton CompilerParams pins the Triton backend even when
    # `jax_pallas_use_mosaic_gpu` is set (the default): see `gpu_backend`.
    return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)

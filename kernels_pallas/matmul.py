"""Tiled matmul with a fused bias + activation epilogue, as a Pallas kernel.

``matmul(a, b)`` computes ``act(a @ b + bias)`` for ``a: [M, K]``, ``b: [K, N]``;
``batched_matmul`` does the same for ``[B, M, K] @ [B, K, N]`` with a grid axis over the
batch. Both run one kernel: each program owns an ``[block_m, block_n]`` output tile and
loops over ``K`` in ``block_k`` steps with a float32 accumulator; the epilogue (bias add,
then activation) runs on that float32 accumulator before the single cast to the output
dtype. This is the ``addmm`` + GELU hot path of a transformer MLP.

Inputs are float32/bfloat16/float16 (``a`` and ``b`` of one dtype); shapes need not be
multiples of the tiles (operands are zero-padded; the padded K columns add zeros, the
padded output rows/cols are sliced off). For float32 the kernel matches
``jnp.dot(..., precision=HIGHEST)`` (full float32 products, no TF32).

Activations: ``"relu"``, ``"silu"``, ``"gelu"`` (exact, erf-based: PyTorch's default) and
``"gelu_tanh"`` (PyTorch's ``approximate="tanh"``). Pallas-Triton cannot lower ``erf``, so
the exact GELU uses an erfc approximation with relative error below 1.2e-7 (well under
float32 matmul rounding); it is the same code in interpret and compiled mode.

Both functions are differentiable (``jax.custom_vjp``): the backward runs the same kernel,
``dA = dZ @ B^T`` and ``dB = A^T @ dZ`` with the transposes folded into the kernel's
operand layout (no transposed copies), where ``dZ`` is the output cotangent pushed
through the activation at the saved pre-activation.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from kernels_pallas._common import (
    SUPPORTED_DTYPES,
    as_dtype,
    check_block,
    compiled_backend_available,
    compiler_params,
    effective_block,
    pad_axis,
    resolve_interpret,
    round_up,
)

ACTIVATIONS: tuple[str, ...] = ("relu", "silu", "gelu", "gelu_tanh")

_HIGHEST = lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True)
class MatmulBlockSizes:
    """Tile sizes of the matmul kernel (powers of two, validated on construction).

    A tile larger than the (padded) dimension is shrunk to fit.
    """

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            check_block(f"MatmulBlockSizes.{f.name}", getattr(self, f.name))


@dataclasses.dataclass(frozen=True)
class _Config:
    """Static parameters of one kernel launch (hashable)."""

    trans_a: bool  # a is stored [B, K, M]
    trans_b: bool  # b is stored [B, N, K]
    activation: str | None
    out_dtype: np.dtype
    save_preact: bool  # also emit bias-added pre-activation (for the backward)
    block_m: int
    block_n: int
    block_k: int
    interpret: bool


# ---------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------

_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _erfc_nonneg(z: jax.Array) -> jax.Array:
    """erfc(z) for z >= 0, relative error < 1.2e-7 (Chebyshev fit, Numerical Recipes)."""
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277))))))))
    return t * jnp.exp(-z * z + poly)


def _gelu_erf(x: jax.Array) -> jax.Array:
    """x * Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2, written without lax.erf."""
    half_tail = 0.5 * _erfc_nonneg(jnp.abs(x) * _INV_SQRT2)  # Phi(-|x|)
    # NOTE: using the tail for negative x (instead of 1 - Phi) keeps the relative
    # accuracy of tiny negative outputs.
    return x * jnp.where(x >= 0, 1.0 - half_tail, half_tail)


def _activate(z: jax.Array, activation: str | None) -> jax.Array:
    """Epilogue activation on a float32 tile (only primitives Triton/Mosaic lower)."""
    if activation is None:
        return z
    if activation == "relu":
        return jnp.maximum(z, 0.0)
    if activation == "silu":
        return z / (1.0 + jnp.exp(-z))
    if activation == "gelu":
        return _gelu_erf(z)
    if activation == "gelu_tanh":
        return 0.5 * z * (1.0 + jnp.tanh(_SQRT_2_OVER_PI * (z + 0.044715 * z * z * z)))
    raise AssertionError(activation)


_REFERENCE_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
}


# ---------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------


def _check_matmul(
    a_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
    a_dtype: Any,
    b_dtype: Any,
    *,
    batched: bool,
    bias_shape: tuple[int, ...] | None = None,
    bias_dtype: Any = None,
    activation: str | None = None,
    out_dtype: Any = None,
) -> None:
    """Raise ValueError naming the offending shapes/dtypes when the kernel cannot run."""
    rank = 3 if batched else 2
    what = "batched_matmul expects [B, M, K] @ [B, K, N]" if batched else (
        "matmul expects [M, K] @ [K, N]")
    if len(a_shape) != rank or len(b_shape) != rank:
        raise ValueError(f"{what}, got a.shape={tuple(a_shape)}, b.shape={tuple(b_shape)}")
    if a_shape[-1] != b_shape[-2] or (batched and a_shape[0] != b_shape[0]):
        raise ValueError(f"{what}, got a.shape={tuple(a_shape)}, b.shape={tuple(b_shape)}")
    if any(d <= 0 for d in (*a_shape, *b_shape)):
        raise ValueError(
            f"matmul needs non-empty operands, got a.shape={a_shape}, b.shape={b_shape}")
    a_dt, b_dt = as_dtype(a_dtype), as_dtype(b_dtype)
    if a_dt != b_dt:
        raise ValueError(f"a and b dtypes differ: {a_dt} vs {b_dt}")
    if a_dt not in SUPPORTED_DTYPES:
        raise ValueError(
            f"unsupported dtype {a_dt}; supported: {[str(t) for t in SUPPORTED_DTYPES]}")
    if out_dtype is not None and as_dtype(out_dtype) not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported out_dtype {out_dtype}")
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; expected one of {ACTIVATIONS}")
    if bias_shape is not None:
        if tuple(bias_shape) != (b_shape[-1],):
            raise ValueError(f"bias.shape={tuple(bias_shape)} must be (N,)=({b_shape[-1]},)")
        if not jnp.issubdtype(as_dtype(bias_dtype), jnp.floating):
            raise ValueError(f"bias must be floating, got dtype {bias_dtype}")


def supports_matmul(
    a_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
    dtype: Any,
) -> bool:
    """Whether :func:`matmul` (2-D) or :func:`batched_matmul` (3-D) takes these operands.

    Never raises. ``dtype`` may be a jnp/numpy/str or torch dtype.
    """
    if not compiled_backend_available():  # a GPU without a backend for them
        return False
    try:
        a_shape, b_shape = tuple(a_shape), tuple(b_shape)
        _check_matmul(a_shape, b_shape, dtype, dtype, batched=len(a_shape) == 3)
    except Exception:
        return False
    return True


# ---------------------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------------------


def _matmul_kernel(*refs: Any, cfg: _Config, has_bias: bool) -> None:
    a_ref, b_ref, *rest = refs
    bias_ref = rest.pop(0) if has_bias else None
    o_ref = rest.pop(0)
    z_ref = rest.pop(0) if cfg.save_preact else None
    bk = cfg.block_k
    k_total = a_ref.shape[0] if cfg.trans_a else a_ref.shape[1]

    def body(step, acc):
        ks = pl.ds(pl.multiple_of(step * bk, bk), bk)
        # NOTE: a transposed operand is contracted along its other axis instead of being
        # transposed in memory: a tile is [bk, bm] (contract axis 0), b tile [bn, bk].
        a = a_ref[ks, :] if cfg.trans_a else a_ref[:, ks]
        b = b_ref[:, ks] if cfg.trans_b else b_ref[ks, :]
        dims = (((0 if cfg.trans_a else 1,), (1 if cfg.trans_b else 0,)), ((), ()))
        # NOTE: HIGHEST keeps float32 at full precision (Triton would use TF32).
        return acc + lax.dot_general(
            a, b, dims, precision=(_HIGHEST, _HIGHEST), preferred_element_type=jnp.float32)

    acc = lax.fori_loop(
        0, k_total // bk, body, jnp.zeros((cfg.block_m, cfg.block_n), jnp.float32))
    if bias_ref is not None:
        acc = acc + bias_ref[...].astype(jnp.float32)  # [1, bn] broadcasts over rows
    if z_ref is not None:
        z_ref[...] = acc.astype(z_ref.dtype)
    o_ref[...] = _activate(acc, cfg.activation).astype(o_ref.dtype)


def _bmm_call(
    cfg: _Config, a: jax.Array, b: jax.Array, bias: jax.Array | None
) -> tuple[jax.Array, jax.Array | None]:
    """One kernel launch on 3-D operands in their stored layout; pads and slices.

    Returns ``(out, preact)``; ``preact`` is None unless ``cfg.save_preact``.
    """
    batch = a.shape[0]
    m, k = (a.shape[2], a.shape[1]) if cfg.trans_a else (a.shape[1], a.shape[2])
    n = b.shape[1] if cfg.trans_b else b.shape[2]
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    mp, np_, kp = round_up(m, bm), round_up(n, bn), round_up(k, bk)
    # Zero padding: padded K adds 0 to every dot; padded M/N rows/cols are sliced off.
    a = pad_axis(pad_axis(a, 1, kp if cfg.trans_a else mp), 2, mp if cfg.trans_a else kp)
    b = pad_axis(pad_axis(b, 1, np_ if cfg.trans_b else kp), 2, kp if cfg.trans_b else np_)
    if cfg.trans_a:
        a_spec = pl.BlockSpec((None, kp, bm), lambda bi, i, j: (bi, 0, i))
    else:
        a_spec = pl.BlockSpec((None, bm, kp), lambda bi, i, j: (bi, i, 0))
    if cfg.trans_b:
        b_spec = pl.BlockSpec((None, bn, kp), lambda bi, i, j: (bi, j, 0))
    else:
        b_spec = pl.BlockSpec((None, kp, bn), lambda bi, i, j: (bi, 0, j))
    in_specs, args = [a_spec, b_spec], [a, b]
    if bias is not None:
        in_specs.append(pl.BlockSpec((1, bn), lambda bi, i, j: (0, j)))
        args.append(pad_axis(bias.reshape(1, n), 1, np_))
    out_spec = pl.BlockSpec((None, bm, bn), lambda bi, i, j: (bi, i, j))
    out_sds = jax.ShapeDtypeStruct((batch, mp, np_), cfg.out_dtype)
    n_out = 2 if cfg.save_preact else 1
    outs = pl.pallas_call(
        functools.partial(_matmul_kernel, cfg=cfg, has_bias=bias is not None),
        out_shape=(out_sds,) * n_out,
        grid=(batch, mp // bm, np_ // bn),
        in_specs=in_specs,
        out_specs=(out_spec,) * n_out,
        compiler_params=compiler_params(cfg.interpret, num_warps=4, num_stages=3),
        interpret=cfg.interpret,
        name="matmul",
    )(*args)
    outs = [o[:, :m, :n] for o in outs]
    return outs[0], (outs[1] if cfg.save_preact else None)


def _launch_config(
    m: int, n: int, k: int, blocks: MatmulBlockSizes, interpret: bool, **kw: Any
) -> _Config:
    return _Config(
        block_m=effective_block(blocks.block_m, m),
        block_n=effective_block(blocks.block_n, n),
        block_k=effective_block(blocks.block_k, k),
        interpret=interpret,
        **kw,
    )


@dataclasses.dataclass(frozen=True)
class _Op:
    """Static parameters of a differentiable (batched) matmul call (hashable)."""

    activation: str | None
    out_dtype: np.dtype
    blocks: MatmulBlockSizes
    interpret: bool

    def launch(self, a, b, bias, *, trans_a=False, trans_b=False, activation=None,
               out_dtype=None, save_preact=False):
        m = a.shape[2] if trans_a else a.shape[1]
        k = a.shape[1] if trans_a else a.shape[2]
        n = b.shape[1] if trans_b else b.shape[2]
        cfg = _launch_config(
            m, n, k, self.blocks, self.interpret, trans_a=trans_a, trans_b=trans_b,
            activation=activation, save_preact=save_preact,
            out_dtype=np.dtype(out_dtype or self.out_dtype),
        )
        return _bmm_call(cfg, a, b, bias)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _bmm(op: _Op, a: jax.Array, b: jax.Array, bias: jax.Array | None) -> jax.Array:
    return op.launch(a, b, bias, activation=op.activation)[0]


def _bmm_fwd(op: _Op, a, b, bias):
    save = op.activation is not None
    out, z = op.launch(a, b, bias, activation=op.activation, save_preact=save)
    # NOTE: with an activation the pre-activation z (in the output dtype, like PyTorch
    # autograd's saved addmm result) is kept to backprop through the activation.
    return out, (a, b, bias, z)


def _bmm_bwd(op: _Op, res, g):
    a, b, bias, z = res
    if op.activation is None:
        dz = g
    else:
        act = _REFERENCE_ACTIVATIONS[op.activation]
        _, act_vjp = jax.vjp(act, z.astype(jnp.float32))
        (dz,) = act_vjp(g.astype(jnp.float32))
    dz = dz.astype(a.dtype)
    # dA = dZ @ B^T  ([B, M, N] x stored [B, K, N] -> trans_b)
    da = op.launch(dz, b, None, trans_b=True, out_dtype=a.dtype)[0]
    # dB = A^T @ dZ  (stored [B, M, K] read as [B, K, M] -> trans_a)
    db = op.launch(a, dz, None, trans_a=True, out_dtype=b.dtype)[0]
    dbias = None
    if bias is not None:
        dbias = jnp.sum(dz.astype(jnp.float32), axis=(0, 1)).astype(bias.dtype)
    return da, db, dbias


_bmm.defvjp(_bmm_fwd, _bmm_bwd)


def _make_op(a, activation, out_dtype, block_sizes, interpret) -> _Op:
    return _Op(
        activation=activation,
        out_dtype=np.dtype(a.dtype) if out_dtype is None else as_dtype(out_dtype),
        blocks=MatmulBlockSizes() if block_sizes is None else block_sizes,
        interpret=resolve_interpret(interpret),
    )


_STATIC = ("activation", "block_sizes", "out_dtype", "interpret")


@functools.partial(jax.jit, static_argnames=_STATIC)
def matmul(
    a: jax.Array,
    b: jax.Array,
    *,
    bias: jax.Array | None = None,
    activation: str | None = None,
    block_sizes: MatmulBlockSizes | None = None,
    out_dtype: Any = None,
    interpret: bool | None = None,
) -> jax.Array:
    """``activation(a @ b + bias)`` for ``a: [M, K]``, ``b: [K, N]``, ``bias: [N]``.

    Float32 accumulation and epilogue; result in ``out_dtype`` (default ``a.dtype``).
    ``activation`` is None, ``"relu"``, ``"silu"``, ``"gelu"`` (exact) or ``"gelu_tanh"``.
    Differentiable in ``a``, ``b`` and ``bias``.

    Raises:
      ValueError: bad ranks/shapes, mismatched or unsupported dtypes, unknown activation.
    """
    _check_matmul(
        a.shape, b.shape, a.dtype, b.dtype, batched=False,
        bias_shape=None if bias is None else bias.shape,
        bias_dtype=None if bias is None else bias.dtype,
        activation=activation, out_dtype=out_dtype,
    )
    op = _make_op(a, activation, out_dtype, block_sizes, interpret)
    return _bmm(op, a[None], b[None], bias)[0]


@functools.partial(jax.jit, static_argnames=_STATIC)
def batched_matmul(
    a: jax.Array,
    b: jax.Array,
    *,
    bias: jax.Array | None = None,
    activation: str | None = None,
    block_sizes: MatmulBlockSizes | None = None,
    out_dtype: Any = None,
    interpret: bool | None = None,
) -> jax.Array:
    """:func:`matmul` over a leading batch axis: ``[B, M, K] @ [B, K, N] -> [B, M, N]``.

    The batch is a grid axis of the same kernel; ``bias`` ([N]) is shared by the batch.
    """
    _check_matmul(
        a.shape, b.shape, a.dtype, b.dtype, batched=True,
        bias_shape=None if bias is None else bias.shape,
        bias_dtype=None if bias is None else bias.dtype,
        activation=activation, out_dtype=out_dtype,
    )
    op = _make_op(a, activation, out_dtype, block_sizes, interpret)
    return _bmm(op, a, b, bias)


def matmul_reference(
    a: jax.Array,
    b: jax.Array,
    *,
    bias: jax.Array | None = None,
    activation: str | None = None,
    block_sizes: MatmulBlockSizes | None = None,
    out_dtype: Any = None,
    interpret: bool | None = None,
) -> jax.Array:
    """Plain ``jax.numpy`` oracle for :func:`matmul` and :func:`batched_matmul`.

    Same signature (``block_sizes``/``interpret`` ignored); 2-D or 3-D operands; float32
    HIGHEST-precision dot, epilogue in float32, exact ``jax.nn`` activations.
    """
    del block_sizes, interpret
    _check_matmul(
        a.shape, b.shape, a.dtype, b.dtype, batched=a.ndim == 3,
        bias_shape=None if bias is None else bias.shape,
        bias_dtype=None if bias is None else bias.dtype,
        activation=activation, out_dtype=out_dtype,
    )
    out = jnp.matmul(a, b, precision=_HIGHEST, preferred_element_type=jnp.float32)
    if bias is not None:
        out = out + bias.astype(jnp.float32)
    if activation is not None:
        out = _REFERENCE_ACTIVATIONS[activation](out)
    return out.astype(a.dtype if out_dtype is None else as_dtype(out_dtype))

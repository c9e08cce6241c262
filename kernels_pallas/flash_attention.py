"""Flash attention (forward and backward) as Pallas kernels.

Layout is PyTorch SDPA's: ``q`` is ``[batch, q_heads, q_len, head_dim]``, ``k``/``v`` are
``[batch, kv_heads, kv_len, head_dim]``. The forward keeps one query tile per program and
runs an online softmax over key/value tiles; the backward recomputes the probabilities
from the saved logsumexp (no ``[q_len, kv_len]`` matrix is ever stored) in two kernels,
one for ``dq`` (tiled over queries) and one for ``dk``/``dv`` (tiled over keys).

Semantics, matching ``torch.nn.functional.scaled_dot_product_attention``:

* ``causal=True`` masks key ``j`` for query ``i`` when ``j > i`` (top-left aligned).
* ``mask`` is boolean (True = attend) or an additive float bias, broadcastable to
  ``[batch, q_heads, q_len, kv_len]``. Both ``mask`` and ``causal`` may be given.
* Grouped-query attention: ``kv_heads`` must divide ``q_heads``; q head ``h`` reads kv head
  ``h // (q_heads // kv_heads)`` (like SDPA's ``enable_gqa=True``). k/v are never repeated
  in memory; the head mapping lives in the BlockSpec index maps.
* A query row whose keys are *all* masked (bool ``False`` or an additive ``-inf``)
  produces a zero output row and zero gradients, never NaN (as PyTorch's CPU SDPA does
  in the pinned release; older PyTorch math kernels gave NaN). A row masked only by large
  finite negatives
  (e.g. ``finfo.min``) is an ordinary row: it gets a softmax over those values.
* No gradient flows into ``mask``: it is treated as a constant.

Accumulation is float32 for float32/bfloat16/float16 inputs; the output has the input
dtype. Sequence lengths need not be multiples of the tiles: inputs are zero-padded and
padded keys are masked. A head_dim that is not a power of two (or is below 16) is
zero-padded to one (Triton needs power-of-two tiles); this does not change the result.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from kernels_pallas._common import (
    MIN_BLOCK,
    SUPPORTED_DTYPES,
    as_dtype,
    check_block,
    compiled_backend_available,
    compiler_params,
    effective_block,
    next_pow2,
    pad_axis,
    resolve_interpret,
    round_up,
)

# Largest head_dim accepted: the q/k/v tiles of one program must fit in on-chip memory.
MAX_HEAD_DIM = 256

_HIGHEST = lax.Precision.HIGHEST
_NEG_INF = float("-inf")


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tile sizes of the attention kernels (powers of two, validated on construction).

    Attributes:
      block_q: query rows per program in the forward and dq kernels.
      block_k: key rows per inner-loop step in the forward and dq kernels.
      block_q_bwd: query rows per inner-loop step of the dk/dv kernel (default block_q).
      block_k_bwd: key rows per program of the dk/dv kernel (default block_k).

    A tile larger than a (padded) sequence is shrunk to fit, so the defaults suit short
    sequences too.
    """

    block_q: int = 128
    block_k: int = 128
    block_q_bwd: int | None = None
    block_k_bwd: int | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None or f.name in ("block_q", "block_k"):
                check_block(f"BlockSizes.{f.name}", value)


@dataclasses.dataclass(frozen=True)
class _Config:
    """Static per-call parameters shared by the three kernels (hashable)."""

    causal: bool
    scale: float
    q_len: int  # true lengths; the arrays reaching the kernels are padded ...
    kv_len: int
    q_pad: int  # ... to these
    kv_pad: int
    block_q: int
    block_k: int
    block_q_bwd: int
    block_k_bwd: int
    interpret: bool


# ---------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------


def _check_attention(
    q_shape: tuple[int, ...],
    k_shape: tuple[int, ...],
    v_shape: tuple[int, ...],
    q_dtype: Any,
    k_dtype: Any,
    v_dtype: Any,
    mask_shape: tuple[int, ...] | None,
    mask_dtype: Any,
) -> None:
    """Raise ValueError naming the offending shapes/dtypes when the kernel cannot run."""
    for name, shape in (("q", q_shape), ("k", k_shape), ("v", v_shape)):
        if len(shape) != 4:
            raise ValueError(
                f"flash_attention expects rank-4 {name} [batch, heads, seq, head_dim], "
                f"got {name}.shape={tuple(shape)}"
            )
        if any(d <= 0 for d in shape):
            raise ValueError(f"flash_attention needs non-empty inputs, got {name}.shape={shape}")
    b, hq, _, d = q_shape
    if tuple(k_shape) != tuple(v_shape):
        raise ValueError(f"k and v shapes differ: k.shape={k_shape}, v.shape={v_shape}")
    if k_shape[0] != b:
        raise ValueError(f"batch mismatch: q.shape={q_shape}, k.shape={k_shape}")
    if k_shape[3] != d:
        raise ValueError(f"head_dim mismatch: q.shape={q_shape}, k.shape={k_shape}")
    if d > MAX_HEAD_DIM:
        raise ValueError(f"head_dim={d} exceeds the supported maximum {MAX_HEAD_DIM}")
    hkv = k_shape[1]
    if hq % hkv != 0:
        raise ValueError(
            f"kv_heads={hkv} must divide q_heads={hq} (q.shape={q_shape}, k.shape={k_shape})"
        )
    dtypes = {as_dtype(t) for t in (q_dtype, k_dtype, v_dtype)}
    if len(dtypes) != 1:
        raise ValueError(f"q, k, v dtypes differ: {q_dtype}, {k_dtype}, {v_dtype}")
    (dtype,) = dtypes
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(
            f"unsupported dtype {dtype}; supported: {[str(t) for t in SUPPORTED_DTYPES]}"
        )
    if mask_shape is None:
        return
    mdt = as_dtype(mask_dtype)
    if mdt != np.bool_ and not jnp.issubdtype(mdt, jnp.floating):
        raise ValueError(f"mask must be bool or floating, got dtype {mdt}")
    target = (b, hq, q_shape[2], k_shape[2])
    if len(mask_shape) > 4 or any(
        m not in (1, t) for m, t in zip(tuple(mask_shape)[::-1], target[::-1])
    ):
        raise ValueError(
            f"mask.shape={tuple(mask_shape)} is not broadcastable to "
            f"[batch, q_heads, q_len, kv_len]={target}"
        )


def supports_attention(
    q_shape: tuple[int, ...],
    k_shape: tuple[int, ...],
    dtype: Any,
    *,
    v_shape: tuple[int, ...] | None = None,
    mask_shape: tuple[int, ...] | None = None,
    mask_dtype: Any = None,
) -> bool:
    """Whether :func:`flash_attention` accepts these shapes/dtypes. Never raises.

    ``v_shape`` defaults to ``k_shape``; ``mask_dtype`` defaults to bool when a
    ``mask_shape`` is given. ``dtype`` may be a jnp/numpy/str or torch dtype.
    """
    if not compiled_backend_available():  # a GPU without a backend for them
        return False
    try:
        v_shape = k_shape if v_shape is None else v_shape
        mask_dtype = (np.bool_ if mask_dtype is None else mask_dtype) if mask_shape else None
        _check_attention(
            tuple(q_shape), tuple(k_shape), tuple(v_shape), dtype, dtype, dtype,
            None if mask_shape is None else tuple(mask_shape), mask_dtype,
        )
    except Exception:
        return False
    return True


# ---------------------------------------------------------------------------------------
# Kernel bodies
# ---------------------------------------------------------------------------------------


def _dot(a: jax.Array, b: jax.Array, contract_a: int, contract_b: int) -> jax.Array:
    """2-D dot contracting ``a``'s axis ``contract_a`` with ``b``'s ``contract_b``, in f32."""
    # NOTE: HIGHEST keeps float32 inputs at full precision: Triton otherwise picks TF32.
    return lax.dot_general(
        a, b, (((contract_a,), (contract_b,)), ((), ())),
        precision=(_HIGHEST, _HIGHEST), preferred_element_type=jnp.float32,
    )


def _masked_logits(
    q: jax.Array,
    k: jax.Array,
    bias: jax.Array | None,
    q_idx: jax.Array,
    k_idx: jax.Array,
    cfg: _Config,
    *,
    kv_padded: bool,
    q_padded: bool = False,
) -> jax.Array:
    """Scaled, biased, masked logits of one [block_q, block_k] tile; masked entries -inf."""
    s = _dot(q, k, 1, 1) * cfg.scale
    if bias is not None:
        s = s + bias.astype(jnp.float32)
    valid = None
    if kv_padded:
        valid = k_idx[None, :] < cfg.kv_len
    if q_padded:
        rows = q_idx[:, None] < cfg.q_len
        valid = rows if valid is None else valid & rows
    if cfg.causal:
        below = k_idx[None, :] <= q_idx[:, None]
        valid = below if valid is None else valid & below
    if valid is not None:
        s = jnp.where(valid, s, _NEG_INF)
    return s


def _causal_kv_blocks(qi: jax.Array, block_q: int, block_k: int, n_kv: int) -> jax.Array:
    """Number of key tiles query tile ``qi`` can see under the causal mask."""
    last_row = (qi + 1) * block_q  # exclusive
    return jnp.minimum(n_kv, lax.div(last_row + block_k - 1, block_k))


def _fwd_kernel(*refs: Any, cfg: _Config, has_bias: bool) -> None:
    if has_bias:
        q_ref, k_ref, v_ref, bias_ref, o_ref, lse_ref = refs
    else:
        (q_ref, k_ref, v_ref, o_ref, lse_ref), bias_ref = refs, None
    bq, bk = cfg.block_q, cfg.block_k
    kv_pad, head_dim = k_ref.shape
    n_kv = kv_pad // bk
    qi = pl.program_id(2)
    q = q_ref[...]
    q_idx = qi * bq + lax.broadcasted_iota(jnp.int32, (bq,), 0)

    def body(j, carry):
        acc, m_prev, l_prev = carry
        start = pl.multiple_of(j * bk, bk)
        k = k_ref[pl.ds(start, bk), :]
        v = v_ref[pl.ds(start, bk), :]
        bias = None if bias_ref is None else bias_ref[:, pl.ds(start, bk)]
        k_idx = start + lax.broadcasted_iota(jnp.int32, (bk,), 0)
        s = _masked_logits(q, k, bias, q_idx, k_idx, cfg, kv_padded=cfg.kv_pad != cfg.kv_len)
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1))
        # NOTE: while every key seen so far is masked, m_new is -inf and s - m_new would be
        # (-inf) - (-inf) = NaN. Shifting by 0 instead keeps p = exp(-inf) = 0.
        m_shift = jnp.where(m_new == _NEG_INF, 0.0, m_new)
        alpha = jnp.exp(m_prev - m_shift)
        p = jnp.exp(s - m_shift[:, None])
        l_new = alpha * l_prev + jnp.sum(p, axis=1)
        acc = alpha[:, None] * acc + _dot(p.astype(v.dtype), v, 1, 0)
        return acc, m_new, l_new

    init = (
        jnp.zeros((bq, head_dim), jnp.float32),
        jnp.full((bq,), _NEG_INF, jnp.float32),
        jnp.zeros((bq,), jnp.float32),
    )
    upper = _causal_kv_blocks(qi, bq, bk, n_kv) if cfg.causal else n_kv
    acc, m, denom = lax.fori_loop(0, upper, body, init)
    empty = denom == 0.0  # every key masked: output 0 (documented), no 0/0
    o_ref[...] = (acc / jnp.where(empty, 1.0, denom)[:, None]).astype(o_ref.dtype)
    # NOTE: +inf logsumexp for an empty row makes the backward's exp(s - lse) exactly 0.
    lse_ref[...] = jnp.where(empty, jnp.inf, m + jnp.log(jnp.where(empty, 1.0, denom)))


def _dq_kernel(*refs: Any, cfg: _Config, has_bias: bool) -> None:
    if has_bias:
        q_ref, k_ref, v_ref, bias_ref, do_ref, lse_ref, delta_ref, dq_ref = refs
    else:
        (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref), bias_ref = refs, None
    bq, bk = cfg.block_q, cfg.block_k
    kv_pad, head_dim = k_ref.shape
    n_kv = kv_pad // bk
    qi = pl.program_id(2)
    q, do = q_ref[...], do_ref[...]
    lse, delta = lse_ref[...], delta_ref[...]
    q_idx = qi * bq + lax.broadcasted_iota(jnp.int32, (bq,), 0)

    def body(j, dq):
        start = pl.multiple_of(j * bk, bk)
        k = k_ref[pl.ds(start, bk), :]
        v = v_ref[pl.ds(start, bk), :]
        bias = None if bias_ref is None else bias_ref[:, pl.ds(start, bk)]
        k_idx = start + lax.broadcasted_iota(jnp.int32, (bk,), 0)
        s = _masked_logits(q, k, bias, q_idx, k_idx, cfg, kv_padded=cfg.kv_pad != cfg.kv_len)
        p = jnp.exp(s - lse[:, None])
        dp = _dot(do, v, 1, 1)
        ds = p * (dp - delta[:, None])
        return dq + _dot(ds.astype(k.dtype), k, 1, 0)

    upper = _causal_kv_blocks(qi, bq, bk, n_kv) if cfg.causal else n_kv
    dq = lax.fori_loop(0, upper, body, jnp.zeros((bq, head_dim), jnp.float32))
    dq_ref[...] = (dq * cfg.scale).astype(dq_ref.dtype)


def _dkv_kernel(*refs: Any, cfg: _Config, has_bias: bool, groups: int) -> None:
    """dk/dv of one key tile of one kv head, summed over the ``groups`` q heads it serves."""
    if has_bias:
        q_ref, k_ref, v_ref, bias_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref = refs
    else:
        (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref) = refs
        bias_ref = None
    bq, bk = cfg.block_q_bwd, cfg.block_k_bwd
    n_q = cfg.q_pad // bq
    kj = pl.program_id(2)
    k, v = k_ref[...], v_ref[...]
    head_dim = k.shape[1]
    k_idx = kj * bk + lax.broadcasted_iota(jnp.int32, (bk,), 0)
    # NOTE: bias_ref holds either all `groups` heads of this kv head or a single head
    # broadcast over them (mask head dim 1).
    bias_heads = 1 if bias_ref is None else bias_ref.shape[0]

    def q_step(i, carry, g):
        dk, dv = carry
        start = pl.multiple_of(i * bq, bq)
        q = q_ref[g, pl.ds(start, bq), :]
        do = do_ref[g, pl.ds(start, bq), :]
        lse = lse_ref[g, pl.ds(start, bq)]
        delta = delta_ref[g, pl.ds(start, bq)]
        bias = None
        if bias_ref is not None:
            bias = bias_ref[g if bias_heads > 1 else 0, pl.ds(start, bq), :]
        q_idx = start + lax.broadcasted_iota(jnp.int32, (bq,), 0)
        # NOTE: padded query rows are masked too (not only padded keys) so that their
        # finite logsumexp cannot leak into dk/dv.
        s = _masked_logits(
            q, k, bias, q_idx, k_idx, cfg,
            kv_padded=cfg.kv_pad != cfg.kv_len, q_padded=cfg.q_pad != cfg.q_len,
        )
        p = jnp.exp(s - lse[:, None])
        dv = dv + _dot(p.astype(do.dtype), do, 0, 0)
        dp = _dot(do, v, 1, 1)
        ds = p * (dp - delta[:, None])
        dk = dk + _dot(ds.astype(q.dtype), q, 0, 0)
        return dk, dv

    # Under the causal mask, query rows before this key tile's first key see none of it.
    lower = lax.div(kj * bk, bq) if cfg.causal else 0

    def head_step(g, carry):
        return lax.fori_loop(lower, n_q, functools.partial(q_step, g=g), carry)

    zeros = jnp.zeros((bk, head_dim), jnp.float32)
    dk, dv = lax.fori_loop(0, groups, head_step, (zeros, zeros))
    dk_ref[...] = (dk * cfg.scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


# ---------------------------------------------------------------------------------------
# pallas_call wrappers (inputs already padded)
# ---------------------------------------------------------------------------------------


def _bias_index(bias: jax.Array) -> tuple[bool, bool]:
    """Whether the bias varies over (batch, head): its size-1 dims are broadcast."""
    return bias.shape[0] != 1, bias.shape[1] != 1


def _num_warps(head_dim: int) -> int:
    return 4 if head_dim <= 64 else 8


def _fwd_call(cfg: _Config, q, k, v, bias):
    b, hq, q_pad, d = q.shape
    hkv, kv_pad = k.shape[1], k.shape[2]
    groups = hq // hkv
    bq = cfg.block_q
    # NOTE: GQA without repeating k/v: q head h reads kv head h // groups.
    in_specs = [
        pl.BlockSpec((None, None, bq, d), lambda bi, h, i: (bi, h, i, 0)),
        pl.BlockSpec((None, None, kv_pad, d), lambda bi, h, i: (bi, h // groups, 0, 0)),
        pl.BlockSpec((None, None, kv_pad, d), lambda bi, h, i: (bi, h // groups, 0, 0)),
    ]
    args = [q, k, v]
    if bias is not None:
        per_b, per_h = _bias_index(bias)
        in_specs.append(pl.BlockSpec(
            (None, None, bq, kv_pad),
            lambda bi, h, i: (bi if per_b else 0, h if per_h else 0, i, 0),
        ))
        args.append(bias)
    return pl.pallas_call(
        functools.partial(_fwd_kernel, cfg=cfg, has_bias=bias is not None),
        out_shape=(
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct((b, hq, q_pad), jnp.float32),
        ),
        grid=(b, hq, q_pad // bq),
        in_specs=in_specs,
        out_specs=(
            pl.BlockSpec((None, None, bq, d), lambda bi, h, i: (bi, h, i, 0)),
            pl.BlockSpec((None, None, bq), lambda bi, h, i: (bi, h, i)),
        ),
        compiler_params=compiler_params(cfg.interpret, num_warps=_num_warps(d)),
        interpret=cfg.interpret,
        name="flash_attention_fwd",
    )(*args)


def _dq_call(cfg: _Config, q, k, v, bias, do, lse, delta):
    b, hq, q_pad, d = q.shape
    hkv, kv_pad = k.shape[1], k.shape[2]
    groups = hq // hkv
    bq = cfg.block_q
    q_spec = pl.BlockSpec((None, None, bq, d), lambda bi, h, i: (bi, h, i, 0))
    kv_spec = pl.BlockSpec((None, None, kv_pad, d), lambda bi, h, i: (bi, h // groups, 0, 0))
    row_spec = pl.BlockSpec((None, None, bq), lambda bi, h, i: (bi, h, i))
    in_specs = [q_spec, kv_spec, kv_spec]
    args = [q, k, v]
    if bias is not None:
        per_b, per_h = _bias_index(bias)
        in_specs.append(pl.BlockSpec(
            (None, None, bq, kv_pad),
            lambda bi, h, i: (bi if per_b else 0, h if per_h else 0, i, 0),
        ))
        args.append(bias)
    in_specs += [q_spec, row_spec, row_spec]
    args += [do, lse, delta]
    return pl.pallas_call(
        functools.partial(_dq_kernel, cfg=cfg, has_bias=bias is not None),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid=(b, hq, q_pad // bq),
        in_specs=in_specs,
        out_specs=q_spec,
        compiler_params=compiler_params(cfg.interpret, num_warps=_num_warps(d)),
        interpret=cfg.interpret,
        name="flash_attention_dq",
    )(*args)


def _dkv_call(cfg: _Config, q, k, v, bias, do, lse, delta):
    b, hq, q_pad, d = q.shape
    hkv, kv_pad = k.shape[1], k.shape[2]
    groups = hq // hkv
    bk = cfg.block_k_bwd
    # NOTE: one program per (batch, kv head, key tile); its q-side blocks span the
    # `groups` consecutive q heads h*groups ... h*groups + groups - 1 that share kv head h,
    # so dk/dv come out already summed over the group.
    group_spec = pl.BlockSpec((None, groups, q_pad, d), lambda bi, h, j: (bi, h, 0, 0))
    group_rows = pl.BlockSpec((None, groups, q_pad), lambda bi, h, j: (bi, h, 0))
    kv_spec = pl.BlockSpec((None, None, bk, d), lambda bi, h, j: (bi, h, j, 0))
    in_specs = [group_spec, kv_spec, kv_spec]
    args = [q, k, v]
    if bias is not None:
        per_b, per_h = _bias_index(bias)
        in_specs.append(pl.BlockSpec(
            (None, groups if per_h else 1, q_pad, bk),
            lambda bi, h, j: (bi if per_b else 0, h if per_h else 0, 0, j),
        ))
        args.append(bias)
    in_specs += [group_spec, group_rows, group_rows]
    args += [do, lse, delta]
    return pl.pallas_call(
        functools.partial(_dkv_kernel, cfg=cfg, has_bias=bias is not None, groups=groups),
        out_shape=(
            jax.ShapeDtypeStruct(k.shape, k.dtype),
            jax.ShapeDtypeStruct(v.shape, v.dtype),
        ),
        grid=(b, hkv, kv_pad // bk),
        in_specs=in_specs,
        out_specs=(kv_spec, kv_spec),
        compiler_params=compiler_params(cfg.interpret, num_warps=_num_warps(d)),
        interpret=cfg.interpret,
        name="flash_attention_dkv",
    )(*args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(cfg: _Config, q, k, v, bias):
    return _fwd_call(cfg, q, k, v, bias)[0]


def _flash_fwd(cfg: _Config, q, k, v, bias):
    o, lse = _fwd_call(cfg, q, k, v, bias)
    return o, (q, k, v, bias, o, lse)


def _flash_bwd(cfg: _Config, res, do):
    q, k, v, bias, o, lse = res
    # NOTE: delta_i = sum_d dO_id * O_id (= rowsum(P * dP)) is one fused elementwise
    # reduction; XLA handles it well, so it is not a Pallas kernel of its own.
    delta = jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1)
    dq = _dq_call(cfg, q, k, v, bias, do, lse, delta)
    dk, dv = _dkv_call(cfg, q, k, v, bias, do, lse, delta)
    return dq, dk, dv, None  # None: no gradient into the mask


_flash.defvjp(_flash_fwd, _flash_bwd)


# ---------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------


def _mask_to_bias(mask: jax.Array, target: tuple[int, int, int, int]) -> jax.Array:
    """An additive float32 bias [B or 1, H or 1, q_len, kv_len] (bool False -> -inf)."""
    mask = jnp.reshape(mask, (1,) * (4 - mask.ndim) + mask.shape)
    if mask.dtype == jnp.bool_:
        bias = jnp.where(mask, 0.0, _NEG_INF).astype(jnp.float32)
    else:
        bias = mask.astype(jnp.float32)
    # Batch/head dims of size 1 stay broadcast (index maps pin them to 0); the two
    # sequence dims are tiled, so they are materialized.
    return jnp.broadcast_to(bias, bias.shape[:2] + target[2:])


@functools.partial(
    jax.jit, static_argnames=("causal", "scale", "block_sizes", "interpret")
)
def flash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | None = None,
    *,
    causal: bool = False,
    scale: float | None = None,
    block_sizes: BlockSizes | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """Scaled dot-product attention, ``softmax(q k^T * scale + mask) v``, as Pallas kernels.

    Args:
      q: ``[batch, q_heads, q_len, head_dim]``.
      k, v: ``[batch, kv_heads, kv_len, head_dim]``; ``kv_heads`` divides ``q_heads``.
      mask: optional bool (True = keep) or additive float mask broadcastable to
        ``[batch, q_heads, q_len, kv_len]``. Treated as a constant under autodiff.
      causal: mask key j for query i when j > i (top-left aligned, as PyTorch).
      scale: softmax scale (static); default ``1 / sqrt(head_dim)``.
      block_sizes: tile sizes; default :class:`BlockSizes()`.
      interpret: run in Pallas interpret mode; default :func:`default_interpret`.

    Returns:
      ``[batch, q_heads, q_len, head_dim]`` in the input dtype. Rows with every key
      masked are 0. Differentiable in q, k, v (custom VJP, Pallas backward).

    Raises:
      ValueError: for shapes/dtypes the kernel cannot take (see module docstring).
    """
    _check_attention(
        q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype,
        None if mask is None else mask.shape, None if mask is None else mask.dtype,
    )
    bs = BlockSizes() if block_sizes is None else block_sizes
    _, _, q_len, head_dim = q.shape
    kv_len = k.shape[2]
    tiles = {
        "block_q": effective_block(bs.block_q, q_len),
        "block_k": effective_block(bs.block_k, kv_len),
        "block_q_bwd": effective_block(bs.block_q_bwd or bs.block_q, q_len),
        "block_k_bwd": effective_block(bs.block_k_bwd or bs.block_k, kv_len),
    }
    # NOTE: the tiles are powers of two, so padding to the larger of the forward and
    # backward tile makes the padded length a multiple of both.
    q_pad = round_up(q_len, max(tiles["block_q"], tiles["block_q_bwd"]))
    kv_pad = round_up(kv_len, max(tiles["block_k"], tiles["block_k_bwd"]))
    cfg = _Config(
        causal=bool(causal),
        scale=1.0 / math.sqrt(head_dim) if scale is None else float(scale),
        q_len=q_len, kv_len=kv_len, q_pad=q_pad, kv_pad=kv_pad,
        interpret=resolve_interpret(interpret),
        **tiles,
    )
    # NOTE: zero head_dim columns change neither q.k nor the kept output columns; Triton
    # needs power-of-two tiles of at least MIN_BLOCK for its dots.
    d_pad = max(MIN_BLOCK, next_pow2(head_dim))
    qp = pad_axis(pad_axis(q, 2, q_pad), 3, d_pad)
    kp = pad_axis(pad_axis(k, 2, kv_pad), 3, d_pad)
    vp = pad_axis(pad_axis(v, 2, kv_pad), 3, d_pad)
    bias = None
    if mask is not None:
        bias = _mask_to_bias(mask, (q.shape[0], q.shape[1], q_len, kv_len))
        # Padded keys are masked inside the kernels, so a 0 fill is fine here.
        bias = pad_axis(pad_axis(bias, 2, q_pad), 3, kv_pad)
    out = _flash(cfg, qp, kp, vp, bias)
    return out[:, :, :q_len, :head_dim]


def flash_attention_reference(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | None = None,
    *,
    causal: bool = False,
    scale: float | None = None,
    block_sizes: BlockSizes | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """Plain ``jax.numpy`` attention with :func:`flash_attention`'s signature and semantics.

    Materializes the ``[q_len, kv_len]`` probabilities and the repeated k/v (for GQA);
    computes in float32. ``block_sizes`` and ``interpret`` are accepted and ignored.
    """
    del block_sizes, interpret
    _check_attention(
        q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype,
        None if mask is None else mask.shape, None if mask is None else mask.dtype,
    )
    head_dim = q.shape[-1]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    groups = q.shape[1] // k.shape[1]
    kf = jnp.repeat(k.astype(jnp.float32), groups, axis=1)
    vf = jnp.repeat(v.astype(jnp.float32), groups, axis=1)
    s = jnp.einsum("bhqd,bhkd->bhqk", q.astype(jnp.float32), kf, precision=_HIGHEST) * scale
    if mask is not None:
        s = jnp.where(mask, s, _NEG_INF) if mask.dtype == jnp.bool_ else s + mask
    if causal:
        q_len, kv_len = q.shape[2], k.shape[2]
        keep = jnp.arange(kv_len)[None, :] <= jnp.arange(q_len)[:, None]
        s = jnp.where(keep, s, _NEG_INF)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = lax.stop_gradient(jnp.where(jnp.isneginf(m), 0.0, m))
    p = jnp.exp(s - m)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    p = p / jnp.where(denom == 0.0, 1.0, denom)
    out = jnp.einsum("bhqk,bhkd->bhqd", p, vf, precision=_HIGHEST)
    return out.astype(q.dtype)

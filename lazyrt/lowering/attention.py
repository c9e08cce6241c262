"""Scaled dot-product attention: the fused SDPA ops, on the Pallas flash kernel or jnp.

How ``F.scaled_dot_product_attention`` reaches these lowerings on ``tpu``
----------------------------------------------------------------------------
``aten::scaled_dot_product_attention`` is CompositeImplicitAutograd: its C++ body
picks a backend with ``_fused_sdp_choice_stub``, a DispatchStub (not a dispatcher
call, so lazyrt never sees it, and a Python backend cannot register one). For
PrivateUse1 it answers "math", which decomposes into ``bmm``/``_safe_softmax``/``bmm``.

So lazyrt registers an ``AutogradPrivateUse1`` kernel for
``aten::scaled_dot_product_attention`` (``_pallas.sdpa_autograd_kernel``, registered by
``lazyrt._install``; it takes precedence over the composite kernel for ``tpu``
tensors only). When the call can use a fused op (4-D q/k/v of one floating dtype, no
dropout, a mask that needs no gradient, GQA only with ``enable_gqa=True``), it calls
``aten._scaled_dot_product_fused_attention_overrideable``, PyTorch's fused SDPA op
meant for PrivateUse1 backends: it takes ``attn_bias`` (bool or additive masks) and
its backward returns k/v gradients with the kv-head count (GQA), and PyTorch's own
autograd formula calls ``..._overrideable_backward``. Otherwise it runs the composite
kernel unchanged (the math path).

The lowerings of the fused ops (the overrideable pair, and for direct callers the
``_scaled_dot_product_flash_attention`` and ``_efficient_attention`` pairs) ask the
router at trace time (``pallas_router.attention_route``): ``kernels_pallas.flash_attention``
where the Pallas policy (and under ``auto`` the measured table,
``lazyrt._base.backend_choices``) runs it and it takes the shapes; on an NVIDIA GPU,
XLA's fused cuDNN attention (``jax.nn.dot_product_attention(implementation="cudnn")``)
for float16/bfloat16 calls without a mask within cuDNN's limits; else a plain ``jnp``
math path computing the same thing (so results never depend on the route beyond
rounding). The cuDNN route's backward is cuDNN's (JAX's VJP of the cuDNN forward). The
kernel's gradient is its custom VJP (the Pallas backward kernels; it recomputes the
forward tile by tile). The jnp path's backward is flash attention's formula on the forward's output and logsumexp
(``_math_backward``): the probabilities are ``exp(scores - lse)``, so the softmax is
not run again; it falls back to ``jax.vjp`` of the forward when the mask wants a
gradient or no logsumexp came with the call.

Returned ``logsumexp``: exact, from ``_math_forward``'s pass over the scores (on the
cuDNN route, cuDNN's, in the input's precision: ``pallas_router.cudnn_attention``). On the
kernel route that pass runs for the logsumexp alone (the public kernel API does not
return its own), materializing the scores once, and the kernel's backward never reads it.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from .._base import compat
from .._base.metrics import COUNTERS
from . import pallas_router as _pallas
from ._registry import aten, lower
from ._util import matmul_precision, vjp

_NEG_INF = float("-inf")


# ---------------------------------------------------------------------------
# jnp math path
# ---------------------------------------------------------------------------

def _scale_of(q, scale):
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def _scores(q, k, mask, causal, scale, row0=0):
    """float32 scaled scores [B, Hq, L, S] with masks applied (-inf = dropped); ``row0``:
    the query rows' offset, for a causal block of rows (``_causal_blocks``)."""
    groups = q.shape[-3] // k.shape[-3] if q.ndim >= 3 and k.ndim >= 3 else 1
    kf = k.astype(jnp.float32)
    if groups > 1:
        kf = jnp.repeat(kf, groups, axis=-3)
    s = jnp.einsum("...qd,...kd->...qk", q.astype(jnp.float32), kf,
                   precision=matmul_precision()) * _scale_of(q, scale)
    if mask is not None:
        s = jnp.where(mask, s, _NEG_INF) if mask.dtype == jnp.bool_ else s + mask.astype(jnp.float32)
    if causal:
        L, S = q.shape[-2], k.shape[-2]
        keep = jnp.arange(S)[None, :] <= jnp.arange(L)[:, None] + row0
        s = jnp.where(keep, s, _NEG_INF)
    return s


def _repeat_kv(x, q):
    """``x`` (keys or values) in float32, its heads repeated to ``q``'s (GQA)."""
    groups = q.shape[-3] // x.shape[-3] if q.ndim >= 3 and x.ndim >= 3 else 1
    x = x.astype(jnp.float32)
    return jnp.repeat(x, groups, axis=-3) if groups > 1 else x


def _sum_groups(dx, x):
    """The gradient of ``_repeat_kv(x, q)`` summed back onto ``x``'s heads."""
    if dx.ndim < 3 or dx.shape[-3] == x.shape[-3]:
        return dx
    hk = x.shape[-3]
    return dx.reshape(*dx.shape[:-3], hk, dx.shape[-3] // hk, *dx.shape[-2:]).sum(-3)


def _causal_blocks(q, k, mask, causal):
    """Row blocks ``[(r0, r1), ...]`` for a causal call with no mask and as many queries as
    keys, or None. Block ``[r0, r1)`` of the queries sees keys ``[0, r1)`` only, so the
    matmuls skip the masked upper triangle block by block, as flash attention's tiles do
    (a quarter of the work at 2 blocks, ~3/8 at 4). Measured on XLA:CPU, fwd+bwd in plain
    JAX (B8 H4 S128 / B4 H8 S256 / B2 H8 S512, D64): 6.7 / 24.4 / 48.2 ms whole, 4.4 /
    16.2 / 35.9 ms in blocks of 64 / 128 / 128 rows; more, smaller blocks gained nothing."""
    if not causal or mask is not None or q.ndim < 2:
        return None
    n = q.shape[-2]
    if n != k.shape[-2] or n < 128:
        return None
    bs = 64 if n < 256 else max(128, -(-n // 16))
    return [(r0, min(r0 + bs, n)) for r0 in range(0, n, bs)]


def _forward_rows(q, k, v, mask, causal, scale, row0=0):
    s = _scores(q, k, mask, causal, scale, row0)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = lax.stop_gradient(jnp.where(jnp.isneginf(m), 0.0, m))
    p = jnp.exp(s - m)
    den = jnp.sum(p, axis=-1, keepdims=True)
    lse = (jnp.log(den) + m)[..., 0]
    p = p / jnp.where(den == 0.0, 1.0, den)
    out = jnp.einsum("...qk,...kd->...qd", p, _repeat_kv(v, q), precision=matmul_precision())
    return out, lse


def _math_forward(q, k, v, mask, causal, scale):
    """(softmax(q k^T * scale + mask) v, its logsumexp [.., L]) in float32 from one pass
    over the scores; rows with every key dropped give 0 and a logsumexp of -inf (PyTorch's
    ``_safe_softmax``). A causal call runs in row blocks (``_causal_blocks``)."""
    blocks = _causal_blocks(q, k, mask, causal)
    if blocks is None:
        out, lse = _forward_rows(q, k, v, mask, causal, scale)
    else:
        parts = [_forward_rows(q[..., r0:r1, :], k[..., :r1, :], v[..., :r1, :], None, True,
                               scale, r0) for r0, r1 in blocks]
        out = jnp.concatenate([o for o, _ in parts], axis=-2)
        lse = jnp.concatenate([x for _, x in parts], axis=-1)
    return out.astype(q.dtype), lse


def _math_attention(q, k, v, mask, causal, scale):
    return _math_forward(q, k, v, mask, causal, scale)[0]


def _backward_rows(g, q, k, v, mask, causal, scale, out, lse, row0=0):
    """float32 (dq, dk, dv), dk and dv with q's head count, for the rows of ``q``."""
    prec = matmul_precision()
    sc = _scale_of(q, scale)
    p = jnp.exp(_scores(q, k, mask, causal, scale, row0)
                - jnp.where(jnp.isneginf(lse), 0.0, lse)[..., None])
    gf = g.astype(jnp.float32)
    dv = jnp.einsum("...qk,...qd->...kd", p, gf, precision=prec)
    dp = jnp.einsum("...qd,...kd->...qk", gf, _repeat_kv(v, q), precision=prec)
    ds = p * (dp - jnp.sum(gf * out.astype(jnp.float32), axis=-1, keepdims=True))
    dq = jnp.einsum("...qk,...kd->...qd", ds, _repeat_kv(k, q), precision=prec) * sc
    dk = jnp.einsum("...qk,...qd->...kd", ds, q.astype(jnp.float32), precision=prec) * sc
    return dq, dk, dv


def _math_backward(g, q, k, v, mask, causal, scale, out, lse):
    """(dq, dk, dv) from the forward's output and logsumexp, as flash attention's backward
    does: the probabilities are ``exp(scores - lse)``, so the softmax is not run again
    (autodiff of ``_math_attention`` would recompute its max, sum and division). A causal
    call runs in the forward's row blocks; block ``[r0, r1)`` adds to the key rows below
    ``r1``."""
    blocks = _causal_blocks(q, k, mask, causal)
    if blocks is None:
        dq, dk, dv = _backward_rows(g, q, k, v, mask, causal, scale, out, lse)
    else:
        n = k.shape[-2]
        dqs, dk, dv = [], 0.0, 0.0
        for r0, r1 in blocks:
            dq_i, dk_i, dv_i = _backward_rows(
                g[..., r0:r1, :], q[..., r0:r1, :], k[..., :r1, :], v[..., :r1, :], None,
                True, scale, out[..., r0:r1, :], lse[..., r0:r1], r0)
            pad = [(0, 0)] * (dk_i.ndim - 2) + [(0, n - r1), (0, 0)]
            dqs.append(dq_i)
            dk = dk + jnp.pad(dk_i, pad)
            dv = dv + jnp.pad(dv_i, pad)
        dq = jnp.concatenate(dqs, axis=-2)
    return (dq.astype(q.dtype), _sum_groups(dk, k).astype(k.dtype),
            _sum_groups(dv, v).astype(v.dtype))


# ---------------------------------------------------------------------------
# routed forward / backward
# ---------------------------------------------------------------------------

def _forward(q, k, v, mask, causal, scale, with_lse=True):
    route = _pallas.attention_route(q, k, v, mask, causal)
    if route == "cudnn":
        return _pallas.cudnn_attention(q, k, v, causal, scale, with_lse)
    if route == "pallas":
        out = _pallas.flash_attention(q, k, v, mask, causal, scale)
        # (the jnp forward's output is unused here: XLA drops its matmul)
        lse = _math_forward(q, k, v, mask, causal, scale)[1] if with_lse else None
        return out, lse
    out, lse = _math_forward(q, k, v, mask, causal, scale)
    return out, (lse if with_lse else None)


def _backward(g, q, k, v, mask, causal, scale, grad_mask=False, out=None, lse=None):
    """(dq, dk, dv, dmask or None). A gradient for an additive mask forces the math
    path (the kernel treats its mask as a constant). With the forward's ``out`` and
    ``lse`` (at least L rows: the efficient op pads them) the math path reuses them."""
    g = g.astype(q.dtype)
    if grad_mask and mask is not None and mask.dtype != jnp.bool_:
        if _pallas.active():
            COUNTERS["pallas_fallbacks"] += 1
        _, pull = vjp(lambda q_, k_, v_, m_: _math_attention(q_, k_, v_, m_, causal, scale),
                      q, k, v, mask)
        return pull(g)
    route = _pallas.attention_route(q, k, v, mask, causal)
    if route == "cudnn":
        dq, dk, dv = _pallas.cudnn_attention_vjp(g, q, k, v, causal, scale)
    elif route == "pallas":
        dq, dk, dv = _pallas.flash_attention_vjp(g, q, k, v, mask, causal, scale)
    elif out is not None and lse is not None and lse.shape[-1] >= q.shape[-2]:
        dq, dk, dv = _math_backward(g, q, k, v, mask, causal, scale, out,
                                    lse[..., :q.shape[-2]])
    else:
        _, pull = vjp(lambda q_, k_, v_: _math_attention(q_, k_, v_, mask, causal, scale),
                      q, k, v)
        dq, dk, dv = pull(g)
    return dq, dk, dv, None


def _no_dropout(op, dropout_p):
    # dropout_p is static (static_floats=True).
    if dropout_p:
        raise NotImplementedError(
            f"lazyrt: {op} with dropout_p={dropout_p} is not supported on tpu; "
            f"F.scaled_dot_product_attention with dropout takes the math path")


def _zeros(shape, dtype):
    return jnp.zeros(shape, dtype)


# ---------------------------------------------------------------------------
# the overrideable fused op (what SDPA on tpu is redirected to)
# ---------------------------------------------------------------------------

@lower(aten._scaled_dot_product_fused_attention_overrideable.default, static_floats=True)
def sdpa_overrideable(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False,
                      return_debug_mask=False, *, scale=None):
    _no_dropout("_scaled_dot_product_fused_attention_overrideable", dropout_p)
    out, lse = _forward(query, key, value, attn_bias, is_causal, scale)
    # (output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, philox_seed,
    #  philox_offset, debug_attn_mask); SymInt returns come from the meta kernel.
    return (out, lse, None, None, None, None, _zeros((), jnp.int64), _zeros((), jnp.int64), None)


@lower(aten._scaled_dot_product_fused_attention_overrideable_backward.default,
       static_floats=True)
def sdpa_overrideable_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out,
                               logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                               is_causal, philox_seed, philox_offset, *, scale=None):
    _no_dropout("_scaled_dot_product_fused_attention_overrideable_backward", dropout_p)
    dq, dk, dv, db = _backward(grad_out, query, key, value, attn_bias, is_causal, scale,
                               grad_mask=bool(grad_input_mask[3]), out=out, lse=logsumexp)
    if attn_bias is None:
        return dq, dk, dv, None
    if db is None:
        db = jnp.zeros(attn_bias.shape, jnp.float32)
    return dq, dk, dv, db


# ---------------------------------------------------------------------------
# flash / efficient ops (direct callers; SDPA on tpu never picks them)
# ---------------------------------------------------------------------------

@lower(aten._scaled_dot_product_flash_attention.default, static_floats=True)
def sdpa_flash(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False,
               *, scale=None):
    _no_dropout("_scaled_dot_product_flash_attention", dropout_p)
    out, lse = _forward(query, key, value, None, is_causal, scale)
    # (output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused,
    #  debug_attn_mask)
    return (out, lse, None, None, None, None, _zeros((2,), jnp.uint64), _zeros((), jnp.uint64),
            _zeros((0,), query.dtype))


@lower(aten._scaled_dot_product_flash_attention_backward.default, static_floats=True)
def sdpa_flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k,
                        max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *,
                        scale=None):
    _no_dropout("_scaled_dot_product_flash_attention_backward", dropout_p)
    dq, dk, dv, _ = _backward(grad_out, query, key, value, None, is_causal, scale, out=out,
                              lse=logsumexp)
    return dq, dk, dv


@lower(aten._scaled_dot_product_efficient_attention.default, static_floats=True)
def sdpa_efficient(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0,
                   is_causal=False, *, scale=None):
    _no_dropout("_scaled_dot_product_efficient_attention", dropout_p)
    out, lse = _forward(query, key, value, attn_bias, is_causal, scale,
                        with_lse=compute_log_sumexp)
    b, h, L = query.shape[0], query.shape[1], query.shape[2]
    if compute_log_sumexp:
        # PyTorch pads the logsumexp to a multiple of 32 rows.
        padded = -(-L // 32) * 32
        lse = jnp.pad(lse, ((0, 0), (0, 0), (0, padded - L)), constant_values=jnp.inf)
    else:
        lse = jnp.zeros((b, h, 0), jnp.float32)
    return out, lse, _zeros((), jnp.int64), _zeros((), jnp.int64)


@lower(aten._scaled_dot_product_efficient_attention_backward.default, static_floats=True)
def sdpa_efficient_backward(grad_out_, query, key, value, attn_bias, out, logsumexp,
                            philox_seed, philox_offset, dropout_p, grad_input_mask,
                            is_causal=False, *, scale=None):
    # NOTE: PyTorch's meta kernel gives dk/dv the q-head count, so GQA cannot take
    # this op (SDPA on tpu uses the overrideable op instead).
    _no_dropout("_scaled_dot_product_efficient_attention_backward", dropout_p)
    want_bias = bool(grad_input_mask[3]) and attn_bias is not None
    dq, dk, dv, db = _backward(grad_out_, query, key, value, attn_bias, is_causal, scale,
                               grad_mask=want_bias, out=out, lse=logsumexp)
    return dq, dk, dv, (db if want_bias else None)


# ---------------------------------------------------------------------------
# F.scaled_dot_product_attention on tpu -> the overrideable fused op
# ---------------------------------------------------------------------------

def _overrideable_backward_meta(grad_out, query, key, value, attn_bias, grad_input_mask, out,
                                logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                                is_causal, philox_seed, philox_offset, *, scale=None):
    """PyTorch's own meta kernel of the overrideable backward (torch 2.13's
    ``_meta_registrations``): the gradients have their inputs' shapes."""
    import torch

    return (torch.empty_like(query), torch.empty_like(key), torch.empty_like(value),
            torch.empty_like(attn_bias) if attn_bias is not None else None)


# NOTE: without a meta kernel lazyrt cannot plan the backward's outputs (torch 2.11 raises
# "This is an operator for privateuse1 backends"): PyTorch's own, where torch has none.
compat.fill_meta(aten._scaled_dot_product_fused_attention_overrideable_backward.default,
                 _overrideable_backward_meta, "sdpa_overrideable_backward_meta")

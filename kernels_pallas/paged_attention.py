"""Ragged paged attention (continuous batching's decode + chunked prefill), as a Pallas kernel.

Layout: transformers' paged KV cache (``generation/continuous_batching``, the block-table
path of ``PagedAttentionCache.update``, flash-attn's ``flash_attn_with_kvcache`` layout):

* ``q``: ``[T, Hq, D]``, the queries of every sequence of the batch packed one after the
  other (``cu_seq_lens_q``: ``[B + 1]`` int32 offsets; tokens past ``cu_seq_lens_q[B]``
  are padding and get zeros);
* ``k_pages``/``v_pages``: ``[num_pages, page_size, Hkv, D]``, the cache's page views
  (``get_cache_for_block_table``); the new tokens' keys/values are already written;
* ``block_table``: ``[B, max_pages]`` int32, page ids of each sequence in order (entries
  past a sequence's length are never read);
* ``kv_lens``: ``[B]`` int32, each sequence's context length including its new tokens.

Query ``i`` of sequence ``b`` (``q_len = cu[b+1] - cu[b]``) sits at position
``kv_lens[b] - q_len + i`` and attends to keys ``0..position`` (causal, bottom-right
aligned, as flash-attn's varlen kernels). GQA: query head ``h`` reads kv head
``h // (Hq // Hkv)``. Softmax in float32, output in ``q``'s dtype.

The kernel: one program per query token; it finds the token's sequence from
``cu_seq_lens_q``, then walks that sequence's pages (only those up to its position) with
an online softmax. ``paged_attention_reference`` gathers the pages and runs dense masked
attention in plain ``jax.numpy``.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_pallas._common import resolve_interpret

_NEG_INF = float("-inf")


def _check(q, k_pages, v_pages, block_table, cu_seq_lens_q, kv_lens):
    if q.ndim != 3 or k_pages.ndim != 4 or k_pages.shape != v_pages.shape:
        raise ValueError(f"paged attention: q [T, Hq, D] and k/v pages [P, page, Hkv, D] of one "
                         f"shape, got {q.shape}, {k_pages.shape}, {v_pages.shape}")
    hq, d = q.shape[1], q.shape[2]
    hkv = k_pages.shape[2]
    if k_pages.shape[3] != d or hq % hkv:
        raise ValueError(f"paged attention: head dim {d} vs {k_pages.shape[3]}, or {hq} query "
                         f"heads not a multiple of {hkv} kv heads")
    b = block_table.shape[0]
    if block_table.ndim != 2 or cu_seq_lens_q.shape != (b + 1,) or kv_lens.shape != (b,):
        raise ValueError(f"paged attention: block_table [B, max_pages], cu_seq_lens_q [B+1], "
                         f"kv_lens [B]; got {block_table.shape}, {cu_seq_lens_q.shape}, "
                         f"{kv_lens.shape}")


def _token_place(t, cu):
    """(sequence, position in its context, valid) of packed query token ``t``."""
    nb = cu.shape[0] - 1
    b = jnp.sum((cu[1:] <= t).astype(jnp.int32))
    valid = b < nb
    b = jnp.minimum(b, nb - 1)
    return b, valid


def _kernel(cu_ref, kvl_ref, bt_ref, q_ref, k_ref, v_ref, o_ref, *, scale, groups):
    t = pl.program_id(0)
    cu = cu_ref[...]
    b, valid = _token_place(t, cu)
    q_len = cu[b + 1] - cu[b]
    kv_len = kvl_ref[b]
    pos = kv_len - q_len + (t - cu[b])
    page = k_ref.shape[1]
    hq, d = q_ref.shape[1], q_ref.shape[2]
    hkv = hq // groups
    q = q_ref[t].astype(jnp.float32).reshape(hkv, groups, d) * scale
    n_pages = jnp.where(valid, pos // page + 1, 0)

    def body(j, carry):
        m, denom, acc = carry
        pid = bt_ref[b, j]
        k = k_ref[pid].astype(jnp.float32)  # [page, Hkv, D]
        v = v_ref[pid].astype(jnp.float32)
        s = jnp.einsum("hgd,phd->hgp", q, k, preferred_element_type=jnp.float32)
        kpos = j * page + jnp.arange(page, dtype=jnp.int32)
        s = jnp.where((kpos <= pos)[None, None, :], s, _NEG_INF)
        m_new = jnp.maximum(m, s.max(-1))
        alpha = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new[..., None])
        denom = denom * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + jnp.einsum("hgp,phd->hgd", p, v,
                                                  preferred_element_type=jnp.float32)
        return m_new, denom, acc

    init = (jnp.full((hkv, groups), -1e30, jnp.float32), jnp.zeros((hkv, groups), jnp.float32),
            jnp.zeros((hkv, groups, d), jnp.float32))
    _, denom, acc = jax.lax.fori_loop(0, n_pages, body, init)
    out = acc / jnp.where(denom == 0.0, 1.0, denom)[..., None]
    o_ref[t] = jnp.where(valid, out, 0.0).reshape(hq, d).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("scale", "interpret"))
def paged_attention(q, k_pages, v_pages, block_table, cu_seq_lens_q, kv_lens, *,
                    scale: float | None = None, interpret: bool | None = None):
    """Ragged paged attention (module docstring): ``[T, Hq, D]`` in ``q``'s dtype."""
    _check(q, k_pages, v_pages, block_table, cu_seq_lens_q, kv_lens)
    t, hq, d = q.shape
    groups = hq // k_pages.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    return pl.pallas_call(
        functools.partial(_kernel, scale=scale, groups=groups),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid=(t,),
        interpret=resolve_interpret(interpret),
        name="ragged_paged_attention",
    )(cu_seq_lens_q.astype(jnp.int32), kv_lens.astype(jnp.int32),
      block_table.astype(jnp.int32), q, k_pages, v_pages)


def paged_attention_reference(q, k_pages, v_pages, block_table, cu_seq_lens_q, kv_lens, *,
                              scale: float | None = None, interpret: bool | None = None):
    """Plain ``jax.numpy`` oracle for :func:`paged_attention` (same signature; ``interpret``
    ignored): gathers each sequence's pages, dense masked attention in float32."""
    del interpret
    _check(q, k_pages, v_pages, block_table, cu_seq_lens_q, kv_lens)
    t, hq, d = q.shape
    n_pages, page, hkv, _ = k_pages.shape
    groups = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    cu = cu_seq_lens_q.astype(jnp.int32)
    bt = jnp.clip(block_table.astype(jnp.int32), 0, n_pages - 1)
    ctx = bt.shape[1] * page
    # every sequence's keys/values, dense: [B, ctx, Hkv, D]
    kd = k_pages[bt].reshape(bt.shape[0], ctx, hkv, d).astype(jnp.float32)
    vd = v_pages[bt].reshape(bt.shape[0], ctx, hkv, d).astype(jnp.float32)
    b, valid = jax.vmap(lambda i: _token_place(i, cu))(jnp.arange(t, dtype=jnp.int32))
    pos = kv_lens.astype(jnp.int32)[b] - (cu[b + 1] - cu[b]) + (jnp.arange(t) - cu[b])
    kb = jnp.repeat(kd[b], groups, axis=2)  # [T, ctx, Hq, D]
    vb = jnp.repeat(vd[b], groups, axis=2)
    s = jnp.einsum("thd,tchd->thc", q.astype(jnp.float32), kb,
                   precision=jax.lax.Precision.HIGHEST) * scale
    keep = jnp.arange(ctx)[None, :] <= pos[:, None]
    s = jnp.where(keep[:, None, :], s, _NEG_INF)
    p = jax.nn.softmax(s, axis=-1)
    out = jnp.einsum("thc,tchd->thd", p, vb, precision=jax.lax.Precision.HIGHEST)
    return jnp.where(valid[:, None, None], out, 0.0).astype(q.dtype)

"""FlexAttention as JAX math: the ``flex_attention`` and ``flex_attention_backward``
higher-order ops of a compiled graph (``lazyrt._compile.flex``) inside its one program.

The math is PyTorch's dense reference (``math_attention``, ``sdpa_dense_backward`` in
torch/_higher_order_ops/flex_attention.py, torch 2.13), the same CPU eager and lazyrt's
eager rule (``lazyrt._torch.flex``) run, step by step and in the same dtypes: scores in
float32 (float64 for float64 inputs), the score mod applied and the mask mod's False
positions set to -inf, a safe softmax (a row with nothing to attend to gives zeros and a
logsumexp of -inf), the probabilities cast to the inputs' dtype for the product with the
values; logsumexp and max are returned in base 2, as the HOP does. Every position is
computed (the block mask's sparsity saves nothing), as in PyTorch's reference.

The score and mask mods are FX graphs of ATen ops on scalars (the HOP's subgraphs). Each
runs through lazyrt's lowerings (``_traced``) under ``jax.vmap`` over the batch, head,
query and key indices. The backward differentiates the score mod with ``jax.vjp`` (for the
scores and the captured buffers that need a gradient), where PyTorch runs the joint graph
it traced: the same derivative.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from . import _traced
from .linalg import matmul as _matmul

_LN2 = math.log(2.0)


def subgraph_fn(gm):
    """The ATen FX graph ``gm`` as a JAX function of its placeholders (lowerings, or
    PyTorch's decompositions run on lowerings, per node)."""

    def fn(*args):
        return _traced.run_graph(gm, args, node_fn=_traced.jax_fn)

    return fn


def index_dtypes(gm) -> list:
    """The dtypes of a mod's four index placeholders (b, h, q_idx, kv_idx)."""
    out = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            v = node.meta.get("val")
            out.append(v.dtype if v is not None else None)
    return out


def _over_indices(fn, n_lead: int):
    """``fn(*lead, b, h, m, n, *bufs)`` (a mod on scalars) over index vectors b, h, m, n:
    the ``lead`` arrays (the scores) batched over all four index dims, buffers shared;
    nested ``jax.vmap``s, b outermost (PyTorch's ``_vmap_for_bhqkv``)."""
    inner = lambda *a: fn(*a[:-1], *a[-1])  # the buffers come as one tuple
    for axis in (3, 2, 1, 0):
        ins = [0] * n_lead + [None] * 4
        ins[n_lead + axis] = 0
        inner = jax.vmap(inner, in_axes=(*ins, None))
    return lambda *a: inner(*a[:n_lead + 4], tuple(a[n_lead + 4:]))


def _indices(shape, dtypes):
    return [jnp.arange(n, dtype=dt if dt is not None else jnp.int32)
            for n, dt in zip(shape, dtypes)]


def _prepare(q, k, v):
    """k, v broadcast over the query's batch and repeated over its head groups (GQA)."""
    bq, hq = q.shape[0], q.shape[1]
    bkv, hkv = k.shape[0], k.shape[1]
    if not (bq == bkv or (bq > 1 and bkv == 1)):
        raise RuntimeError(f"Bq and Bkv must broadcast. Got Bq={bq} and Bkv={bkv}")
    g = hq // hkv
    k = jnp.broadcast_to(jnp.repeat(k, g, axis=1), (bq, hq) + k.shape[2:])
    v = jnp.broadcast_to(jnp.repeat(v, g, axis=1), (bq, hq) + v.shape[2:])
    return k, v, g


def _work(q):
    return jnp.float64 if q.dtype == jnp.float64 else jnp.float32


def _sum(x, axis: int, keepdims: bool = False):
    """A sum accumulated in float32 at least, as PyTorch's CPU sum of low-precision
    floats, in ``x``'s dtype."""
    acc = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    return jnp.sum(acc, axis=axis, keepdims=keepdims).astype(x.dtype)


def _sum_heads(x, hkv: int, g: int):
    """Sum the ``g`` query heads of each kv head (GQA)."""
    if g == 1:
        return x
    return _sum(x.reshape(x.shape[0], hkv, g, *x.shape[2:]), 2)


def _scores(q, k, score, mask, scale, score_bufs, mask_bufs, idx_dtypes):
    """``_math_attention_inner``: (scores, post-mod scores, mask, the score mod as a
    function of the scores and buffers)."""
    wp = _work(q)
    s = _matmul(q.astype(wp), jnp.swapaxes(k.astype(wp), -2, -1)).astype(wp)
    s = (s * scale).astype(wp)
    b, h, m, n = _indices(s.shape, idx_dtypes)
    keep = _over_indices(mask, 0)(b, h, m, n, *mask_bufs).astype(bool)
    score_all = _over_indices(score, 1)

    def scored(s_, *bufs):
        return score_all(s_, b, h, m, n, *bufs).astype(wp)

    post = jnp.where(keep, scored(s, *score_bufs), jnp.asarray(-jnp.inf, wp))
    return s, post, keep, scored


def forward(q, k, v, score, mask, scale, score_bufs, mask_bufs, idx_dtypes):
    """``flex_attention``: (out, logsumexp / ln 2, max / ln 2). ``score``/``mask``: the mods
    as JAX functions of their placeholders (``subgraph_fn``); ``idx_dtypes``: the dtypes
    of their index placeholders."""
    k, v, _ = _prepare(q, k, v)
    _, post, _, _ = _scores(q, k, score, mask, scale, score_bufs, mask_bufs, idx_dtypes)
    rows_empty = jnp.all(post == -jnp.inf, axis=-1)
    mx = jnp.max(post, axis=-1)
    safe_mx = jnp.where(rows_empty, 0, mx)
    e = jnp.exp(post - safe_mx[..., None])
    denom = jnp.sum(e, axis=-1)
    lse = jnp.where(rows_empty, -jnp.inf, jnp.log(jnp.where(rows_empty, 1, denom)) + safe_mx)
    p = jnp.where(rows_empty[..., None], 0, e / jnp.where(rows_empty, 1, denom)[..., None])
    out = _matmul(p.astype(q.dtype), v.astype(q.dtype)).astype(q.dtype)
    return out, (lse / _LN2).astype(jnp.float32), (mx / _LN2).astype(jnp.float32)


def backward(q, k, v, out, lse, grad_out, grad_lse, score, mask, scale, score_bufs,
             mask_bufs, idx_dtypes, buf_grads):
    """``flex_attention_backward``: (dq, dk, dv, [d buffer or None per score buffer]);
    ``buf_grads[i]``: whether score buffer i gets a gradient."""
    bq, bkv = q.shape[0], k.shape[0]
    hkv = k.shape[1]
    k_full, v_full, g = _prepare(q, k, v)
    if grad_out is None:
        grad_out = jnp.zeros_like(out)
    lse = lse * _LN2
    glse = jnp.zeros_like(lse) if grad_lse is None else grad_lse / _LN2
    s, post, keep, scored = _scores(q, k_full, score, mask, scale, score_bufs, mask_bufs,
                                    idx_dtypes)
    sdt = post.dtype
    rows_empty = lse == -jnp.inf
    p = jnp.exp(post - jnp.where(rows_empty, 0, lse)[..., None])
    p = jnp.where(rows_empty[..., None], 0, p)
    dv = _matmul(jnp.swapaxes(p.astype(q.dtype), -2, -1), grad_out).astype(q.dtype)
    dp = _matmul(grad_out.astype(sdt), jnp.swapaxes(v_full.astype(sdt), -2, -1))
    total = jnp.sum(out.astype(sdt) * grad_out.astype(sdt), axis=-1, keepdims=True)
    d_mod = p * (dp - total + glse[..., None])
    diff = [i for i, want in enumerate(buf_grads) if want]

    def f(s_, *dbufs):
        bufs = list(score_bufs)
        for i, x in zip(diff, dbufs):
            bufs[i] = x
        return scored(s_, *bufs)

    _, vjp = jax.vjp(f, s, *[score_bufs[i] for i in diff])
    ds, *dbufs = vjp(d_mod.astype(sdt))
    ds = (ds * scale).astype(q.dtype)
    ds = jnp.where(keep, ds, jnp.zeros((), q.dtype))
    dq = _matmul(ds, k_full).astype(q.dtype)
    dk = _matmul(jnp.swapaxes(ds, -2, -1), q).astype(q.dtype)
    dk, dv = _sum_heads(dk, hkv, g), _sum_heads(dv, hkv, g)
    if bq != bkv:
        dk, dv = _sum(dk, 0, True), _sum(dv, 0, True)
    grads = [None] * len(buf_grads)
    for i, d in zip(diff, dbufs):
        grads[i] = d.astype(score_bufs[i].dtype)
    return dq, dk.astype(k.dtype), dv.astype(v.dtype), grads

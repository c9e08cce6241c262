"""losses lowerings."""
from __future__ import annotations

import jax.numpy as jnp

from .._base import compat
from ._registry import aten, lower


def _ctc(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity):
    import numpy as np
    from jax import lax

    lp = log_probs.astype(jnp.float32) if log_probs.dtype in (jnp.bfloat16, jnp.float16) \
        else log_probs
    unbatched = lp.ndim == 2
    if unbatched:
        lp = lp[:, None]
        targets = targets.reshape(1, -1) if targets.ndim == 1 else targets
    T, N, C = lp.shape
    il = np.asarray(list(input_lengths), np.int64).reshape(N)
    tl = np.asarray(list(target_lengths), np.int64).reshape(N)
    smax = int(tl.max()) if tl.size else 0
    L = 2 * smax + 1
    if targets.ndim == 1:  # concatenated targets
        off = np.concatenate([[0], np.cumsum(tl)[:-1]]).astype(np.int64)
        tidx = np.minimum(off[:, None] + np.arange(max(smax, 1))[None, :],
                          max(targets.shape[0] - 1, 0))
        tgt = targets[jnp.asarray(tidx)] if targets.shape[0] else jnp.zeros(tidx.shape, jnp.int64)
    else:
        tgt = targets[:, :max(smax, 1)] if targets.shape[1] else jnp.zeros((N, 1), jnp.int64)
        if tgt.shape[1] < max(smax, 1):
            tgt = jnp.pad(tgt, ((0, 0), (0, max(smax, 1) - tgt.shape[1])))
    tgt = tgt.astype(jnp.int64)[:, :smax]
    ext = jnp.full((N, L), blank, jnp.int64)
    if smax:
        ext = ext.at[:, 1::2].set(tgt)
    s = np.arange(L)
    valid_s = jnp.asarray(s[None, :] < (2 * tl[:, None] + 1))
    prev2 = jnp.concatenate([jnp.full((N, 2), -1, jnp.int64), ext[:, :-2]], 1)
    allow2 = (ext != blank) & (ext != prev2) & jnp.asarray(s >= 2)[None]
    neg = jnp.asarray(-jnp.inf, lp.dtype)

    def emit(t):
        return jnp.take_along_axis(lp[t], ext, axis=1)  # N, L

    a0 = jnp.where(jnp.asarray(s <= 1)[None] & valid_s, emit(0), neg)

    def step(a, t):
        a1 = jnp.concatenate([jnp.full((N, 1), neg), a[:, :-1]], 1)
        a2 = jnp.concatenate([jnp.full((N, 2), neg), a[:, :-2]], 1)
        a2 = jnp.where(allow2, a2, neg)
        m = jnp.maximum(jnp.maximum(a, a1), a2)
        ms = jnp.where(jnp.isinf(m), 0, m)
        tot = jnp.exp(a - ms) + jnp.exp(a1 - ms) + jnp.exp(a2 - ms)
        # -inf where no path reaches s; guarded so jax.vjp of this (the derived
        # _ctc_loss_backward) gets no 0 * inf = nan from unreachable states
        lse = jnp.where(tot > 0, ms + jnp.log(jnp.where(tot > 0, tot, 1)), neg)
        new = jnp.where(valid_s, lse + emit(t), neg)
        new = jnp.where(jnp.asarray(t < il)[:, None], new, a)  # freeze past the input length
        return new, new

    if T > 1:
        _, rest = lax.scan(step, a0, jnp.arange(1, T))
        alphas = jnp.concatenate([a0[None], rest], 0)  # T, N, L
    else:
        alphas = a0[None]
    last = alphas[jnp.asarray(np.maximum(il - 1, 0)), jnp.arange(N)]  # N, L
    e1 = jnp.take_along_axis(last, jnp.asarray(2 * tl)[:, None], 1)[:, 0]
    e2 = jnp.where(jnp.asarray(tl > 0),
                   jnp.take_along_axis(last, jnp.asarray(np.maximum(2 * tl - 1, 0))[:, None], 1)[:, 0],
                   neg)
    nll = -jnp.logaddexp(e1, e2)
    nll = jnp.where(jnp.asarray(il == 0), jnp.where(jnp.asarray(tl == 0), 0, jnp.inf), nll)
    if zero_infinity:
        nll = jnp.where(jnp.isinf(nll), 0, nll)
    log_alpha = jnp.transpose(alphas, (1, 0, 2))
    if unbatched:
        return nll[0], log_alpha[0]
    return nll, log_alpha


@lower(aten._ctc_loss.default)
def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    return _ctc(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity)


@lower(aten._ctc_loss.Tensor, data_dependent=True)
def _ctc_loss_tensor(log_probs, targets, input_lengths, target_lengths, blank=0,
                     zero_infinity=False):
    # log_alpha's shape depends on max(target_lengths): run on concrete lengths.
    import numpy as np

    il = np.asarray(input_lengths).reshape(-1).tolist()
    tl = np.asarray(target_lengths).reshape(-1).tolist()
    return _ctc(log_probs, targets, il, tl, blank, zero_infinity)


@lower(aten.multilabel_margin_loss_forward.default)
def multilabel_margin_loss_forward(self, target, reduction):
    """Targets of a row are its labels before the first -1 (PyTorch's decomposition
    counts the masked-out ones too: wrong when a -1 ends a row early)."""
    x = self if self.ndim == 2 else self.reshape(1, -1)
    t = target.reshape(x.shape).astype(jnp.int64)
    dim = x.shape[1]
    idx = jnp.arange(dim)
    end = jnp.min(jnp.where(t == -1, idx, dim), axis=1, keepdims=True)
    valid = idx[None] < end  # N, dim: target slot j holds a label
    tj = jnp.where(valid, t, 0)
    is_target = jnp.any((idx[None, None, :] == tj[:, :, None]) & valid[:, :, None], axis=1)
    u = jnp.take_along_axis(x, tj, axis=1)  # N, dim: input at each target label
    z = jnp.maximum(1 - u[:, :, None] + x[:, None, :], 0) / dim  # N, j, i
    z = jnp.where(valid[:, :, None] & ~is_target[:, None, :], z, 0)
    per = jnp.sum(z, axis=(1, 2))
    if reduction == 1:
        out = jnp.mean(per)
    elif reduction == 2:
        out = jnp.sum(per)
    else:
        out = per if self.ndim == 2 else per.reshape(())
    return out, is_target.astype(self.dtype).reshape(target.shape)


# ---- F.linear_cross_entropy's chunked custom ops (torch.nn.modules.linear_cross_entropy) -----

# (the feature's probe imports the module, which registers torch_nn::*; a torch without it
# has none of the ops, and ``@lower`` skips their registration)
compat.has("linear_cross_entropy")
_torch_nn = compat.ops("torch_nn")


def _linear_ce(input, linear_weight, target, linear_bias, weight, reduction, ignore_index):
    """Cross entropy of ``input @ linear_weight.T + linear_bias`` (float32 accumulation for
    half inputs); ``reduction`` is "mean", "sum" or "none" as in the chunked ops."""
    from ._util import matmul_precision

    dt = input.dtype
    x = input.astype(jnp.float32) if dt in (jnp.bfloat16, jnp.float16) else input
    w = linear_weight.astype(x.dtype)
    logits = jnp.matmul(x, w.T, precision=matmul_precision())
    if linear_bias is not None:
        logits = logits + linear_bias.astype(x.dtype)
    m = jnp.max(logits, axis=1, keepdims=True)
    lse = (m + jnp.log(jnp.sum(jnp.exp(logits - m), axis=1, keepdims=True)))[:, 0]
    valid = target != ignore_index
    t = jnp.where(valid, target, 0).astype(jnp.int64)
    lt = jnp.take_along_axis(logits, t[:, None], axis=1)[:, 0]
    cw = jnp.ones_like(lse) if weight is None else weight.astype(x.dtype)[t]
    cw = jnp.where(valid, cw, 0)
    per = cw * (lse - lt)
    if reduction == "mean":
        return jnp.sum(per) / jnp.sum(cw)  # 0/0 = nan without any counted target, as PyTorch
    if reduction == "sum":
        return jnp.sum(per)
    return per


@lower(_torch_nn._linear_cross_entropy_batch_chunked.default)
def linear_cross_entropy_batch_chunked(input, linear_weight, target, linear_bias, weight, reduction,
                                       ignore_index, label_smoothing, batch_chunk_size, acc_policy,
                                       acc_dtype, allow_retain_graph, compute_input_grad,
                                       compute_linear_weight_grad, compute_linear_bias_grad):
    """(loss, grad_input, grad_linear_weight, grad_linear_bias): the op precomputes the
    gradients of the scalar loss in its forward; those not asked for are empty."""
    import jax

    diff = {"input": input, "linear_weight": linear_weight}
    if linear_bias is not None:
        diff["linear_bias"] = linear_bias

    def loss_of(d):
        return _linear_ce(d["input"], d["linear_weight"], target, d.get("linear_bias"), weight,
                          reduction, ignore_index)

    loss, g = jax.value_and_grad(loss_of)(diff)
    gi = g["input"] if compute_input_grad else jnp.zeros((0, 0), input.dtype)
    gw = g["linear_weight"] if compute_linear_weight_grad else jnp.zeros((0, 0), input.dtype)
    gb = g["linear_bias"] if compute_linear_bias_grad and linear_bias is not None \
        else jnp.zeros((0,), input.dtype)
    return loss, gi, gw, gb


@lower(_torch_nn._linear_cross_entropy_batch_chunked_no_reduction.default)
def linear_cross_entropy_batch_chunked_no_reduction(input, linear_weight, target, linear_bias,
                                                    weight, ignore_index, batch_chunk_size,
                                                    acc_policy, acc_dtype):
    return _linear_ce(input, linear_weight, target, linear_bias, weight, "none", ignore_index)

"""Ragged paged attention (``kernels_pallas.paged_attention``, interpret mode on CPU) against
its pure-JAX reference and against PyTorch CPU math, on ragged batches in transformers'
paged KV cache layout; and as ``torch.ops.lazyrt.paged_attention`` on tpu tensors."""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import kernels_pallas as kp
import lazyrt

pytestmark = pytest.mark.sweep(every=2)

TOL = {"float32": 1e-5, "bfloat16": 2e-2}


def _batch(q_lens, kv_lens, *, page=4, hq=4, hkv=2, d=8, pad=2, dtype=np.float32, seed=0):
    """A ragged batch: packed queries (+ ``pad`` padding tokens), pages of every sequence
    scattered over the cache in random order, a block table padded with page 0."""
    rng = np.random.default_rng(seed)
    need = [-(-n // page) for n in kv_lens]
    n_pages = sum(need) + 3
    perm = rng.permutation(np.arange(1, n_pages))
    bt = np.zeros((len(q_lens), max(need) + 1), np.int32)
    at = 0
    for b, n in enumerate(need):
        bt[b, :n] = perm[at:at + n]
        at += n
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = rng.standard_normal((int(cu[-1]) + pad, hq, d)).astype(np.float32)
    k = rng.standard_normal((n_pages, page, hkv, d)).astype(np.float32)
    v = rng.standard_normal((n_pages, page, hkv, d)).astype(np.float32)
    return [q.astype(dtype), k.astype(dtype), v.astype(dtype), bt, cu,
            np.asarray(kv_lens, np.int32)]


def _torch_math(q, k, v, bt, cu, kv_lens, scale=None):
    """PyTorch CPU: per sequence, its context gathered from the pages, causal
    (bottom-right aligned) SDPA of its queries; padding tokens 0."""
    q, k, v = (torch.from_numpy(np.asarray(x, np.float32)) for x in (q, k, v))
    out = torch.zeros_like(q)
    groups = q.shape[1] // k.shape[2]
    for b in range(len(kv_lens)):
        n, s, e = int(kv_lens[b]), int(cu[b]), int(cu[b + 1])
        keys = torch.cat([k[p] for p in bt[b]])[:n].repeat_interleave(groups, 1)
        vals = torch.cat([v[p] for p in bt[b]])[:n].repeat_interleave(groups, 1)
        ql = e - s
        mask = torch.arange(n)[None, :] <= (n - ql + torch.arange(ql))[:, None]
        o = torch.nn.functional.scaled_dot_product_attention(
            q[s:e].transpose(0, 1), keys.transpose(0, 1), vals.transpose(0, 1),
            attn_mask=mask, scale=scale)
        out[s:e] = o.transpose(0, 1)
    return out


def _close(a, e, tol):
    a, e = np.asarray(jnp.asarray(a, jnp.float32)), np.asarray(e, np.float32)
    assert a.shape == e.shape
    np.testing.assert_allclose(a, e, rtol=tol, atol=tol * max(1.0, float(np.abs(e).max())))


CASES = {
    # mixed: a prefill, decodes, a chunked prefill continuing a context
    "mixed": {"q_lens": [5, 1, 1, 3], "kv_lens": [5, 9, 14, 7]},
    "decode_only": {"q_lens": [1, 1, 1], "kv_lens": [1, 8, 13], "hq": 8, "hkv": 1},
    "prefill_only": {"q_lens": [6, 2], "kv_lens": [6, 2], "hq": 2, "hkv": 2, "pad": 0},
    "page_edges": {"q_lens": [4, 4], "kv_lens": [8, 4], "page": 4},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_matches_reference_and_torch(case):
    args = _batch(**CASES[case])
    want = _torch_math(*args)
    ref = kp.paged_attention_reference(*[jnp.asarray(a) for a in args])
    got = kp.paged_attention(*[jnp.asarray(a) for a in args])
    _close(ref, want.numpy(), TOL["float32"])
    _close(got, ref, TOL["float32"])


def test_kernel_bf16_and_scale():
    args = _batch([3, 1], [3, 10], hq=4, hkv=2, d=16, dtype=jnp.bfloat16)
    ja = [jnp.asarray(a) for a in args]
    got = kp.paged_attention(*ja, scale=0.3)
    assert got.dtype == jnp.bfloat16
    _close(got, kp.paged_attention_reference(*ja, scale=0.3), TOL["bfloat16"])
    _close(got, _torch_math(*args, scale=0.3).numpy(), TOL["bfloat16"])


def test_bad_layout_is_a_value_error():
    args = [jnp.asarray(a) for a in _batch([2], [2])]
    with pytest.raises(ValueError, match="kv_lens"):
        kp.paged_attention(*args[:5], args[5][None])


@pytest.mark.parametrize("pallas", ["off", "on"])
def test_as_a_torch_op_on_tpu(mode, pallas):
    args = _batch(**CASES["mixed"])
    want = _torch_math(*args)
    prev = lazyrt.config.pallas
    lazyrt.set_pallas(pallas)
    try:
        got = torch.ops.lazyrt.paged_attention(
            *[torch.from_numpy(np.asarray(a)).to("tpu") for a in args],
            scale=1 / math.sqrt(8))
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    finally:
        lazyrt.set_pallas(prev)

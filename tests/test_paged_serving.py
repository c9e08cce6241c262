"""transformers' continuous batching (``generate_batch``) on tpu with lazyrt's paged
attention in the decode steps (``cb_paged_attention`` in ``lazyrt/_torch/clients.py``):
greedy tokens equal CPU's over a stream of requests of mixed lengths, and the programs
compiled stop growing once each padded size has been seen.
"""
from __future__ import annotations

import os

import pytest

import lazyrt

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")
from test_clients import PROMPTS, _generate_batch, _slow, _tiny_llama

C = lazyrt.metrics.COUNTERS


from test_model_families import _one_cpu_thread  # noqa: E402,F401  (CPU refs on one thread)


def _stream(i):
    """A request stream: the prompts of PROMPTS shifted, of mixed lengths (2 to 9 tokens)."""
    return [[1] + [(t + 7 * i) % 60 + 2 for t in p[1:]] + [3] * (i % 3) for p in PROMPTS]


@pytest.mark.parametrize("mode", ["defer", *_slow("strict")])
@pytest.mark.parametrize("attn", ["sdpa", *_slow("paged|eager")])
def test_generate_batch_decodes_with_paged_attention(mode, attn):
    """CPU's tokens; the decode steps ran ``torch.ops.lazyrt.paged_attention`` (before the
    patch the block-table path was flash-on-cuda only: none did); after a warm-up stream,
    another stream (other prompts, same padded sizes) compiles nothing."""
    model = _tiny_llama()
    model.set_attn_implementation(attn)
    streams = [_stream(i) for i in range(2)]
    refs = [_generate_batch(model, s, 10) for s in streams]
    model.to("tpu")
    lazyrt.set_mode(mode)
    calls = C["paged_attention_calls"]
    assert _generate_batch(model, streams[0], 10) == refs[0]
    assert C["paged_attention_calls"] > calls
    warm = C["cache_misses"]
    for s, ref in zip(streams[1:], refs[1:]):
        assert _generate_batch(model, s, 10) == ref
    assert C["cache_misses"] == warm


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_generate_batch_without_the_decode_fast_path(mode):
    """``max_blocks_per_request=0`` turns the path off: CPU's tokens, no paged calls."""
    model = _tiny_llama()
    ref = _generate_batch(model, PROMPTS, 8, max_blocks_per_request=0)
    model.to("tpu")
    lazyrt.set_mode(mode)
    calls = C["paged_attention_calls"]
    assert _generate_batch(model, PROMPTS, 8, max_blocks_per_request=0) == ref
    assert C["paged_attention_calls"] == calls

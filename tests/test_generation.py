"""Hugging Face ``generate()`` on tpu against PyTorch CPU: the tokens are equal and the
scores close, in strict and in defer mode.

Tiny models from ``hf_zoo`` (random init, no hub): decoder LMs (Llama: rotary and GQA;
GPT-2: learned positions; Mistral: a sliding window shorter than the output) and
encoder-decoders (T5, BART), with the default dynamic KV cache. Strategies: greedy on a
left-padded batch, beam search returning several sequences with their scores, and
logits processors (repetition penalty, no-repeat n-grams, a forced minimum length).
Sampling is not compared: random values on tpu come from lazyrt's generator.
The static cache (compiled by transformers for tpu): Gemma 3, whose sliding-window
layers roll their cache (also ``test_compile.py``).
The default run takes about half of the cases, each in one mode (``sweep``; at least one
case of each test); ``-m slow`` runs the rest.
"""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.sweep(every=4)
transformers = pytest.importorskip("transformers")

from hf_zoo import ARCHS, VOCAB  # noqa: E402
from test_model_families import _one_cpu_thread  # noqa: E402,F401

PAD = 0


def _build(name):
    model = ARCHS[name].build().eval()
    model.config.use_cache = True
    gc = model.generation_config
    gc.use_cache = True
    gc.pad_token_id = PAD
    if gc.decoder_start_token_id is None and model.config.is_encoder_decoder:
        gc.decoder_start_token_id = 1
    return model


def _prompt(t=6, left_pad=2):
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, VOCAB, (2, t), generator=g)
    mask = torch.ones(2, t, dtype=torch.long)
    if left_pad:
        ids[1, :left_pad] = PAD
        mask[1, :left_pad] = 0
    return ids, mask


def _generate(model, ids, mask, device, **kw):
    with torch.no_grad():
        out = model.to(device).generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                        return_dict_in_generate=True, output_scores=True, **kw)
    seqs = out.sequences.cpu()
    scores = [s.cpu() for s in out.scores]
    extra = out.sequences_scores.cpu() if getattr(out, "sequences_scores", None) is not None \
        else None
    model.to("cpu")
    return seqs, scores, extra


def _check(name, mode, left_pad, **kw):
    model = _build(name)
    ids, mask = _prompt(left_pad=left_pad)
    ref = _generate(model, ids, mask, "cpu", **kw)
    got = _generate(model, ids, mask, "tpu", **kw)
    assert got[0].dtype == ref[0].dtype and got[0].shape == ref[0].shape
    assert got[0].tolist() == ref[0].tolist()
    assert len(got[1]) == len(ref[1])
    for a, b in zip(got[1], ref[1]):
        # -inf where a processor banned a token: the same tokens must be banned
        assert torch.equal(torch.isinf(a), torch.isinf(b))
        fin = torch.isfinite(b)
        torch.testing.assert_close(a[fin], b[fin], rtol=1e-4, atol=1e-4)
    if ref[2] is not None:
        torch.testing.assert_close(got[2], ref[2], rtol=1e-4, atol=1e-4)


NEW = 5


def _models(ci, slow):
    """The models a test runs: ``ci`` in the default run, ``slow`` with ``-m slow`` too."""
    return [*ci, *(pytest.param(n, marks=pytest.mark.slow) for n in slow)]


@pytest.mark.parametrize("name", _models(["llama", "mistral"], ["gpt2"]))
def test_greedy_left_padded_batch(name, mode):
    _check(name, mode, left_pad=2, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)


@pytest.mark.parametrize("name", _models(["llama"], ["t5"]))
def test_beam_search_sequences_and_scores(name, mode):
    _check(name, mode, left_pad=0 if name == "t5" else 2, max_new_tokens=4, num_beams=3,
           num_return_sequences=2, do_sample=False)


@pytest.mark.parametrize("name", _models(["gpt2"], ["bart"]))
def test_logits_processors(name, mode):
    _check(name, mode, left_pad=0, max_new_tokens=NEW, min_new_tokens=NEW - 1, do_sample=False,
           repetition_penalty=1.3, no_repeat_ngram_size=2)


def test_static_cache_with_a_sliding_window(mode):
    # transformers compiles a static-cache decode step for tpu; Gemma 3's sliding layers
    # roll their cache with a tensor made on the device inside the graph
    _check("gemma3_text", mode, left_pad=2, max_new_tokens=4, min_new_tokens=4,
           do_sample=False, cache_implementation="static")


def test_sampling_is_seeded_and_the_same_in_both_modes():
    # Sampled tokens come from lazyrt's generator (not CPU's): torch.manual_seed makes
    # them reproducible, and strict and defer draw the same ones.
    import lazyrt

    ids, mask = _prompt()
    model = _build("llama").to("tpu")
    kw = {"do_sample": True, "top_k": 10, "top_p": 0.9, "temperature": 0.8,
          "max_new_tokens": 4, "min_new_tokens": 4}
    got = {}
    for m in ("strict", "defer"):
        with lazyrt.set_mode(m):
            runs = []
            for _ in range(2):
                torch.manual_seed(3)
                runs.append(model.generate(input_ids=ids.to("tpu"),
                                           attention_mask=mask.to("tpu"), **kw).cpu())
        assert torch.equal(runs[0], runs[1])
        got[m] = runs[0]
    assert torch.equal(got["strict"], got["defer"])
    assert got["strict"].shape == (2, ids.shape[1] + 4)
    assert torch.equal(got["strict"][:, :ids.shape[1]], ids)
    assert int(got["strict"].min()) >= 0 and int(got["strict"].max()) < VOCAB


class _CompilesPerToken:
    """A streamer: the programs compiled since the previous token, at each token."""

    def __init__(self):
        from lazyrt import metrics

        self.metrics = metrics
        self.per_token = []
        self.metrics.reset()

    def put(self, value):
        self.per_token.append(self.metrics.counters()["cache_misses"])
        self.metrics.reset()

    def end(self):
        pass


@pytest.mark.parametrize("cache,batch,left_pad", [
    ("static", 2, 2), ("dynamic", 1, 0),
    pytest.param("static", 1, 0, marks=pytest.mark.slow),
    pytest.param("dynamic", 2, 0, marks=pytest.mark.slow)])
@pytest.mark.usefixtures("compile_at_first_run")
def test_generate_compiles_nothing_per_token(mode, cache, batch, left_pad):
    """The token ids, positions and attention mask that grow by one a step, and the
    default dynamic cache's keys and values, live in append buffers
    (``lazyrt/_ops/append.py``: the static cache's padded mask is padded to the cache's length,
    and SDPA attends over the grown keys, with the length as a runtime scalar): after the
    first tokens a token compiles no program, and the tokens are CPU's. (The last token
    may compile one: the stopping criterion's constant flips to True. A left-padded batch
    with the dynamic cache still compiles at every token: its mask is built at the
    cache's length; docs/generation.md.)"""
    model = _build("llama")
    ids, mask = _prompt(t=5, left_pad=left_pad)
    ids, mask = ids[:batch], mask[:batch]
    kw = {"max_new_tokens": 14, "min_new_tokens": 14, "do_sample": False}
    if cache == "static":
        kw["cache_implementation"] = "static"
    with torch.no_grad():
        ref = model.generate(input_ids=ids, attention_mask=mask, **kw)
        model.to("tpu")
        counter = _CompilesPerToken()
        got = model.generate(input_ids=ids.to("tpu"), attention_mask=mask.to("tpu"),
                             streamer=counter, **kw).cpu()
    assert got.tolist() == ref.tolist()
    # the prompt, then one token per step
    assert len(counter.per_token) == 1 + 14
    assert sum(counter.per_token[6:-1]) == 0, str(counter.per_token)

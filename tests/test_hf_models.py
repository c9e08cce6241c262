"""Optional: tiny Hugging Face ``transformers`` models, built from their config classes
(random init, no hub access), run on tpu exactly as on CPU eager in strict and defer
mode: logits and every parameter gradient, then 3 AdamW steps (losses, parameters).

Skips cleanly when ``transformers`` is not installed; it is not a dependency of lazyrt.
Harness and tolerances: see ``test_model_families.py``.
"""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_model_families import check_family  # noqa: E402

VOCAB, B, T = 64, 2, 8


def _common(**kw):
    return dict(vocab_size=VOCAB, **kw)


def _gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        **_common(n_embd=32, n_layer=2, n_head=4, n_positions=T, resid_pdrop=0.0, embd_pdrop=0.0,
                  attn_pdrop=0.0)))


def _llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **_common(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=T)))


def _bert():
    return transformers.BertForMaskedLM(transformers.BertConfig(
        **_common(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  max_position_embeddings=T, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0)))


def _t5():
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        **_common(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                  relative_attention_num_buckets=8, dropout_rate=0.0, decoder_start_token_id=0)))


class _Wrap(torch.nn.Module):
    """Calls the HF model with keyword inputs and returns its logits."""

    def __init__(self, model, keys):
        super().__init__()
        self.model, self.keys = model, keys
        model.config.use_cache = False
        if hasattr(model.config, "_attn_implementation"):
            model.config._attn_implementation = "eager"

    def tie_weights(self):
        self.model.tie_weights()

    def forward(self, *inputs):
        return self.model(**dict(zip(self.keys, inputs))).logits


def _ids(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (B, T), generator=g)


def _lm_loss(out, labels):
    return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), labels.reshape(-1))


def _mask():
    m = torch.ones(B, T, dtype=torch.long)
    m[1, 5:] = 0
    return m


MODELS = {
    "gpt2": (lambda: _Wrap(_gpt2(), ["input_ids"]), lambda: (_ids(1), _ids(2)), 1),
    "llama": (lambda: _Wrap(_llama(), ["input_ids", "attention_mask"]),
              lambda: (_ids(3), _mask(), _ids(4)), 2),
    "bert": (lambda: _Wrap(_bert(), ["input_ids", "attention_mask"]),
             lambda: (_ids(5), _mask(), _ids(6)), 2),
    "t5": (lambda: _Wrap(_t5(), ["input_ids", "decoder_input_ids"]),
           lambda: (_ids(7), _ids(8), _ids(9)), 2),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_hf_model_matches_cpu(name, mode):
    model_fn, batch_fn, n_inputs = MODELS[name]
    check_family(model_fn, batch_fn, n_inputs, _lm_loss, mode)

"""Tiny Hugging Face ``transformers`` architectures for the model suite
(``test_hf_models.py``): each entry builds a model from its config class (random init,
no hub access) plus a batch and a loss.

An entry is ``Arch(build, batch, loss, pick, tol)``:
  * ``build()`` -> the HF model (dropout probabilities forced to 0, see ``_no_dropout``),
  * ``batch()`` -> ``(inputs, targets)``: a dict of keyword inputs and a tuple of targets,
  * ``loss(out, *targets)`` on what ``pick(model_output)`` returns (default: ``.logits``),
  * ``tol``: tolerance overrides for ``check_family`` (empty: its defaults),
  * ``train``: False runs the model in eval mode (BatchNorm on running statistics). Only
    for MobileNetV2 and LeViT, whose deep stacks of train-mode BatchNorms over 2 images are
    ill-conditioned in float32: CPU float32 itself is off float64 by 4.5e-3 on a gradient of
    ~150 (MobileNetV2) and by 0.9 on one of ~700 (LeViT; 2e-3 relative), measured, and
    MobileNetV2 has biases whose true gradient is exactly 0 (a BatchNorm's bias feeding a
    1x1 conv and another BatchNorm), so their AdamW step is rounding noise blown up to
    +-lr, different on every backend. Train-mode BatchNorm is covered by ResNet, RegNet and
    EfficientNet.

Sizes: hidden 32, 2 layers, 4 heads (2 key/value heads where the model has GQA), batch 2,
sequence 8 over a 64-token vocabulary, 32x32 images, ~0.1 s of 16 kHz audio.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F
import transformers as tf
from _util import gen

VOCAB, B, T = 64, 2, 8
D, L, H, KV, FF = 32, 2, 4, 2, 64


@dataclasses.dataclass
class Arch:
    build: Callable
    batch: Callable
    loss: Callable
    pick: Callable = lambda o: o.logits
    tol: dict = dataclasses.field(default_factory=dict)
    # False: run in eval mode (BatchNorm on running statistics)
    train: bool = True


# ----------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------


def _no_dropout(cfg):
    """Every random-in-training probability of a config (and its sub-configs) set to 0:
    dropout, drop-path, layer drop, router jitter. (Random values on tpu come from lazyrt's
    generator, not PyTorch CPU's, so a random op cannot match CPU eager element-wise.)"""
    for key, val in list(vars(cfg).items()):
        low = key.lower()
        if isinstance(val, tf.PretrainedConfig):
            _no_dropout(val)
        elif isinstance(val, float) and ("drop" in low or "jitter" in low):
            setattr(cfg, key, 0.0)
    return cfg


def _model(model_cls, cfg_cls, attn=None, **kw):
    cfg = _no_dropout(cfg_cls(**kw))
    cfg.use_cache = False
    if attn is not None:
        cfg._attn_implementation = attn
    torch.manual_seed(0)
    return model_cls(cfg)


def _ids(seed, t=T, lo=3):
    return torch.randint(lo, VOCAB, (B, t), generator=gen(seed))


def _mask(t=T):
    m = torch.ones(B, t, dtype=torch.long)
    m[1, t - 3:] = 0  # right padding on the second row
    return m


def _lm_loss(out, labels):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), labels.reshape(-1))


def _cls_loss(out, labels):
    return F.cross_entropy(out.float(), labels)


def _sq_loss(out, *_):
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return sum(o.float().pow(2).mean() for o in outs)


def _clip_loss(out):
    lpi, lpt = out
    tgt = torch.arange(lpi.shape[0], device=lpi.device)
    return F.cross_entropy(lpi, tgt) + F.cross_entropy(lpt, tgt)


def _text_lm(seed, mask=True):
    inputs = {"input_ids": _ids(seed)}
    if mask:
        inputs["attention_mask"] = _mask()
    return inputs, (_ids(seed + 1),)


def _text_cls(seed, classes=3):
    inputs = {"input_ids": _ids(seed), "attention_mask": _mask()}
    return inputs, (torch.randint(0, classes, (B,), generator=gen(seed + 1)),)


def _seq2seq(seed):
    inputs = {"input_ids": _ids(seed), "attention_mask": _mask(), "decoder_input_ids": _ids(seed + 1)}
    return inputs, (_ids(seed + 2),)


def _pixels(seed, hw=32, classes=5, c=3):
    g = gen(seed)
    return {"pixel_values": torch.randn(B, c, hw, hw, generator=g)}, \
        (torch.randint(0, classes, (B,), generator=g),)


def _audio(seed, n=1600):
    return {"input_values": torch.randn(B, n, generator=gen(seed))}, ()


def _longformer_batch():
    inputs, targets = _text_lm(202)
    glob = torch.zeros(B, T, dtype=torch.long)
    glob[:, 0] = 1  # the first token attends globally (local window elsewhere)
    return {**inputs, "global_attention_mask": glob}, targets


def _towers(text_positions, **text_extra):
    """Text and vision tower configs of a CLIP-like model."""
    text = {"vocab_size": VOCAB, "hidden_size": D, "intermediate_size": FF,
            "num_hidden_layers": L, "num_attention_heads": H,
            "max_position_embeddings": text_positions, **text_extra}
    vision = {"hidden_size": D, "intermediate_size": FF, "num_hidden_layers": L,
              "num_attention_heads": H, "image_size": 32, "patch_size": 8}
    return {"text_config": text, "vision_config": vision}


def _image_text(seed, mask):
    inputs = {"input_ids": _ids(seed)}
    if mask:
        inputs["attention_mask"] = _mask()
    inputs["pixel_values"] = torch.randn(B, 3, 32, 32, generator=gen(seed + 1))
    return inputs, ()


def _logits_pair(o):
    return o.logits_per_image, o.logits_per_text


def _decoder(cls, cfg, **kw):
    kw = {"bos_token_id": 1, "eos_token_id": 2, **kw}
    return lambda: _model(cls, cfg, vocab_size=VOCAB, **kw)


_LLAMA_LIKE = {"hidden_size": D, "intermediate_size": FF, "num_hidden_layers": L,
               "num_attention_heads": H, "num_key_value_heads": KV,
               "max_position_embeddings": 32}
_BERT_LIKE = {"vocab_size": VOCAB, "hidden_size": D, "num_hidden_layers": L,
              "num_attention_heads": H, "intermediate_size": FF, "max_position_embeddings": 32}
_MOE = dict(_LLAMA_LIKE, num_experts=4, num_experts_per_tok=2)
_SMALL_CONV_AUDIO = {"conv_dim": (16, 16, 16), "conv_stride": (5, 2, 2),
                     "conv_kernel": (10, 3, 3), "num_conv_pos_embeddings": 8,
                     "num_conv_pos_embedding_groups": 2, "apply_spec_augment": False}


def _lm(build, seed, mask=True, **tol):
    return Arch(build, lambda: _text_lm(seed, mask), _lm_loss, tol=tol)


# ----------------------------------------------------------------------------------
# the architectures
# ----------------------------------------------------------------------------------

ARCHS: dict[str, Arch] = {
    # ---- decoder LMs: learned / rotary / ALiBi positions, MHA / GQA / MQA, sliding windows
    "gpt2": _lm(_decoder(tf.GPT2LMHeadModel, tf.GPT2Config, n_embd=D, n_layer=L, n_head=H,
                         n_positions=32), 1),
    "gpt_neo": _lm(_decoder(tf.GPTNeoForCausalLM, tf.GPTNeoConfig, hidden_size=D, num_layers=L,
                            num_heads=H, attention_types=[[["global", "local"], 1]], window_size=4,
                            max_position_embeddings=32), 2),
    "gptj": _lm(_decoder(tf.GPTJForCausalLM, tf.GPTJConfig, n_embd=D, n_layer=L, n_head=H,
                         rotary_dim=4, n_positions=32), 3),
    "codegen": _lm(_decoder(tf.CodeGenForCausalLM, tf.CodeGenConfig, n_embd=D, n_layer=L,
                            n_head=H, rotary_dim=4, n_positions=32, n_ctx=32), 4),
    "gpt_bigcode": _lm(_decoder(tf.GPTBigCodeForCausalLM, tf.GPTBigCodeConfig, n_embd=D,
                                n_layer=L, n_head=H, n_positions=32, multi_query=True), 5),
    "gpt_neox": _lm(_decoder(tf.GPTNeoXForCausalLM, tf.GPTNeoXConfig, hidden_size=D,
                             num_hidden_layers=L, num_attention_heads=H, intermediate_size=FF,
                             max_position_embeddings=32), 6),
    "opt": _lm(_decoder(tf.OPTForCausalLM, tf.OPTConfig, hidden_size=D, num_hidden_layers=L,
                        num_attention_heads=H, ffn_dim=FF, max_position_embeddings=32,
                        word_embed_proj_dim=D), 7),
    "bloom": _lm(_decoder(tf.BloomForCausalLM, tf.BloomConfig, hidden_size=D, n_layer=L,
                          n_head=H), 8),
    "falcon": _lm(_decoder(tf.FalconForCausalLM, tf.FalconConfig, hidden_size=D,
                           num_hidden_layers=L, num_attention_heads=H, max_position_embeddings=32),
                  9),
    "llama": _lm(_decoder(tf.LlamaForCausalLM, tf.LlamaConfig, **_LLAMA_LIKE), 10),
    "mistral": _lm(_decoder(tf.MistralForCausalLM, tf.MistralConfig, sliding_window=4,
                            **_LLAMA_LIKE), 11),
    "qwen2": _lm(_decoder(tf.Qwen2ForCausalLM, tf.Qwen2Config, **_LLAMA_LIKE), 12),
    "qwen3": _lm(_decoder(tf.Qwen3ForCausalLM, tf.Qwen3Config, head_dim=D // H, **_LLAMA_LIKE),
                 13),
    "gemma": _lm(_decoder(tf.GemmaForCausalLM, tf.GemmaConfig, head_dim=D // H, **_LLAMA_LIKE),
                 14),
    "gemma2": _lm(_decoder(tf.Gemma2ForCausalLM, tf.Gemma2Config, head_dim=D // H,
                           sliding_window=4, attn="eager", **_LLAMA_LIKE), 15),
    "gemma3_text": _lm(_decoder(tf.Gemma3ForCausalLM, tf.Gemma3TextConfig, head_dim=D // H,
                                sliding_window=4, **_LLAMA_LIKE), 16),
    "phi": _lm(_decoder(tf.PhiForCausalLM, tf.PhiConfig, **_LLAMA_LIKE), 17),
    "phi3": _lm(_decoder(tf.Phi3ForCausalLM, tf.Phi3Config, pad_token_id=0, **_LLAMA_LIKE), 18),
    "starcoder2": _lm(_decoder(tf.Starcoder2ForCausalLM, tf.Starcoder2Config, sliding_window=4,
                               **_LLAMA_LIKE), 19),
    "olmo2": _lm(_decoder(tf.Olmo2ForCausalLM, tf.Olmo2Config, **_LLAMA_LIKE), 20),
    "stablelm": _lm(_decoder(tf.StableLmForCausalLM, tf.StableLmConfig, **_LLAMA_LIKE), 21),
    "cohere": _lm(_decoder(tf.CohereForCausalLM, tf.CohereConfig, **_LLAMA_LIKE), 22),
    # ---- mixture of experts
    "mixtral": _lm(_decoder(tf.MixtralForCausalLM, tf.MixtralConfig, num_local_experts=4,
                            num_experts_per_tok=2, **_LLAMA_LIKE), 30),
    "qwen2_moe": _lm(_decoder(tf.Qwen2MoeForCausalLM, tf.Qwen2MoeConfig, moe_intermediate_size=32,
                              shared_expert_intermediate_size=32, **_MOE), 31),
    "qwen3_moe": _lm(_decoder(tf.Qwen3MoeForCausalLM, tf.Qwen3MoeConfig, moe_intermediate_size=32,
                              **_MOE), 32),
    "olmoe": _lm(_decoder(tf.OlmoeForCausalLM, tf.OlmoeConfig, **_MOE), 33),
    # the same experts through transformers' other experts implementations (the default on
    # tpu is grouped_mm): a Python loop over experts (index / index_add), and one bmm over
    # the gathered expert weights
    "mixtral_eager_experts": _lm(_decoder(tf.MixtralForCausalLM, tf.MixtralConfig,
                                          num_local_experts=4, num_experts_per_tok=2,
                                          experts_implementation="eager", **_LLAMA_LIKE), 34),
    "qwen2_moe_batched_mm": _lm(_decoder(tf.Qwen2MoeForCausalLM, tf.Qwen2MoeConfig,
                                         moe_intermediate_size=32,
                                         shared_expert_intermediate_size=32,
                                         experts_implementation="batched_mm", **_MOE), 35),
    # ---- state-space / recurrent
    "mamba": _lm(_decoder(tf.MambaForCausalLM, tf.MambaConfig, hidden_size=D, state_size=8,
                          num_hidden_layers=L, conv_kernel=4, expand=2), 40, mask=False),
    "mamba2": _lm(_decoder(tf.Mamba2ForCausalLM, tf.Mamba2Config, hidden_size=D, state_size=8,
                           num_hidden_layers=L, num_heads=8, head_dim=8, n_groups=1,
                           conv_kernel=4, expand=2, chunk_size=4), 41, mask=False),
    "falcon_mamba": _lm(_decoder(tf.FalconMambaForCausalLM, tf.FalconMambaConfig, hidden_size=D,
                                 state_size=8, num_hidden_layers=L, conv_kernel=4, expand=2), 42,
                        mask=False),
    "rwkv": _lm(_decoder(tf.RwkvForCausalLM, tf.RwkvConfig, hidden_size=D, num_hidden_layers=L,
                         attention_hidden_size=D, intermediate_size=FF, context_length=32), 43,
                mask=False),
    # ---- encoders
    "bert": _lm(lambda: _model(tf.BertForMaskedLM, tf.BertConfig, **_BERT_LIKE), 50),
    "roberta": Arch(lambda: _model(tf.RobertaForSequenceClassification, tf.RobertaConfig,
                                   num_labels=3, **_BERT_LIKE), lambda: _text_cls(51), _cls_loss),
    "distilbert": _lm(lambda: _model(tf.DistilBertForMaskedLM, tf.DistilBertConfig,
                                     vocab_size=VOCAB, dim=D, n_layers=L, n_heads=H, hidden_dim=FF,
                                     max_position_embeddings=32), 52),
    "albert": _lm(lambda: _model(tf.AlbertForMaskedLM, tf.AlbertConfig, embedding_size=16,
                                 **_BERT_LIKE), 53),
    "electra": Arch(lambda: _model(tf.ElectraForSequenceClassification, tf.ElectraConfig,
                                   embedding_size=16, num_labels=3, **_BERT_LIKE),
                    lambda: _text_cls(54), _cls_loss),
    "deberta": _lm(lambda: _model(tf.DebertaForMaskedLM, tf.DebertaConfig, relative_attention=True,
                                  pos_att_type=["c2p", "p2c"], max_relative_positions=16,
                                  **_BERT_LIKE), 55),
    "deberta_v2": _lm(lambda: _model(tf.DebertaV2ForMaskedLM, tf.DebertaV2Config,
                                     relative_attention=True, pos_att_type=["c2p", "p2c"],
                                     position_buckets=8, **_BERT_LIKE), 56),
    "mpnet": _lm(lambda: _model(tf.MPNetForMaskedLM, tf.MPNetConfig, **_BERT_LIKE), 57),
    "convbert": _lm(lambda: _model(tf.ConvBertForMaskedLM, tf.ConvBertConfig, embedding_size=D,
                                   conv_kernel_size=3, **_BERT_LIKE), 58),
    "modernbert": _lm(lambda: _model(tf.ModernBertForMaskedLM, tf.ModernBertConfig,
                                     vocab_size=VOCAB, hidden_size=D, num_hidden_layers=L,
                                     num_attention_heads=H, intermediate_size=FF,
                                     max_position_embeddings=32, local_attention=4,
                                     pad_token_id=0, eos_token_id=1, bos_token_id=2,
                                     cls_token_id=1, sep_token_id=2), 59),
    "xlnet": _lm(lambda: _model(tf.XLNetLMHeadModel, tf.XLNetConfig, vocab_size=VOCAB, d_model=D,
                                n_layer=L, n_head=H, d_inner=FF, d_head=D // H), 200),
    "funnel": Arch(lambda: _model(tf.FunnelForSequenceClassification, tf.FunnelConfig,
                                  vocab_size=VOCAB, block_sizes=[1, 1], num_decoder_layers=1,
                                  d_model=D, n_head=H, d_head=D // H, d_inner=FF, num_labels=3),
                   lambda: _text_cls(201), _cls_loss),
    "longformer": Arch(lambda: _model(tf.LongformerForMaskedLM, tf.LongformerConfig,
                                      attention_window=4, **_BERT_LIKE), _longformer_batch,
                       _lm_loss),
    # ---- encoder-decoders
    "t5": Arch(lambda: _model(tf.T5ForConditionalGeneration, tf.T5Config, vocab_size=VOCAB,
                              d_model=D, d_kv=8, d_ff=FF, num_layers=L, num_decoder_layers=L,
                              num_heads=H, relative_attention_num_buckets=8,
                              decoder_start_token_id=0), lambda: _seq2seq(60), _lm_loss),
    "bart": Arch(lambda: _model(tf.BartForConditionalGeneration, tf.BartConfig, vocab_size=VOCAB,
                                d_model=D, encoder_layers=L, decoder_layers=L,
                                encoder_attention_heads=H, decoder_attention_heads=H,
                                encoder_ffn_dim=FF, decoder_ffn_dim=FF, max_position_embeddings=32),
                 lambda: _seq2seq(61), _lm_loss),
    "marian": Arch(lambda: _model(tf.MarianMTModel, tf.MarianConfig, vocab_size=VOCAB, d_model=D,
                                  encoder_layers=L, decoder_layers=L, encoder_attention_heads=H,
                                  decoder_attention_heads=H, encoder_ffn_dim=FF,
                                  decoder_ffn_dim=FF, max_position_embeddings=32,
                                  pad_token_id=0, decoder_start_token_id=0),
                   lambda: _seq2seq(62), _lm_loss),
    "pegasus": Arch(lambda: _model(tf.PegasusForConditionalGeneration, tf.PegasusConfig,
                                   vocab_size=VOCAB, d_model=D, encoder_layers=L, decoder_layers=L,
                                   encoder_attention_heads=H, decoder_attention_heads=H,
                                   encoder_ffn_dim=FF, decoder_ffn_dim=FF,
                                   max_position_embeddings=32),
                    lambda: _seq2seq(63), _lm_loss),
    "mbart": Arch(lambda: _model(tf.MBartForConditionalGeneration, tf.MBartConfig,
                                 vocab_size=VOCAB, d_model=D, encoder_layers=L, decoder_layers=L,
                                 encoder_attention_heads=H, decoder_attention_heads=H,
                                 encoder_ffn_dim=FF, decoder_ffn_dim=FF,
                                 max_position_embeddings=32),
                  lambda: _seq2seq(64), _lm_loss),
    "switch_transformers": Arch(
        lambda: _model(tf.SwitchTransformersForConditionalGeneration, tf.SwitchTransformersConfig,
                       vocab_size=VOCAB, d_model=D, d_kv=8, d_ff=FF, num_layers=L,
                       num_decoder_layers=L, num_heads=H, num_experts=4, expert_capacity=8,
                       num_sparse_encoder_layers=1, num_sparse_decoder_layers=1,
                       relative_attention_num_buckets=8, decoder_start_token_id=0),
        lambda: _seq2seq(65), _lm_loss),
    # ---- vision
    "vit": Arch(lambda: _model(tf.ViTForImageClassification, tf.ViTConfig, hidden_size=D,
                               num_hidden_layers=L, num_attention_heads=H, intermediate_size=FF,
                               image_size=32, patch_size=8, num_labels=5),
                lambda: _pixels(70), _cls_loss),
    "deit": Arch(lambda: _model(tf.DeiTForImageClassification, tf.DeiTConfig, hidden_size=D,
                                num_hidden_layers=L, num_attention_heads=H, intermediate_size=FF,
                                image_size=32, patch_size=8, num_labels=5),
                 lambda: _pixels(71), _cls_loss),
    "beit": Arch(lambda: _model(tf.BeitForImageClassification, tf.BeitConfig, hidden_size=D,
                                num_hidden_layers=L, num_attention_heads=H, intermediate_size=FF,
                                image_size=32, patch_size=8, num_labels=5,
                                use_relative_position_bias=True),
                 lambda: _pixels(72), _cls_loss),
    "dinov2": Arch(lambda: _model(tf.Dinov2ForImageClassification, tf.Dinov2Config,
                                  hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                  image_size=32, patch_size=8, num_labels=5),
                   lambda: _pixels(73), _cls_loss),
    "swin": Arch(lambda: _model(tf.SwinForImageClassification, tf.SwinConfig, image_size=32,
                                patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 4],
                                window_size=4, num_labels=5),
                 lambda: _pixels(74), _cls_loss),
    "convnext": Arch(lambda: _model(tf.ConvNextForImageClassification, tf.ConvNextConfig,
                                    hidden_sizes=[8, 16], depths=[1, 1], num_stages=2,
                                    num_labels=5),
                     lambda: _pixels(75), _cls_loss),
    "resnet": Arch(lambda: _model(tf.ResNetForImageClassification, tf.ResNetConfig,
                                  embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                  layer_type="basic", num_labels=5),
                   lambda: _pixels(76), _cls_loss),
    "regnet": Arch(lambda: _model(tf.RegNetForImageClassification, tf.RegNetConfig,
                                  embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                  groups_width=4, num_labels=5),
                   lambda: _pixels(77), _cls_loss),
    "mobilenet_v2": Arch(lambda: _model(tf.MobileNetV2ForImageClassification,
                                        tf.MobileNetV2Config, image_size=64, depth_multiplier=0.25,
                                        num_labels=5),
                         lambda: _pixels(78, hw=64), _cls_loss, train=False),
    "efficientnet": Arch(lambda: _model(tf.EfficientNetForImageClassification,
                                        tf.EfficientNetConfig, image_size=32,
                                        width_coefficient=0.25, depth_coefficient=0.25,
                                        hidden_dim=320, num_labels=5),
                         lambda: _pixels(203, hw=64), _cls_loss),
    "levit": Arch(lambda: _model(tf.LevitForImageClassification, tf.LevitConfig, image_size=32,
                                 hidden_sizes=[16, 32, 48], num_attention_heads=[1, 2, 3],
                                 depths=[1, 1, 1], key_dim=[8, 8, 8], num_labels=5),
                  lambda: _pixels(204), _cls_loss, train=False),
    "segformer": Arch(lambda: _model(tf.SegformerForSemanticSegmentation, tf.SegformerConfig,
                                     hidden_sizes=[8, 16], depths=[1, 1], num_encoder_blocks=2,
                                     sr_ratios=[2, 1], num_attention_heads=[1, 2],
                                     patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2],
                                     decoder_hidden_size=16, num_labels=5),
                      lambda: _pixels(205), _sq_loss),
    # ---- speech
    "wav2vec2": Arch(lambda: _model(tf.Wav2Vec2ForCTC, tf.Wav2Vec2Config, vocab_size=VOCAB,
                                    hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                    intermediate_size=FF, **_SMALL_CONV_AUDIO),
                     lambda: _audio(80), _sq_loss),
    "hubert": Arch(lambda: _model(tf.HubertForCTC, tf.HubertConfig, vocab_size=VOCAB,
                                  hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                  intermediate_size=FF, **_SMALL_CONV_AUDIO),
                   lambda: _audio(81), _sq_loss),
    "data2vec_audio": Arch(lambda: _model(tf.Data2VecAudioForCTC, tf.Data2VecAudioConfig,
                                          vocab_size=VOCAB, hidden_size=D, num_hidden_layers=L,
                                          num_attention_heads=H, intermediate_size=FF,
                                          **_SMALL_CONV_AUDIO),
                           lambda: _audio(85), _sq_loss),
    "speech_to_text": Arch(lambda: _model(tf.Speech2TextForConditionalGeneration,
                                          tf.Speech2TextConfig, vocab_size=VOCAB, d_model=D,
                                          encoder_layers=L, decoder_layers=L,
                                          encoder_attention_heads=H, decoder_attention_heads=H,
                                          encoder_ffn_dim=FF, decoder_ffn_dim=FF,
                                          max_source_positions=32, max_target_positions=32,
                                          conv_channels=16, input_feat_per_channel=16,
                                          pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                          decoder_start_token_id=1),
                           lambda: ({"input_features": torch.randn(B, 32, 16, generator=gen(206)),
                                     "decoder_input_ids": _ids(207)}, (_ids(208),)), _lm_loss),
    "whisper": Arch(lambda: _model(tf.WhisperForConditionalGeneration, tf.WhisperConfig,
                                   vocab_size=VOCAB, num_mel_bins=16, d_model=D, encoder_layers=L,
                                   decoder_layers=L, encoder_attention_heads=H,
                                   decoder_attention_heads=H, encoder_ffn_dim=FF,
                                   decoder_ffn_dim=FF, max_source_positions=16,
                                   max_target_positions=16, decoder_start_token_id=1,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                   suppress_tokens=None, begin_suppress_tokens=None),
                    lambda: ({"input_features": torch.randn(B, 16, 32, generator=gen(82)),
                              "decoder_input_ids": _ids(83)}, (_ids(84),)), _lm_loss),
    # ---- multimodal
    "clip": Arch(lambda: _model(tf.CLIPModel, tf.CLIPConfig, projection_dim=16,
                                **_towers(32, eos_token_id=2)),
                 lambda: _image_text(90, mask=True), _clip_loss, pick=_logits_pair),
    "siglip": Arch(lambda: _model(tf.SiglipModel, tf.SiglipConfig, **_towers(T)),
                   lambda: _image_text(92, mask=False), _clip_loss, pick=_logits_pair),
    "owlvit": Arch(lambda: _model(tf.OwlViTModel, tf.OwlViTConfig, projection_dim=16,
                                  **_towers(T, eos_token_id=2)),
                   lambda: _image_text(94, mask=True), _clip_loss, pick=_logits_pair),
}

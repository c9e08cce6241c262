"""Real model families, built in code with random weights (no downloads), run on tpu
exactly as on CPU eager, in strict and in defer mode.

For every family one training run checks, against the same run on CPU:
  * forward output (logits) of the first step,
  * the gradient of EVERY parameter after the first backward,
  * 3 AdamW steps: the loss of each step and every parameter AND buffer afterwards
    (BatchNorm running stats, ``num_batches_tracked``, ...).

Tolerances (fp32): rtol 1e-4 / atol 1e-5 unless a family says otherwise next to its
entry in ``FAMILIES``. XLA's CPU backend fuses and reassociates reductions (matmul,
softmax, norms), so per-element results differ from ATen by a few ulps; deep stacks
of norms / recurrences amplify that a little, which is the only reason for the few
looser entries.

AdamW (lr 1e-2) uses eps=1e-5 (not the default 1e-8): parameters whose true gradient
is 0 (the attention key bias: softmax is invariant to it) get pure rounding-noise
gradients (~1e-8), and Adam with a tiny eps turns such noise into a full +-lr step,
differently on every backend. With eps=1e-6 the key biases of GPT-2/ViT/BERT still
moved ~2e-4 apart in 3 steps; eps=1e-5 keeps noise steps proportional to the noise.
Parameters after the steps are compared with atol 1e-4 (1% of one lr step): Adam
normalises every element, so an element with a tiny gradient turns a few-ulp gradient
difference into a visible (but lr-bounded) parameter difference. Losses: rtol 1e-4.
"""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from _util import gen

import lazyrt

STEPS = 3
# The harness's optimizer (``_run``).
LR, EPS = 1e-2, 1e-5


@pytest.fixture(autouse=True, scope="module")
def _one_cpu_thread():
    # The CPU reference runs tiny ops; with >1 intra-op thread on a small or busy
    # machine (and -n 2 workers on 2 cores) OpenMP barriers make them up to 1000x slower.
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


# ----------------------------------------------------------------------------------
# shared transformer pieces
# ----------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Llama / T5 style: no mean subtraction, no bias."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


# ----------------------------------------------------------------------------------
# GPT-2: learned positions, causal SDPA, tied embeddings
# ----------------------------------------------------------------------------------


class GPT2Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(a.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, vocab=64, d=32, h=4, n=2, t=8):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(t, d)
        self.h = nn.ModuleList(GPT2Block(d, h) for _ in range(n))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.tie_weights()

    def tie_weights(self):
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)[None]
        for blk in self.h:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


def _lm_batch(vocab=64, b=2, t=8, seed=10):
    g = gen(seed)
    return torch.randint(0, vocab, (b, t), generator=g), torch.randint(0, vocab, (b, t), generator=g)


def _lm_loss(out, tgt):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), tgt.reshape(-1))


# ----------------------------------------------------------------------------------
# Llama: RMSNorm, rotary embeddings, SwiGLU, grouped-query attention
# ----------------------------------------------------------------------------------


def _rope(t, hd, base=10000.0, device=None):
    inv = 1.0 / (base ** (torch.arange(0, hd, 2, device=device).float() / hd))
    freqs = torch.outer(torch.arange(t, device=device).float(), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, d, h, kv, hidden, gqa_mode):
        super().__init__()
        self.h, self.kv, self.hd, self.gqa_mode = h, kv, d // h, gqa_mode
        self.input_layernorm = RMSNorm(d)
        self.q_proj = nn.Linear(d, h * self.hd, bias=False)
        self.k_proj = nn.Linear(d, kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, kv * self.hd, bias=False)
        self.o_proj = nn.Linear(h * self.hd, d, bias=False)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=1e-6)  # the built-in one too
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        hx = self.input_layernorm(x)
        q = self.q_proj(hx).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(hx).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(hx).view(b, t, self.kv, self.hd).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if self.gqa_mode == "enable_gqa":
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            rep = self.h // self.kv
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, -1))
        hx = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(hx)) * self.up_proj(hx))


class Llama(nn.Module):
    def __init__(self, vocab=64, d=32, h=4, kv=2, hidden=64, n=2):
        super().__init__()
        self.hd = d // h
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(
            LlamaBlock(d, h, kv, hidden, "enable_gqa" if i % 2 == 0 else "repeat_interleave")
            for i in range(n))
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.embed_tokens(idx)
        cos, sin = _rope(idx.shape[1], self.hd, device=idx.device)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


# ----------------------------------------------------------------------------------
# BERT: padding mask from attention_mask, token types, pooler tanh
# ----------------------------------------------------------------------------------


class BertLayer(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.attn_out = nn.Linear(d, d)
        self.attn_ln = nn.LayerNorm(d, eps=1e-12)
        self.intermediate = nn.Linear(d, 4 * d)
        self.output = nn.Linear(4 * d, d)
        self.out_ln = nn.LayerNorm(d, eps=1e-12)

    def forward(self, x, ext_mask):
        b, t, d = x.shape
        q, k, v = (m(x).view(b, t, self.h, d // self.h).transpose(1, 2)
                   for m in (self.query, self.key, self.value))
        s = q @ k.transpose(-1, -2) / math.sqrt(d // self.h) + ext_mask
        a = (s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = self.attn_ln(x + self.attn_out(a))
        return self.out_ln(x + self.output(F.gelu(self.intermediate(x))))


class Bert(nn.Module):
    def __init__(self, vocab=64, d=32, h=4, n=1, t=8, types=2, classes=3):
        super().__init__()
        self.word = nn.Embedding(vocab, d, padding_idx=0)
        self.position = nn.Embedding(t, d)
        self.token_type = nn.Embedding(types, d)
        self.emb_ln = nn.LayerNorm(d, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(d, h) for _ in range(n))
        self.pooler = nn.Linear(d, d)
        self.mlm = nn.Linear(d, vocab)
        self.cls = nn.Linear(d, classes)

    def forward(self, ids, token_type_ids, attention_mask):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.emb_ln(self.word(ids) + self.position(pos)[None] + self.token_type(token_type_ids))
        ext = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, ext)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return self.mlm(x), self.cls(pooled)


def _bert_batch():
    g = gen(11)
    b, t = 3, 8
    lengths = torch.tensor([8, 5, 3])
    attention_mask = (torch.arange(t)[None] < lengths[:, None]).long()
    ids = torch.randint(1, 64, (b, t), generator=g) * attention_mask
    token_type_ids = (torch.arange(t)[None] >= (lengths[:, None] // 2)).long() * attention_mask
    labels = torch.where(attention_mask.bool(), torch.randint(0, 64, (b, t), generator=g), -100)
    cls_labels = torch.randint(0, 3, (b,), generator=g)
    return ids, token_type_ids, attention_mask, labels, cls_labels


def _bert_loss(out, labels, cls_labels):
    mlm, cls = out
    return F.cross_entropy(mlm.reshape(-1, mlm.shape[-1]), labels.reshape(-1)) + \
        F.cross_entropy(cls, cls_labels)


# ----------------------------------------------------------------------------------
# T5: relative position bias (bucketed), cross-attention, RMS layer norm
# ----------------------------------------------------------------------------------


def _relative_position_bucket(rel, bidirectional, num_buckets=8, max_distance=16):
    buckets = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (rel > 0).long() * num_buckets
        rel = rel.abs()
    else:
        rel = -torch.min(rel, torch.zeros_like(rel))
    max_exact = num_buckets // 2
    is_small = rel < max_exact
    large = max_exact + (
        torch.log(rel.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).long()
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, rel, large)


class T5Attention(nn.Module):
    def __init__(self, d, h, has_bias, bidirectional, num_buckets=8):
        super().__init__()
        self.h, self.hd = h, d // h
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.bidirectional = bidirectional
        self.rel_bias = nn.Embedding(num_buckets, h) if has_bias else None

    def position_bias(self, tq, tk, device):
        ctx = torch.arange(tq, device=device)[:, None]
        mem = torch.arange(tk, device=device)[None, :]
        bucket = _relative_position_bucket(mem - ctx, self.bidirectional)
        return self.rel_bias(bucket).permute(2, 0, 1)[None]  # (1, h, tq, tk)

    def forward(self, x, kv=None, bias=None, mask=None):
        b, tq, d = x.shape
        kv = x if kv is None else kv
        tk = kv.shape[1]
        q = self.q(x).view(b, tq, self.h, self.hd).transpose(1, 2)
        k = self.k(kv).view(b, tk, self.h, self.hd).transpose(1, 2)
        v = self.v(kv).view(b, tk, self.h, self.hd).transpose(1, 2)
        s = q @ k.transpose(-1, -2)  # T5: no 1/sqrt(d) scaling
        if bias is not None:
            s = s + bias
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        a = F.softmax(s.float(), dim=-1).type_as(s) @ v
        return self.o(a.transpose(1, 2).reshape(b, tq, d))


class T5FF(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = RMSNorm(d)
        self.wi = nn.Linear(d, 2 * d, bias=False)
        self.wo = nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        return x + self.wo(F.relu(self.wi(self.norm(x))))


class T5(nn.Module):
    def __init__(self, vocab=64, d=32, h=4, n=1):
        super().__init__()
        self.shared = nn.Embedding(vocab, d)
        self.enc_norms = nn.ModuleList(RMSNorm(d) for _ in range(n))
        self.enc_attn = nn.ModuleList(T5Attention(d, h, i == 0, True) for i in range(n))
        self.enc_ff = nn.ModuleList(T5FF(d) for _ in range(n))
        self.enc_final = RMSNorm(d)
        self.dec_norms = nn.ModuleList(RMSNorm(d) for _ in range(n))
        self.dec_attn = nn.ModuleList(T5Attention(d, h, i == 0, False) for i in range(n))
        self.cross_norms = nn.ModuleList(RMSNorm(d) for _ in range(n))
        self.cross_attn = nn.ModuleList(T5Attention(d, h, False, True) for _ in range(n))
        self.dec_ff = nn.ModuleList(T5FF(d) for _ in range(n))
        self.dec_final = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.d = d

    def forward(self, src, tgt_in):
        dev = src.device
        x = self.shared(src)
        bias = self.enc_attn[0].position_bias(src.shape[1], src.shape[1], dev)
        for norm, attn, ff in zip(self.enc_norms, self.enc_attn, self.enc_ff):
            x = ff(x + attn(norm(x), bias=bias))
        enc = self.enc_final(x)
        y = self.shared(tgt_in)
        t = tgt_in.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=dev).tril()
        dbias = self.dec_attn[0].position_bias(t, t, dev)
        for norm, attn, cnorm, cross, ff in zip(self.dec_norms, self.dec_attn, self.cross_norms,
                                                self.cross_attn, self.dec_ff):
            y = y + attn(norm(y), bias=dbias, mask=causal)
            y = ff(y + cross(cnorm(y), kv=enc))
        return self.lm_head(self.dec_final(y) * self.d ** -0.5)


def _t5_batch():
    g = gen(12)
    return (torch.randint(0, 64, (2, 10), generator=g), torch.randint(0, 64, (2, 6), generator=g),
            torch.randint(0, 64, (2, 6), generator=g))


# ----------------------------------------------------------------------------------
# ViT: patch-embedding conv, cls token, learned position embeddings
# ----------------------------------------------------------------------------------


class ViTBlock(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.norm1 = nn.LayerNorm(d, eps=1e-6)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d, eps=1e-6)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    def __init__(self, img=16, patch=4, d=32, h=4, n=1, classes=10):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, d, patch, stride=patch)
        self.cls_token = nn.Parameter(0.02 * torch.randn(1, 1, d))
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, (img // patch) ** 2 + 1, d))
        self.blocks = nn.ModuleList(ViTBlock(d, h) for _ in range(n))
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


def _img_batch(seed, b=4, c=3, hw=16, classes=10):
    g = gen(seed)
    return torch.randn(b, c, hw, hw, generator=g), torch.randint(0, classes, (b,), generator=g)


# ----------------------------------------------------------------------------------
# ResNet: BatchNorm (train mode, running stats), residuals, maxpool, adaptive avgpool
# ----------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        return F.relu(out + idt)


class ResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = BasicBlock(8, 8, 1)
        self.layer2 = BasicBlock(8, 16, 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ----------------------------------------------------------------------------------
# ConvNeXt: depthwise 7x7, LayerNorm over channels via permute, GELU, layer scale
# ----------------------------------------------------------------------------------


class ConvNeXtBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dwconv = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.pwconv1 = nn.Linear(c, 4 * c)
        self.pwconv2 = nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(0.5 * torch.ones(c))  # layer scale

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class ChannelsLayerNorm(nn.Module):
    """LayerNorm over C of an NCHW tensor (ConvNeXt's channels_first norm)."""

    def __init__(self, c, eps=1e-6):
        super().__init__()
        self.ln = nn.LayerNorm(c, eps=eps)

    def forward(self, x):
        return self.ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 2, stride=2), ChannelsLayerNorm(16))
        self.stage1 = ConvNeXtBlock(16)
        self.down = nn.Sequential(ChannelsLayerNorm(16), nn.Conv2d(16, 32, 2, stride=2))
        self.stage2 = ConvNeXtBlock(32)
        self.norm = nn.LayerNorm(32, eps=1e-6)
        self.head = nn.Linear(32, classes)

    def forward(self, x):
        x = self.stage2(self.down(self.stage1(self.stem(x))))
        return self.head(self.norm(x.mean([-2, -1])))


# ----------------------------------------------------------------------------------
# UNet diffusion block: GroupNorm, SiLU, nearest upsampling, timestep embedding, skips
# ----------------------------------------------------------------------------------


def _timestep_embedding(t, dim, max_period=10000.0):
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class ResBlock(nn.Module):
    def __init__(self, cin, cout, temb):
        super().__init__()
        self.norm1 = nn.GroupNorm(4, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.temb = nn.Linear(temb, cout)
        self.norm2 = nn.GroupNorm(4, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, emb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb(F.silu(emb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return self.skip(x) + h


class UNet(nn.Module):
    def __init__(self, c=8, temb=16):
        super().__init__()
        self.temb_dim = temb
        self.time_mlp = nn.Sequential(nn.Linear(temb, temb), nn.SiLU(), nn.Linear(temb, temb))
        self.inp = nn.Conv2d(3, c, 3, padding=1)
        self.down1 = ResBlock(c, c, temb)
        self.downsample = nn.Conv2d(c, c, 3, stride=2, padding=1)
        self.mid = ResBlock(c, 2 * c, temb)
        self.up_conv = nn.Conv2d(2 * c, c, 3, padding=1)
        self.up1 = ResBlock(2 * c, c, temb)  # after skip concat
        self.out_norm = nn.GroupNorm(4, c)
        self.out = nn.Conv2d(c, 3, 3, padding=1)

    def forward(self, x, t):
        emb = self.time_mlp(_timestep_embedding(t, self.temb_dim))
        h0 = self.down1(self.inp(x), emb)
        h = self.mid(self.downsample(h0), emb)
        h = self.up_conv(F.interpolate(h, scale_factor=2, mode="nearest"))
        h = self.up1(torch.cat([h, h0], dim=1), emb)
        return self.out(F.silu(self.out_norm(h)))


def _unet_batch():
    g = gen(13)
    return (torch.randn(2, 3, 8, 8, generator=g), torch.tensor([3, 517]),
            torch.randn(2, 3, 8, 8, generator=g))


# ----------------------------------------------------------------------------------
# recurrent: 2-layer LSTM (batch_first), bidirectional GRU
# ----------------------------------------------------------------------------------


class LSTMModel(nn.Module):
    def __init__(self, vocab=32, d=16, hid=24, classes=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, hid, num_layers=2, batch_first=True)
        self.head = nn.Linear(hid, classes)

    def forward(self, idx):
        out, (h, c) = self.rnn(self.emb(idx))
        return self.head(out + h[-1][:, None] + c[-1][:, None])


class GRUModel(nn.Module):
    def __init__(self, vocab=32, d=16, hid=24, classes=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.GRU(d, hid, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hid, classes)

    def forward(self, idx):
        out, h = self.rnn(self.emb(idx))
        return self.head(out + torch.cat([h[0], h[1]], -1)[:, None])


def _seq_batch():
    g = gen(14)
    return torch.randint(0, 32, (3, 5), generator=g), torch.randint(0, 5, (3, 5), generator=g)


# ----------------------------------------------------------------------------------
# mixture of experts: softmax router, top-k, index_add / scatter+gather dispatch
# ----------------------------------------------------------------------------------


class Expert(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.w1 = nn.Linear(d, hidden, bias=False)
        self.w3 = nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    def __init__(self, d=16, hidden=32, experts=3, k=2, classes=6):
        super().__init__()
        self.k, self.e = k, experts
        self.inp = nn.Linear(d, d)
        self.router = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList(Expert(d, hidden) for _ in range(experts))
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        b, t, d = x.shape
        h = self.inp(x).reshape(-1, d)
        probs = F.softmax(self.router(h), dim=-1)
        topw, topi = torch.topk(probs, self.k, dim=-1)
        topw = topw / topw.sum(-1, keepdim=True)
        # (1) Mixtral-style sparse dispatch: gather the routed tokens, index_add back
        sparse = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            tok, slot = torch.where(topi == e)
            if tok.numel() == 0:
                continue
            sparse.index_add_(0, tok, expert(h[tok]) * topw[tok, slot, None])
        # (2) dense dispatch: scatter the gates into (N, E), gather back the top-k outputs
        gates = torch.zeros_like(probs).scatter(1, topi, topw)
        all_out = torch.stack([expert(h) for expert in self.experts], dim=1)  # (N, E, d)
        picked = all_out.gather(1, topi[:, :, None].expand(-1, -1, d))  # (N, k, d)
        dense = (picked * gates.gather(1, topi)[:, :, None]).sum(1)
        # load-balancing auxiliary loss term (Switch style)
        frac = F.one_hot(topi[:, 0], self.e).float().mean(0)
        aux = (frac * probs.mean(0)).sum() * self.e
        y = (h + sparse + dense).reshape(b, t, d)
        return self.head(y), aux


def _moe_batch():
    g = gen(15)
    return torch.randn(2, 6, 16, generator=g), torch.randint(0, 6, (2, 6), generator=g)


def _moe_loss(out, tgt):
    logits, aux = out
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1)) + 0.01 * aux


# ----------------------------------------------------------------------------------
# DLRM: EmbeddingBag (offsets; sum / mean), dense MLP, pairwise dot interaction
# ----------------------------------------------------------------------------------


class DLRM(nn.Module):
    def __init__(self, dense_in=4, d=8, tables=(20, 30, 16)):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(dense_in, 16), nn.ReLU(), nn.Linear(16, d), nn.ReLU())
        modes = ["sum", "mean", "sum"]
        self.bags = nn.ModuleList(nn.EmbeddingBag(n, d, mode=m) for n, m in zip(tables, modes))
        f = len(tables) + 1
        self.n_inter = f * (f - 1) // 2
        self.top = nn.Sequential(nn.Linear(d + self.n_inter, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, dense, idx0, off0, idx1, off1, idx2, off2, psw2):
        x = self.bottom(dense)
        feats = [x,
                 self.bags[0](idx0, off0),
                 self.bags[1](idx1, off1),
                 self.bags[2](idx2, off2, per_sample_weights=psw2)]
        z = torch.stack(feats, dim=1)  # (B, F, d)
        inter = torch.bmm(z, z.transpose(1, 2))
        li, lj = torch.tril_indices(z.shape[1], z.shape[1], offset=-1, device=z.device)
        return self.top(torch.cat([x, inter[:, li, lj]], dim=1)).squeeze(1)


def _dlrm_batch():
    g = gen(16)
    b = 4
    out = [torch.randn(b, 4, generator=g)]
    for n, lens in ((20, [2, 1, 3, 2]), (30, [1, 4, 2, 1]), (16, [3, 2, 1, 2])):
        out.append(torch.randint(0, n, (sum(lens),), generator=g))
        out.append(torch.tensor([0] + lens[:-1]).cumsum(0))
    out.append(torch.rand(len(out[-2]), generator=g))
    out.append(torch.randint(0, 2, (b,), generator=g).float())
    return tuple(out)


# ----------------------------------------------------------------------------------
# harness
# ----------------------------------------------------------------------------------


def _run(model, inputs, targets, loss_fn, steps, stats=None):
    """Step 0 output and grads; then ``steps`` AdamW steps: losses, final state.
    ``stats``: a list that gets lazyrt's counters after each step."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS, weight_decay=0.01)
    losses, first_out, first_grads = [], None, None
    for i in range(steps):
        opt.zero_grad()
        out = model(*inputs)
        loss = loss_fn(out, *targets)
        loss.backward()
        if i == 0:
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            names = [k for k, p in model.named_parameters() if p.grad is not None]
            got = _many_to_cpu(outs + [p.grad for p in model.parameters() if p.grad is not None])
            first_out = got[:len(outs)] if isinstance(out, (tuple, list)) else got[0]
            first_grads = dict.fromkeys((k for k, _ in model.named_parameters()), None)
            first_grads.update(zip(names, got[len(outs):]))
        opt.step()
        losses.append(loss.item())
        if stats is not None:
            stats.append(lazyrt.metrics.counters())
    sd = model.state_dict()
    state = dict(zip(sd.keys(), _many_to_cpu(list(sd.values()))))
    return first_out, first_grads, losses, state


def _many_to_cpu(tensors):
    """Copy to CPU as one flattened tensor per dtype: one transfer (and in defer mode one
    flush) instead of one per tensor, each of which compiles a program per shape."""
    tensors = [t.detach() for t in tensors]
    if not tensors or tensors[0].device.type != "tpu":
        return [t.clone() for t in tensors]
    out = [None] * len(tensors)
    for dt in {t.dtype for t in tensors}:
        idx = [i for i, t in enumerate(tensors) if t.dtype == dt]
        flat = torch.cat([tensors[i].reshape(-1) for i in idx]).cpu()
        for i, chunk in zip(idx, flat.split([tensors[i].numel() for i in idx])):
            out[i] = chunk.reshape(tensors[i].shape)
    return out


def _close(actual, expected, rtol, atol, what):
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def check_family(model_fn, batch_fn, n_inputs, loss_fn, mode, rtol=1e-4, atol=1e-5,
                 step_rtol=1e-4, step_atol=1e-4, steps=STEPS, compile=False, stats=None,
                 allow_unused=False):
    """``compile``: the tpu model runs under ``model.compile()`` (torch.compile);
    ``stats``: a list that gets lazyrt's counters after each tpu step;
    ``allow_unused``: parameters the loss does not reach (no gradient on CPU, e.g. a
    mask token only used in pre-training) are allowed; they must have none on tpu either.
    """
    torch.manual_seed(0)
    ref_model = model_fn()
    tpu_model = copy.deepcopy(ref_model).to("tpu")
    if compile:
        tpu_model.compile()
    # NOTE: no re-tying: Module.to("tpu") keeps tied parameters tied
    # (test_to_tpu_keeps_tied_parameters).
    batch = batch_fn()
    inputs, targets = batch[:n_inputs], batch[n_inputs:]

    ref = _run(ref_model, inputs, targets, loss_fn, steps)
    with lazyrt.set_mode(mode):
        got = _run(tpu_model, [t.to("tpu") for t in inputs], [t.to("tpu") for t in targets],
                   loss_fn, steps, stats)
        lazyrt.sync()

    (r_out, r_grads, r_losses, r_state), (g_out, g_grads, g_losses, g_state) = ref, got

    _close(g_out, r_out, rtol, atol, "forward output")
    assert g_grads.keys() == r_grads.keys()
    missing = [k for k, v in r_grads.items() if v is None]
    if allow_unused:
        extra = [k for k in missing if g_grads[k] is not None]
        assert not extra, f"gradient on tpu for parameters without one on CPU: {extra}"
    else:
        assert not missing, f"reference model has parameters without gradient: {missing}"
    for k in r_grads:
        if r_grads[k] is None:
            continue
        assert g_grads[k] is not None, f"{k}: no gradient on tpu"
        _close(g_grads[k], r_grads[k], rtol, atol, f"grad {k}")
    for i, (a, b) in enumerate(zip(g_losses, r_losses)):
        assert math.isclose(a, b, rel_tol=rtol, abs_tol=atol), f"step {i}: loss {a} != {b}"
    assert g_state.keys() == r_state.keys()
    for k in r_state:
        _close(g_state[k], r_state[k], step_rtol, step_atol + _noise_step(r_grads.get(k),
               g_grads.get(k), atol, steps), f"after {steps} AdamW steps: {k}")


def _noise_step(r_grad, g_grad, grad_atol, steps):
    """Extra tolerance after the AdamW steps for a parameter whose gradient is zero up to
    float32 rounding (within the gradient tolerance on CPU: a key projection's bias under
    softmax, whose exact gradient is 0). Adam divides by |g| + eps, so such a gradient's
    noise moves the parameter by up to LR * |g| / EPS a step, differently on each backend;
    the gradients themselves were compared above. 0 for every other parameter."""
    if r_grad is None or g_grad is None or r_grad.abs().max() > grad_atol:
        return 0.0
    return steps * LR * float(r_grad.abs().max() + g_grad.abs().max()) / EPS


# name: (model_fn, batch_fn, number of model inputs in the batch, loss_fn, tolerances)
FAMILIES = {
    "gpt2": (GPT2, _lm_batch, 1, _lm_loss, {}),
    "llama": (Llama, _lm_batch, 1, _lm_loss, {}),
    "bert": (Bert, _bert_batch, 3, _bert_loss, {}),
    "t5": (T5, _t5_batch, 2, _lm_loss, {}),
    "vit": (ViT, lambda: _img_batch(17), 1, F.cross_entropy, {}),
    "resnet": (ResNet, lambda: _img_batch(18), 1, F.cross_entropy, {}),
    "convnext": (ConvNeXt, lambda: _img_batch(19), 1, F.cross_entropy, {}),
    "unet": (UNet, _unet_batch, 2, F.mse_loss, {}),
    "lstm": (LSTMModel, _seq_batch, 1, _lm_loss, {}),
    "gru": (GRUModel, _seq_batch, 1, _lm_loss, {}),
    "moe": (MoE, _moe_batch, 1, _moe_loss, {}),
    "dlrm": (DLRM, _dlrm_batch, 8, F.binary_cross_entropy_with_logits, {}),
}

XFAIL: dict[str, str] = {}
# The slowest families run in strict mode with -m slow only (CI runs them in defer, and
# strict runs the same lowerings op by op in every other family): 20-30 s each here.
STRICT_SLOW = {"moe", "unet", "t5", "lstm"}


def _params():
    out = []
    for name in FAMILIES:
        for mode in ("strict", "defer"):
            marks = [pytest.mark.xfail(strict=True, reason=XFAIL[name])] if name in XFAIL else []
            if mode == "strict" and name in STRICT_SLOW:
                marks.append(pytest.mark.slow)
            out.append(pytest.param(name, mode, marks=marks, id=f"{mode}-{name}"))
    return out


@pytest.mark.sweep(every=12)  # a sixth of the families, each in one mode; -m slow: the rest
@pytest.mark.parametrize("family,mode", _params(), indirect=["mode"])
def test_model_family_matches_cpu(family, mode):
    model_fn, batch_fn, n_inputs, loss_fn, tol = FAMILIES[family]
    check_family(model_fn, batch_fn, n_inputs, loss_fn, mode, **tol)


def test_to_tpu_keeps_tied_parameters():
    m = GPT2()
    assert m.lm_head.weight is m.wte.weight
    m.to("tpu")
    assert m.lm_head.weight is m.wte.weight

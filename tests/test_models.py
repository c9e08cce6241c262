"""Models train on tpu exactly as on CPU: losses and parameters after every step
(fp32, rtol 1e-4), in strict and in defer mode."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lazyrt

pytestmark = pytest.mark.sweep(every=4)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(),
                                 nn.Dropout(0.0), nn.Linear(64, 10))

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.c1(x)))
        x = F.max_pool2d(x, 2)
        x = F.relu(self.bn2(self.c2(x)))
        x = F.avg_pool2d(x, 2, ceil_mode=True)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


class Block(nn.Module):
    def __init__(self, d, h, causal):
        super().__init__()
        self.h = h
        self.causal = causal
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))
        self.drop = nn.Dropout(0.0)

    def forward(self, x, mask=None):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal and mask is None)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, t, d)))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab=50, d=32, h=4, n=2, t=16, causal=True):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(t, d)
        self.blocks = nn.ModuleList(Block(d, h, causal) for _ in range(n))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, mask=None):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)[None]
        for blk in self.blocks:
            x = blk(x, mask)
        return self.head(self.ln(x))


def _train(model_fn, batch_fn, loss_fn, opt_fn, device, steps=3, sched=False):
    torch.manual_seed(0)
    model = model_fn().to(device)
    opt = opt_fn(model.parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.7) if sched else None
    inputs = [t.to(device) for t in batch_fn()]
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model, *inputs)
        loss.backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.item())
    params = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return losses, params


def _compare(model_fn, batch_fn, loss_fn, opt_fn, mode, steps=3, sched=False, rtol=1e-4, atol=1e-5):
    ref_losses, ref_params = _train(model_fn, batch_fn, loss_fn, opt_fn, "cpu", steps, sched)
    with lazyrt.set_mode(mode):
        losses, params = _train(model_fn, batch_fn, loss_fn, opt_fn, "tpu", steps, sched)
    for i, (a, b) in enumerate(zip(losses, ref_losses)):
        assert math.isclose(a, b, rel_tol=rtol, abs_tol=atol), f"step {i}: loss {a} != {b}"
    for k in ref_params:
        torch.testing.assert_close(params[k], ref_params[k], rtol=rtol, atol=atol,
                                   msg=lambda m, k=k: f"{k}: {m}")


def _mlp_batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)


def _ce(model, x, y):
    return F.cross_entropy(model(x), y)


OPTIMIZERS = {
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4),
    "adam_foreach": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
    "adam_forloop": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False, amsgrad=True),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    "adamw_forloop": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False),
    "adamw_fused": lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
}


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_mlp_trains_like_cpu(mode, opt):
    _compare(MLP, _mlp_batch, _ce, OPTIMIZERS[opt], mode, steps=3, sched=True)


def test_cnn_trains_like_cpu(mode):
    def batch():
        g = torch.Generator().manual_seed(2)
        return torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)

    _compare(CNN, batch, _ce, OPTIMIZERS["sgd_momentum"], mode, steps=3, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("variant", ["causal", "bool_mask", "float_mask"])
def test_transformer_trains_like_cpu(mode, variant):
    t = 16

    def batch():
        g = torch.Generator().manual_seed(3)
        idx = torch.randint(0, 50, (2, t), generator=g)
        tgt = torch.randint(0, 50, (2, t), generator=g)
        if variant == "causal":
            return idx, tgt
        keep = torch.ones(t, t, dtype=torch.bool).tril()
        keep[:, :2] = True
        if variant == "bool_mask":
            return idx, tgt, keep
        return idx, tgt, torch.zeros(t, t).masked_fill(~keep, float("-inf"))

    def loss(model, idx, tgt, mask=None):
        logits = model(idx, mask)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))

    # NOTE: eps=1e-5: the key bias gets only rounding-noise gradients (softmax is invariant
    # to it), which Adam with a tiny eps amplifies into +-lr steps on any backend.
    _compare(lambda: TinyGPT(causal=variant == "causal"), batch, loss,
             lambda p: torch.optim.AdamW(p, lr=1e-2, eps=1e-5),
             mode, steps=3, rtol=2e-4, atol=2e-5)


def test_dropout_training_runs(mode):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).to("tpu")
    x = torch.ones(64, 8, device="tpu")
    out = m(x)
    zeros = (out == 0).float().mean().item()
    assert 0.3 < zeros < 0.7
    out.sum().backward()
    assert m[0].weight.grad is not None
    m.eval()
    torch.testing.assert_close(m(x).cpu(), m.cpu()(torch.ones(64, 8)))

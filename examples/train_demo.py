"""The main demo: a small transformer language model trains on the tpu device.

    python examples/train_demo.py [--mode strict|defer] [--steps N]

Prints the loss and the time of every step, then lazyrt's counters.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import lazyrt


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab=256, d=128, heads=4, layers=2, seq=64):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(pos))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["strict", "debug", "defer"], default=None,
                    help="lazyrt mode (default: TORCH_TPU_MODE, else strict)")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    if args.mode:
        lazyrt.set_mode(args.mode)
    device = "tpu"  # the one-line change from "cuda"
    torch.manual_seed(0)
    model = TinyLM().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.steps)
    # A learnable toy language: every sequence counts up modulo the vocabulary.
    start = torch.randint(0, 256, (16, 1))
    data = ((start + torch.arange(65)) % 256).to(device)
    x, y = data[:, :-1], data[:, 1:]
    print(f"lazyrt {lazyrt.__version__}: mode={lazyrt.get_mode()} device={torch.tpu.get_device_name()}")
    for step in range(args.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        sched.step()
        value = loss.item()
        print(f"step {step:3d}  loss {value:.4f}  {1e3 * (time.perf_counter() - t0):8.1f} ms")
    c = lazyrt.metrics.counters()
    print(f"flushes={c['flushes']} executions={c['executions']} cache hits/misses="
          f"{c['cache_hits']}/{c['cache_misses']} compile={c['compile_seconds']:.1f}s "
          f"peak HBM={torch.tpu.max_memory_allocated() / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()

"""The main demo: a small transformer language model trains on the tpu device.

    python examples/train_demo.py [--mode strict|defer] [--steps N] [--profile DIR]

Prints the loss and the time of every step, then lazyrt's counters. ``--profile DIR``
records steps 3 and 4 with ``torch.profiler`` (``profile_memory=True``) into DIR (a trace
for TensorBoard or ui.perfetto.dev) and prints the profiler's table: see docs/profiling.md.
"""
from __future__ import annotations

import argparse
import contextlib
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


def train_step(step: int, model, opt, sched, x, y) -> None:
    t0 = time.perf_counter()
    opt.zero_grad()
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    opt.step()
    sched.step()
    value = loss.item()
    print(f"step {step:3d}  loss {value:.4f}  {1e3 * (time.perf_counter() - t0):8.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["strict", "debug", "defer"], default=None,
                    help="lazyrt mode (default: TORCH_TPU_MODE, else strict)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--profile", metavar="DIR", default=None,
                    help="record steps 3-4 with torch.profiler into DIR (docs/profiling.md)")
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
    prof = contextlib.nullcontext()
    if args.profile:
        from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

        # steps 0-1 compile, step 2 warms the profiler up, steps 3-4 are recorded
        prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                       schedule=schedule(wait=2, warmup=1, active=2, repeat=1),
                       on_trace_ready=tensorboard_trace_handler(args.profile),
                       profile_memory=True)
    with prof:
        for step in range(args.steps):
            train_step(step, model, opt, sched, x, y)
            if args.profile:
                prof.step()
    if args.profile:
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12,
                                        max_name_column_width=70))
        print(f"trace written to {args.profile}/ (open it in ui.perfetto.dev or TensorBoard; "
              f"lazyrt-mem read {args.profile})")
    c = lazyrt.metrics.counters()
    print(f"flushes={c['flushes']} executions={c['executions']} cache hits/misses="
          f"{c['cache_hits']}/{c['cache_misses']} compile={c['compile_seconds']:.1f}s "
          f"peak HBM={torch.tpu.max_memory_allocated() / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()

"""A compiled diffusion loop over Python int timesteps: graphs, programs and seconds per call.

    python -m perf.compile_scalars [--mode strict|defer|cpu] [--steps 8] [--dynamic-false]

A tiny diffusers ``UNet2DModel`` (built from a config) under ``torch.compile``, called with
one int timestep per step, as a scheduler loop does. Reports Dynamo graphs (AOT graphs
lazyrt compiled: ``compiled_graphs``), XLA programs compiled (``cache_misses``), eager
fallbacks (``compiled_eager_calls``) and wall seconds of each call, and the largest
difference from CPU eager. ``--mode cpu`` runs PyTorch's own ``torch.compile`` (inductor)
on the CPU for comparison (its graph count from ``torch._dynamo.utils.counters``);
``--dynamic-false`` compiles with ``dynamic=False`` (every int specialized: one graph per
value, then Dynamo's recompile limit).
"""
from __future__ import annotations

import argparse
import time

import torch


def _unet():
    import diffusers

    torch.manual_seed(0)
    return diffusers.UNet2DModel(
        sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=(8, 16), down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"), norm_num_groups=4).eval()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="strict", choices=("strict", "defer", "cpu"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--dynamic-false", action="store_true")
    a = ap.parse_args()
    unet = _unet()
    x = torch.randn(1, 3, 8, 8)
    ts = [int(999 - i * 999 / max(a.steps - 1, 1)) for i in range(a.steps)]
    with torch.no_grad():
        ref = [unet(x, t).sample for t in ts]
    kw = {"dynamic": False} if a.dynamic_false else {}
    if a.mode == "cpu":
        from torch._dynamo.utils import counters

        cu, dev, count = torch.compile(unet, **kw), "cpu", None
    else:
        import lazyrt
        from lazyrt import metrics

        lazyrt.set_mode(a.mode)
        cu, dev = torch.compile(unet.to("tpu"), **kw), "tpu"

        def count():
            c = metrics.counters()
            return {k: c[k] for k in ("compiled_graphs", "cache_misses", "compiled_eager_calls")}
    xd = x.to(dev)
    worst = 0.0
    print(f"mode={a.mode} steps={a.steps} dynamic={'False' if a.dynamic_false else 'None'}")
    with torch.no_grad():
        for t, r in zip(ts, ref):
            before = count() if count else None
            t0 = time.perf_counter()
            y = cu(xd, t).sample.cpu()
            dt = time.perf_counter() - t0
            worst = max(worst, (y - r).abs().max().item())
            d = {k: v - before[k] for k, v in count().items()} if count else {}
            print(f"  t={t:4d}  {dt:7.3f} s  {d}")
    if a.mode == "cpu":
        print(f"  Dynamo graphs: {counters['stats']['unique_graphs']}")
    print(f"  max |compiled - CPU eager| = {worst:.2e}")


if __name__ == "__main__":
    main()

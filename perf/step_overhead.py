"""Host time per training step that is not kernel time: the ``mlp_train`` step (3 Linear
layers, AdamW, ``loss.item()``) at a tiny width, where every kernel costs next to nothing,
so the step's time is the Python/C++ machinery around the kernels.

    python -m perf.step_overhead [--width 8] [--steps 40] [--warmup 20] [--repeat 3]

Rows, each in a fresh process (median step, median of ``--repeat`` rounds):

- ``cpu eager``: PyTorch CPU eager (autograd, the optimizer's Python, C++ kernels);
- ``cpu aot_eager`` / ``+ step``: ``torch.compile(model, backend="aot_eager")`` (and the
  optimizer step compiled too) on CPU tensors: Dynamo's guards, AOTAutograd's runtime
  wrappers, eager kernels. What ``torch.compile`` itself costs per step, with no backend
  work at all;
- ``tpu strict`` / ``tpu defer`` / ``tpu compiled`` / ``tpu compiled + step``: lazyrt.

A whole-step plain-JAX program has about 0.1 ms of host time, so on a CPU (where the
host's cores are the device's) a compiled step can be no closer to that floor than this
machinery allows. Reported, never asserted.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CONFIGS = [("cpu", "eager", False), ("cpu", "aot_eager", False), ("cpu", "aot_eager", True),
           ("tpu", "strict", False), ("tpu", "defer", False), ("tpu", "compiled", False),
           ("tpu", "compiled", True)]


def _run_one(device: str, kind: str, step: bool, width: int, steps: int, warmup: int) -> float:
    import time

    import torch
    import torch.nn.functional as F
    from torch import nn

    if device == "tpu":
        import lazyrt

        lazyrt.set_mode("strict" if kind == "strict" else "defer")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width),
                          nn.ReLU(), nn.Linear(width, 10)).to(device)
    x = torch.randn(64, width).to(device)
    y = torch.randint(0, 10, (64,)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if kind in ("aot_eager", "compiled"):
        kw = {"backend": "aot_eager"} if kind == "aot_eager" else {}
        model = torch.compile(model, **kw)
        if step:
            opt.step = torch.compile(opt.step, **kw)
    ts = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
        if i >= warmup:
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def _label(device, kind, step):
    return f"{device} {kind}" + (" + step" if step else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.step_overhead")
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one is not None:  # a worker: one configuration, in this process
        device, kind, step = a.one.split(":")
        print(_run_one(device, kind, step == "1", a.width, a.steps, a.warmup))
        return 0
    res: dict = {c: [] for c in CONFIGS}
    for r in range(a.repeat):
        # each round starts from the next configuration, so none always runs first
        order = CONFIGS[r % len(CONFIGS):] + CONFIGS[:r % len(CONFIGS)]
        for c in order:
            env_one = f"{c[0]}:{c[1]}:{int(c[2])}"
            out = subprocess.run(
                [sys.executable, "-m", "perf.step_overhead", "--one", env_one,
                 "--width", str(a.width), "--steps", str(a.steps), "--warmup", str(a.warmup)],
                capture_output=True, text=True, timeout=600)
            if out.returncode != 0:
                raise SystemExit(f"{_label(*c)} failed:\n{out.stderr[-2000:]}")
            res[c].append(float(out.stdout.strip().splitlines()[-1]))
    print(f"mlp_train step at width {a.width} (kernels ~free): median ms per step, "
          f"median of {a.repeat} rounds")
    for c in CONFIGS:
        print(f"  {_label(*c):24s} {statistics.median(res[c]):7.3f} ms   "
              f"(rounds: {', '.join(f'{v:.3f}' for v in res[c])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

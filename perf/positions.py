"""Positions as runtime values (issue 39): a ``for i`` loop of row reads and writes, its
programs and compile time at 10 and at 1,000 steps (strict, and defer with a sync per
step), and the host CPU time per op of view-consuming ops (the hot path positions touch).

    python -m perf.positions [--steps 10,1000] [--ops 2000] [--reps 15]

The loop body is ``x[i] = s[i] * 2 + x[(i + 1) % n]`` (a row write, two row reads) on a
(n, 8, 8) float32 tensor. Compile figures are lazyrt's own (``compile_seconds``, programs
compiled), not wall time. Per-op times are ``time.thread_time`` per op, the minimum over
``--reps`` runs. Run it under another checkout (``PYTHONPATH=/other/checkout
TORCH_DEVICE_BACKEND_AUTOLOAD=0``) to compare two versions side by side.
"""
from __future__ import annotations

import argparse
import json
import time


def _loop(lazyrt, torch, mode: str, steps: int) -> dict:
    from lazyrt._base.metrics import COUNTERS

    n = max(steps, 16)
    with lazyrt.set_mode(mode):
        x = torch.zeros(n, 8, 8).to("tpu")
        s = torch.randn(n, 8, 8).to("tpu")
        lazyrt.sync()
        c0, t0 = COUNTERS["cache_misses"], COUNTERS["compile_seconds"]
        w0 = time.perf_counter()
        for i in range(steps):
            x[i] = s[i] * 2 + x[(i + 1) % n]
            if mode == "defer":
                lazyrt.sync()
        x.cpu()
        wall = time.perf_counter() - w0
    return {"programs": int(COUNTERS["cache_misses"] - c0),
            "compile_s": round(COUNTERS["compile_seconds"] - t0, 3), "wall_s": round(wall, 3)}


def _per_op(torch, lazyrt, reps: int, ops: int) -> dict:
    x = torch.rand(16, 4, 4).to("tpu")
    y = torch.rand(4, 4).to("tpu")
    cases = {
        "row x[i] + y": lambda i: x[i % 16] + y,
        "slice x[1:3].sum()": lambda i: x[1:3].sum(),
        "static slice x[:2].sum()": lambda i: x[:2].sum(),
        "static view y.t() + y": lambda i: y.t() + y,
        "base y * y": lambda i: y * y,
    }
    out = {}
    with lazyrt.set_mode("strict"):
        for name, f in cases.items():
            for i in range(20):
                f(i)
            best = float("inf")
            for _ in range(reps):
                t0 = time.thread_time()
                for i in range(ops):
                    f(i)
                best = min(best, (time.thread_time() - t0) / ops * 1e6)
            out[name] = round(best, 2)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.positions")
    ap.add_argument("--steps", default="10,1000")
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--no-loop", action="store_true")
    a = ap.parse_args(argv)

    import torch

    import lazyrt

    res: dict = {}
    if not a.no_loop:
        for mode in ("strict", "defer"):
            for steps in (int(v) for v in a.steps.split(",")):
                res[f"{mode}_{steps}"] = _loop(lazyrt, torch, mode, steps)
    res["strict_us_per_op"] = _per_op(torch, lazyrt, a.reps, a.ops)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Profile the timed steps of one (workload, mode) with cProfile (warm-up excluded).

    python -m perf.profile --workload adamw_many --mode defer [--steps 10] [--warmup 3]
        [--sort tottime|cumulative] [--top 40] [--variant V] [--out FILE.prof]

Prints the top functions; ``--out`` keeps the raw stats for snakeviz / pstats.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.profile")
    ap.add_argument("--workload", required=True)
    ap.add_argument("--variant", default=None)
    ap.add_argument("--mode", default="defer", choices=["strict", "defer", "cpu", "compiled", "compiled_step"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--sort", default="tottime")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    import torch

    from .workloads import WORKLOADS

    device = "cpu" if a.mode == "cpu" else "tpu"
    if device == "tpu":
        import lazyrt

        lazyrt.set_mode("defer" if a.mode.startswith("compiled") else a.mode)
    torch.manual_seed(0)
    base = "defer" if a.mode.startswith("compiled") else a.mode
    wl = WORKLOADS[a.workload](device, base, a.variant)
    if a.mode.startswith("compiled"):
        wl.compile(step=a.mode == "compiled_step")
    for _ in range(max(a.warmup, 1)):
        wl.step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.steps):
        wl.step()
    prof.disable()
    if a.out:
        prof.dump_stats(a.out)
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats(a.sort).print_stats(a.top)
    print(s.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What ``torch.profiler`` costs on tpu work: CPU time per op of the issuing thread with no
profiler and inside ``torch.profiler.profile(activities=[CPU])``, side by side in one
process (the minimum over ``--reps`` chains of ``--ops`` 4x4 ``mul``/``add`` ops):

- ``cpu_eager``: the chain on CPU tensors (the profiler's own cost per ATen op: its floor);
- ``strict``: every op run (one ``lazyrt::op`` range each), then a host read;
- ``defer``: the chain recorded (a source line captured per op) and flushed at a host read
  (one ``lazyrt::flush`` range, a cache hit).

    python -m perf.profiler_cost [--ops 400] [--reps 15] [--memory]

``--memory``: the profiler with ``profile_memory=True`` (lazyrt's memory events; strict
ops logged with their HBM peak).

The profiler is started and stopped around each chain outside the clock (it starts a
``jax.profiler`` trace too); the chain alone is timed.
"""
from __future__ import annotations

import argparse
import time


def _chain(y, a, n):
    for _ in range(n // 2):
        y = y * a
        y = y + a
    return y


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.profiler_cost")
    ap.add_argument("--ops", type=int, default=400)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--memory", action="store_true", help="profile_memory=True")
    a = ap.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    import lazyrt

    x, w = torch.rand(4, 4), torch.full((4, 4), 0.999)
    tx, tw = x.to("tpu"), w.to("tpu")

    def run(f, on: bool) -> float:
        best = float("inf")
        for _ in range(a.reps):
            prof = profile(activities=[ProfilerActivity.CPU],
                           profile_memory=a.memory) if on else None
            if prof is not None:
                prof.start()
            t0 = time.thread_time()
            f()
            dt = time.thread_time() - t0
            if prof is not None:
                prof.stop()
            best = min(best, dt / a.ops * 1e6)
        return best

    cases = {
        "cpu_eager": (None, lambda: _chain(x, w, a.ops).sum().item()),
        "strict": ("strict", lambda: _chain(tx, tw, a.ops).sum().item()),
        "defer": ("defer", lambda: _chain(tx, tw, a.ops).sum().item()),
    }
    print(f"{'':<10} {'off us/op':>10} {'on us/op':>10} {'on/off':>7}")
    for name, (mode, f) in cases.items():
        ctx = lazyrt.set_mode(mode) if mode else lazyrt.set_mode(lazyrt.get_mode())
        with ctx:
            f()
            f()  # compiled, cached
            # alternate off and on, so a change of the machine's load hits both
            off, on = [], []
            for _ in range(2):
                off.append(run(f, False))
                on.append(run(f, True))
        print(f"{name:<10} {min(off):10.2f} {min(on):10.2f} {min(on) / min(off):6.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

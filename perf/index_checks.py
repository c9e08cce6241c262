"""What the device-side index bounds check costs a training step (``lazyrt/_ops/bounds.py``).

    python -m perf.index_checks [--modes strict,defer] [--steps 30] [--warmup 5]

The ``gpt_train`` step (two embeddings, cross-entropy, AdamW, ``loss.item()``), in one
process, three ways side by side, one step of each in turn (the order rotating), so the
machine's load drifts alike for all three:

- ``off``: its token, position and target indices made on the device, ``LAZYRT_INDEX_CHECKS``
  off: XLA's gathers unchecked (what lazyrt did before the checks);
- ``device``: the same device indices, checked on the device (the default): one more tiny
  output of the op's own program per embedding and per cross-entropy, read at the next
  sync point;
- ``host``: the indices as the workload makes them (moved from the CPU: known on the host,
  checked there, no device work).

Reported: the median step of each, wall time and process CPU time (all threads: on a shared
machine the steadier of the two), and ``device / off``. The target: under 1.05 (5% of a
step). Reported, never asserted.
"""
from __future__ import annotations

import argparse
import statistics
import time

VARIANTS = ("off", "device", "host")


def _workload(mode: str, variant: str):
    import lazyrt
    from perf.workloads import GPTTrain

    with lazyrt.set_mode(mode):
        w = GPTTrain("tpu", mode)
        if variant != "host":  # device values: not known on the host
            w.idx, w.tgt, w.pos = w.idx * 1, w.tgt * 1, w.pos * 1
        lazyrt.sync()
    return w


def _step(w, mode: str, variant: str) -> tuple:
    """(wall, CPU) seconds of one step."""
    import lazyrt

    lazyrt.config.index_checks = "off" if variant == "off" else "async"
    try:
        with lazyrt.set_mode(mode):
            t0, c0 = time.perf_counter(), time.process_time()
            w.step()
            return time.perf_counter() - t0, time.process_time() - c0
    finally:
        lazyrt.config.index_checks = "async"


def run(modes, steps: int, warmup: int) -> dict:
    """{mode: {variant: (median wall ms, median CPU ms)}}"""
    res = {}
    for mode in modes:
        ws = {v: _workload(mode, v) for v in VARIANTS}
        for _ in range(warmup):
            for v in VARIANTS:
                _step(ws[v], mode, v)
        times = {v: [] for v in VARIANTS}
        for r in range(steps):
            for v in VARIANTS[r % 3:] + VARIANTS[:r % 3]:
                times[v].append(_step(ws[v], mode, v))
        res[mode] = {v: tuple(statistics.median(x[k] for x in t) * 1e3 for k in (0, 1))
                     for v, t in times.items()}
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.index_checks")
    ap.add_argument("--modes", default="strict,defer")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args(argv)
    res = run(a.modes.split(","), a.steps, a.warmup)
    print(f"gpt_train, median of {a.steps} steps each (ms/step)")
    print(f"{'mode':8s} {'time':5s} {'off':>9s} {'device':>9s} {'host':>9s} {'device/off':>11s}")
    for mode, r in res.items():
        for k, what in enumerate(("wall", "CPU")):
            print(f"{mode:8s} {what:5s} {r['off'][k]:9.2f} {r['device'][k]:9.2f} "
                  f"{r['host'][k]:9.2f} {r['device'][k] / r['off'][k]:11.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

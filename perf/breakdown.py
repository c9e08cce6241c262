"""Split a tpu workload's step into flush time and the rest (recording, waiting for results).

    python -m perf.breakdown WORKLOAD [MODE] [STEPS]

Prints median step ms, ms inside ``_defer.flush``, ms outside it, ops dispatched per step and
the executable call time of the last step (from the counters).
"""
from __future__ import annotations

import statistics
import sys
import time


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    name = argv[0]
    mode = argv[1] if len(argv) > 1 else "defer"
    steps = int(argv[2]) if len(argv) > 2 else 8
    import torch

    import lazyrt
    from lazyrt._exec import defer as _defer

    from .workloads import WORKLOADS

    lazyrt.set_mode(mode)
    torch.manual_seed(0)
    wl = WORKLOADS[name]("tpu", mode)
    orig = _defer.flush
    acc = [0.0]

    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            acc[0] += time.perf_counter() - t

    _defer.flush = timed
    for _ in range(3):
        wl.step()
    tot, fl = [], []
    for _ in range(steps):
        acc[0] = 0.0
        c0 = lazyrt.metrics.counters()
        t = time.perf_counter()
        wl.step()
        tot.append(time.perf_counter() - t)
        fl.append(acc[0])
    c1 = lazyrt.metrics.counters()
    _defer.flush = orig
    ops = c1["ops_dispatched"] - c0["ops_dispatched"]
    ex = c1["execute_seconds"] - c0["execute_seconds"]
    out = statistics.median([a - b for a, b in zip(tot, fl)])
    print(f"{name} {mode}: step {statistics.median(tot) * 1e3:.1f} ms, flush "
          f"{statistics.median(fl) * 1e3:.1f} ms, outside flush {out * 1e3:.1f} ms, ops/step {ops}, "
          f"outside-flush per op {out * 1e6 / max(ops, 1):.1f} us, executable call {ex * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m perf.flat_draws``: cold random draws made by flat draws of bucketed lengths
(``lazyrt._exec.flatdraw``) against one compile per shape.

The proxy is what PyTorch's ``test_view_ops.py`` (``_generate_input``: ``randn`` of random
shapes, ``test_atleast``) and ``make_tensor`` (``uniform_``) do: ``--shapes`` random shapes
(1-4 dims of 5-10, seeded), each drawn with ``randn``, ``rand``, ``uniform_``, ``normal_``
and ``randint`` in float32/float64/bfloat16 (ints in int64), then read. Both rows run at
once (so they share the load), each in a fresh process with no disk cache, in strict:

    python -m perf.flat_draws [--shapes 30] [--mode strict]

Columns: wall seconds, programs compiled (``cache_misses``), draws made flat
(``flat_draws``), and whether both rows drew the same values (a checksum of the bits).
"""
from __future__ import annotations

import argparse
import os
import sys

from .cold_flush import proxy_result, start_proxy

_PROXY = r"""
import hashlib, json, random, sys, time
import torch
import lazyrt
from lazyrt._exec import flatdraw
flatdraw.ENABLED = sys.argv[2] == "1"
n_shapes = int(sys.argv[1])
rnd = random.Random(0)
shapes = [tuple(rnd.randint(5, 10) for _ in range(rnd.randint(1, 4))) for _ in range(n_shapes)]
h = hashlib.sha256()
torch.manual_seed(0)
t0 = time.perf_counter()
for sh in shapes:
    for dt in (torch.float32, torch.float64, torch.bfloat16):
        for t in (torch.randn(sh, dtype=dt, device="tpu"), torch.rand(sh, dtype=dt, device="tpu"),
                  torch.empty(sh, dtype=dt, device="tpu").uniform_(-5, 5),
                  torch.empty(sh, dtype=dt, device="tpu").normal_(1, 2)):
            h.update(t.cpu().view(torch.uint8 if dt != torch.bfloat16 else torch.int16).numpy().tobytes())
    h.update(torch.randint(15, 100, sh, device="tpu").cpu().numpy().tobytes())
c = lazyrt.metrics.counters()
print(json.dumps({"seconds": time.perf_counter() - t0, "compiles": c["cache_misses"],
                  "flat_draws": c["flat_draws"], "digest": h.hexdigest()[:16]}))
"""

ROWS = (("one compile per shape", "0"), ("flat draws", "1"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", type=int, default=30)
    ap.add_argument("--mode", default="strict")
    a = ap.parse_args(argv)
    print(f"load avg {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores; {a.shapes} shapes, "
          f"{a.mode}")
    print("| row | s | ratio to first row | compiles | flat draws | values (digest) |")
    print("| --- | --- | --- | --- | --- | --- |")
    procs = [(label, start_proxy(_PROXY, [a.shapes, flat], a.mode, {})) for label, flat in ROWS]
    base = None
    for label, p in procs:
        r = proxy_result(p)
        base = base or r["seconds"]
        print(f"| {label} | {r['seconds']:.1f} | {r['seconds'] / base:.2f} | {r['compiles']} | "
              f"{r['flat_draws']} | {r['digest']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

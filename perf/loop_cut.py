"""``python -m perf.loop_cut``: defer's loop cut (``LAZYRT_LOOP_CUT``) against one trace.

Two rows, each in fresh processes per setting (an empty compile cache for the first):
- ``rows_cold``: ``torch.stack([torch.cos(s) for s in x])`` over 1024 rows, the first run
  (compile included): one trace of 1,026 ops against segments of about 64.
- ``loop_warm``: ``z = z * 0.5 + y`` 2000 times on 8x8 tensors, recorded and run warm:
  host microseconds per op (the cut flushes every ~64 ops where one trace would be a
  cache hit).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

_COLD = """
import time, torch, lazyrt
x = torch.randn(1024, 512).to('tpu')
t0 = time.perf_counter()
out = torch.stack([torch.cos(s) for s in x]) + torch.cos(x)
out.cpu()
print(time.perf_counter() - t0)
"""

_WARM = """
import time, torch, lazyrt
x = torch.randn(8, 8).to('tpu'); y = torch.randn(8, 8).to('tpu')
def loop(n):
    z = x
    for _ in range(n):
        z = z * 0.5 + y
    return z
loop(2000).cpu()
ts = []
for _ in range(7):
    t0 = time.perf_counter(); loop(2000).cpu(); ts.append(time.perf_counter() - t0)
print(sorted(ts)[3] / 4000 * 1e6)
"""


def _run(code: str, cut: int) -> float:
    env = dict(os.environ, TORCH_TPU_MODE="defer", LAZYRT_LOOP_CUT=str(cut),
               LAZYRT_CACHE_DIR=tempfile.mkdtemp(prefix="lazyrt-loopcut-"), JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    print("| row | LAZYRT_LOOP_CUT=0 | LAZYRT_LOOP_CUT=64 | ratio |")
    print("| --- | --- | --- | --- |")
    for name, code, unit in (("rows_cold", _COLD, "s"), ("loop_warm", _WARM, "us/op")):
        a, b = _run(code, 0), _run(code, 64)
        print(f"| {name} | {a:.2f} {unit} | {b:.2f} {unit} | {b / a:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m perf.cold_flush``: defer's cold flushes run op by op (``lazyrt._exec.coldflush``)
against compiling every new trace, on a proxy of PyTorch's OpInfo device tests.

The proxy is what ``test_binary_ufuncs.py``/``test_unary_ufuncs.py`` do per test: each
ufunc of ``torch.testing``'s OpInfo database (every ``--step``-th), in a few dtypes, its first
sample inputs run on tpu and compared with CPU's result by ``TestCase.assertEqual``, whose
``isclose`` runs on the device. Each row runs in a fresh process with no disk cache
(``LAZYRT_CACHE_DIR=off``), the three rows of a family at once, so they share the load:

    python -m perf.cold_flush [--family binary,unary] [--step 3]

Columns: wall seconds of the sweep, programs compiled (``cache_misses``), flushes run op
by op (``cold_flushes``), cases that failed (the same in every row, or a row is wrong).
Rows: defer with ``LAZYRT_HOST_EVAL=0`` (every flush compiled: lazyrt before cold flushes),
defer, and strict (host runs on), side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PROXY = r"""
import json, sys, time
import torch
import lazyrt
from torch.testing._internal.common_methods_invocations import binary_ufuncs, unary_ufuncs
from torch.testing._internal.common_utils import TestCase

family, step = sys.argv[1], int(sys.argv[2])
ops = binary_ufuncs if family == "binary" else unary_ufuncs
dtypes = (torch.float32, torch.int64, torch.float64, torch.bfloat16, torch.int32, torch.bool)
tc = TestCase()
on_tpu = lambda t: t.to("tpu") if isinstance(t, torch.Tensor) else t
t0 = time.perf_counter()
n = failed = 0
for op in ops[::step]:
    for dt in dtypes:
        if dt not in op.supported_dtypes("cpu"):
            continue
        try:
            samples = list(op.sample_inputs("cpu", dt))[:6]
        except Exception:
            continue
        for s in samples:
            try:
                expected = op(s.input, *s.args, **s.kwargs)
            except Exception:
                continue
            n += 1
            st = s.transform(on_tpu)
            try:
                got = op(st.input, *st.args, **st.kwargs)
                tc.assertEqual(got, on_tpu(expected), exact_device=False)
            except Exception:
                failed += 1
c = lazyrt.metrics.counters()
print(json.dumps({"seconds": time.perf_counter() - t0, "cases": n, "failed": failed,
                  "compiles": c["cache_misses"], "cold_flushes": c["cold_flushes"],
                  "host_runs": c["host_runs"]}))
"""

ROWS = (("defer, every flush compiled", "defer", {"LAZYRT_HOST_EVAL": "0"}),
        ("defer", "defer", {}),
        ("strict", "strict", {}))


def start_proxy(code: str, argv: list, mode: str, extra: dict) -> subprocess.Popen:
    """``code`` run in a fresh process on the CPU platform in ``mode``, with no disk cache
    (``perf.flat_draws`` uses it too); its last stdout line is its JSON result."""
    env = dict(os.environ, TORCH_TPU_MODE=mode, LAZYRT_CACHE_DIR="off", JAX_PLATFORMS="cpu",
               **extra)
    env["PYTHONPATH"] = _ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen([sys.executable, "-c", code, *map(str, argv)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def proxy_result(p: subprocess.Popen) -> dict:
    out, err = p.communicate()
    if p.returncode:
        raise RuntimeError(f"proxy failed (exit {p.returncode}):\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", default="binary,unary")
    ap.add_argument("--step", type=int, default=3, help="every k-th OpInfo of the family")
    a = ap.parse_args(argv)
    print(f"load avg {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores; --step {a.step}")
    print("| family | row | s | ratio to first row | compiles | cold flushes | cases | failed |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for family in a.family.split(","):
        procs = [(label, start_proxy(_PROXY, [family, a.step], mode, extra))
                 for label, mode, extra in ROWS]
        base = None
        for label, p in procs:
            r = proxy_result(p)
            base = base or r["seconds"]
            print(f"| {family} | {label} | {r['seconds']:.1f} | {r['seconds'] / base:.2f} | "
                  f"{r['compiles']} | {r['cold_flushes']} | {r['cases']} | {r['failed']} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

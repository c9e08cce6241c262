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

``--compile``: the XLA compile seconds of one draw program per shape, made as
``jax.random`` makes it (an iota per dimension) and as lazyrt's lowering makes it (over
the flat shape, reshaped: ``lazyrt.lowering.random_ops._flat``), alternated in one
process, each the median of ``--reps`` compiles from cleared caches; and whether the
two gave the same bits.
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

COMPILE_SHAPES = ((4096,), (32, 512), (4, 8, 16), (8, 128, 64), (2, 3, 4, 5, 6),
                  (5, 2, 3, 1, 4, 5, 3, 2, 1, 2, 3, 4))


def _draw(f, shape, args, key):
    return f(key, shape, *args)


def _compile_rows(reps: int) -> None:
    import functools
    import statistics
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np

    import lazyrt  # noqa: F401  (its JAX configuration)
    from lazyrt.lowering.random_ops import _random

    jax.config.update("jax_enable_x64", True)  # (lazyrt's int64)
    key = jax.random.key(0)
    draws = (("uniform f32", "uniform", (jnp.float32,)), ("normal f32", "normal", (jnp.float32,)),
             ("randint i64", "randint", (-9, 10, jnp.int64)))
    print("| draw | shape | per dimension s | flat s | ratio | same bits |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, name, args in draws:
        for shape in COMPILE_SHAPES:
            fns = [functools.partial(_draw, getattr(mod, name), shape, args)
                   for mod in (jax.random, _random)]
            secs: list = [[], []]
            for _ in range(reps):
                for i, fn in enumerate(fns):
                    jax.clear_caches()
                    t0 = time.perf_counter()
                    jax.jit(fn).lower(key).compile()
                    secs[i].append(time.perf_counter() - t0)
            same = np.array_equal(np.asarray(jax.jit(fns[0])(key)), np.asarray(jax.jit(fns[1])(key)))
            a, b = statistics.median(secs[0]), statistics.median(secs[1])
            print(f"| {label} | {shape} | {a:.3f} | {b:.3f} | {b / a:.2f} | {same} |", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", type=int, default=30)
    ap.add_argument("--mode", default="strict")
    ap.add_argument("--compile", action="store_true", help="compile seconds of one draw per shape")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    if a.compile:
        print(f"load avg {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores")
        _compile_rows(a.reps)
        return 0
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

"""The first tier's compile options against XLA's defaults, on the programs a first step
really compiles.

    python -m perf.tier_options [--row gpt_train] [--mode strict|defer] [--max N]

Runs one ``perf.first_calls`` row's first step in this process (``LAZYRT_COMPILE=full``, no
disk cache) and keeps every program lazyrt compiles (``_xla.compile_program``), then
compiles each again, once with lazyrt's full options, once with the first tier's
(``_xla.FIRST_TIER``) and once with XLA:CPU's fusion emitters off, and reports per option
set: CPU seconds compiling (process time, so other load on the machine counts little),
the programs' run time (best of 3, summed),
and how many programs' outputs differ bit for bit from the full build (with the largest
relative difference).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ["LAZYRT_CACHE_DIR"] = "off"
os.environ["LAZYRT_COMPILE"] = "full"


def _copy(x):
    import jax
    import jax.numpy as jnp
    import numpy as np

    if isinstance(x, jax.Array):
        return jnp.array(x, copy=True)
    if isinstance(x, jax.ShapeDtypeStruct):  # a flush's scalar slots
        return jnp.asarray(np.full(x.shape, 0.5, x.dtype))
    if isinstance(x, (list, tuple)):
        return type(x)(_copy(y) for y in x)
    return x


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.tier_options",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--row", default="gpt_train")
    ap.add_argument("--mode", default="strict", choices=("strict", "defer"))
    ap.add_argument("--max", type=int, default=10**9, help="compare the first N programs")
    a = ap.parse_args(argv)

    import jax
    import numpy as np

    import lazyrt
    from lazyrt._exec import lean as _lean
    from lazyrt._exec import xla as _xla
    from perf.first_calls import BUILDERS

    lazyrt.set_mode(a.mode)
    progs = []
    real = _xla.compile_program

    def keep(fn, args, donate_argnums=(), lean=False, tiered=False, **kw):
        with jax.enable_x64(True):
            progs.append((fn, _copy(list(args)), lean, kw.get("kind", "op")))
        return real(fn, args, donate_argnums, lean, tiered, **kw)

    _xla.compile_program = keep
    try:
        BUILDERS[a.row]("tpu").step()
        lazyrt.sync()
    finally:
        _xla.compile_program = real
    progs = progs[:a.max]
    sets = {"full": None, "first tier": _xla.FIRST_TIER,
            # XLA:CPU's legacy LLVM IR emitters instead of its fusion (MLIR) emitters
            "no fusion emitters": {"xla_cpu_use_fusion_emitters": False}}
    res = {k: {"compile": 0.0, "run": 0.0, "differ": 0, "maxrel": 0.0} for k in sets}
    for fn, args, lean, kind in progs:
        ref = None
        with jax.enable_x64(True):
            jitted = jax.jit(fn)
            lowered = _lean.lower(jitted, tuple(args)) if lean else jitted.lower(*args)
            opts = _xla.full_options(lowered.as_text(), kind)
            for name, extra in sets.items():
                jax.clear_caches()  # (the step compiled the full build once already)
                t0 = time.process_time()
                exe = lowered.compile(compiler_options={**opts, **(extra or {})})
                res[name]["compile"] += time.process_time() - t0
                out = jax.block_until_ready(exe(*args))
                best = float("inf")
                for _ in range(3):
                    t0 = time.perf_counter()
                    jax.block_until_ready(exe(*args))
                    best = min(best, time.perf_counter() - t0)
                res[name]["run"] += best
                flat = [np.asarray(x) for x in jax.tree.leaves(out)]
                if ref is None:
                    ref = flat
                    continue
                for x, r in zip(flat, ref):
                    if x.tobytes() != r.tobytes():
                        res[name]["differ"] += 1
                        if x.dtype.kind == "f":
                            d = np.abs(x.astype(np.float64) - r) / np.maximum(np.abs(r), 1e-30)
                            d = d[np.isfinite(d)]
                            if d.size:
                                res[name]["maxrel"] = max(res[name]["maxrel"], float(d.max()))
                        break
    print(f"{a.row} {a.mode}: {len(progs)} programs; load avg {os.getloadavg()[0]:.1f}")
    print("| options | CPU s compiling | run ms (sum) | programs differing from full |")
    print("|---|---|---|---|")
    for name, v in res.items():
        diff = "-" if name == "full" else f"{v['differ']} (max rel. {v['maxrel']:.1e})"
        print(f"| {name} | {v['compile']:.2f} | {1000 * v['run']:.1f} | {diff} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

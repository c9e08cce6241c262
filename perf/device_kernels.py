"""The Pallas kernels (``kernels_pallas``) checked against their references and timed:
``perf.device``'s kernels section, run in its own process.

    python -m perf.device_kernels [--dry-run] [--json FILE] [--budget SECONDS]

On a GPU or TPU the kernels are compiled for real (``interpret=False``); with ``--dry-run``
(or on a CPU) they run in Pallas interpret mode at tiny sizes, which checks the code path
and the values but says nothing about speed. Each case is a forward and a backward (one
``jax.vjp`` under one ``jit``) compared with the ``*_reference`` run in float32; one case
failing (an error or a value off) is reported and the rest still run. Cases run in order
of importance; one is started only while ``--budget`` seconds have not run out, and the
JSON is rewritten after each, so a caller that kills this process at its own cap still
reads every finished case. Half-precision attention cases are also timed through XLA's
cuDNN attention (``jax.nn.dot_product_attention(implementation="cudnn")``) where a GPU
has it: the numbers ``lazyrt._base.backend_choices``' "Pallas routing" rows need.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
import traceback

# NOTE: run from anywhere: the repository root (kernels_pallas) importable.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (name, batch, q heads, kv heads, q len, kv len, head dim, causal, dtype)
ATTENTION = [
    ("fwd+bwd", 4, 16, 16, 1024, 1024, 64, False, "bfloat16"),
    ("fwd+bwd causal", 4, 16, 16, 2048, 2048, 64, True, "bfloat16"),
    ("fwd+bwd causal GQA 32/8", 2, 32, 8, 2048, 2048, 128, True, "bfloat16"),
    ("fwd+bwd causal odd lengths", 2, 8, 8, 1000, 1531, 64, True, "bfloat16"),
    ("fwd+bwd GQA odd lengths", 2, 8, 2, 333, 777, 64, False, "float32"),
    ("fwd+bwd causal f32", 2, 16, 16, 1024, 1024, 64, True, "float32"),
]
ATTENTION_DRY = [
    ("fwd+bwd causal GQA 4/2 odd lengths", 1, 4, 2, 37, 53, 16, True, "float32"),
]
# (name, m, k, n, activation, bias, dtype)
MATMUL = [
    ("matmul", 4096, 4096, 4096, None, False, "bfloat16"),
    ("matmul+bias+gelu", 8192, 1024, 4096, "gelu", True, "bfloat16"),
    ("matmul f32", 2048, 2048, 2048, None, False, "float32"),
    ("matmul odd sizes", 1000, 777, 1531, None, True, "float32"),
]
MATMUL_DRY = [("matmul odd sizes +bias+gelu", 37, 53, 29, "gelu", True, "float32")]
# Largest |kernel - reference| allowed, relative to the reference's largest |value|.
TOL = {"float32": 1e-2, "bfloat16": 5e-2, "float16": 5e-2}


def _median_ms(fn, runs: int) -> float:
    import jax

    jax.block_until_ready(fn())  # compile
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)


def _rel_err(got, want) -> float:
    import jax
    import jax.numpy as jnp

    worst = 0.0
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        g, w = g.astype(jnp.float32), w.astype(jnp.float32)
        if not bool(jnp.all(jnp.isfinite(g))):
            return float("inf")
        scale = max(float(jnp.max(jnp.abs(w))), 1e-6)
        worst = max(worst, float(jnp.max(jnp.abs(g - w))) / scale)
    return worst


def check_attention(case, interpret: bool, runs: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import kernels_pallas as kp

    name, b, h, kvh, tq, tk, d, causal, dtype = case
    rng = np.random.default_rng(0)
    dt = jnp.dtype(dtype)

    def rand(*shape):
        return jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(dt)

    q, k, v, do = rand(b, h, tq, d), rand(b, kvh, tk, d), rand(b, kvh, tk, d), rand(b, h, tq, d)

    def vjp(fn, *xs):
        out, back = jax.vjp(lambda q, k, v: fn(q, k, v, causal=causal), *xs)
        return (out, *back(do.astype(out.dtype)))

    kern = jax.jit(lambda q, k, v: vjp(functools.partial(kp.flash_attention,
                                                         interpret=interpret), q, k, v))
    f32 = lambda x: x.astype(jnp.float32)
    ref = jax.jit(lambda q, k, v: vjp(kp.flash_attention_reference, f32(q), f32(k), f32(v)))
    xla = jax.jit(lambda q, k, v: vjp(kp.flash_attention_reference, q, k, v))
    err = _rel_err(kern(q, k, v), ref(q, k, v))
    row = {"kernel": "flash_attention", "case": name, "dtype": dtype,
           "shape": f"b{b} h{h}/{kvh} q{tq} kv{tk} d{d}{' causal' if causal else ''}",
           "max_rel_err": err, "tol": TOL[dtype], "ok": err <= TOL[dtype]}
    row["kernel_ms"] = _median_ms(lambda: kern(q, k, v), runs)
    row["xla_ms"] = _median_ms(lambda: xla(q, k, v), runs)
    if not interpret and jax.default_backend() == "gpu" and dtype != "float32" and tq == tk:
        row.update(_cudnn(q, k, v, do, causal, ref(q, k, v), runs))
    return row


def _cudnn(q, k, v, do, causal: bool, want, runs: int) -> dict:
    """XLA's cuDNN attention on the same call (fwd+bwd, [B, L, H, E] layout inside)."""
    import jax
    import jax.numpy as jnp

    t = lambda x: jnp.swapaxes(x, 1, 2)

    def f(q, k, v):
        out, back = jax.vjp(lambda q, k, v: t(jax.nn.dot_product_attention(
            t(q), t(k), t(v), is_causal=causal, implementation="cudnn")), q, k, v)
        return (out, *back(do.astype(out.dtype)))

    try:
        fn = jax.jit(f)
        err = _rel_err(fn(q, k, v), want)
        return {"cudnn_ms": _median_ms(lambda: fn(q, k, v), runs), "cudnn_rel_err": err}
    except Exception as e:  # cuDNN missing or refusing the shape: reported, not fatal
        return {"cudnn_error": f"{type(e).__name__}: {e}"[:300]}


def check_matmul(case, interpret: bool, runs: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import kernels_pallas as kp

    name, m, k, n, act, has_bias, dtype = case
    rng = np.random.default_rng(1)
    dt = jnp.dtype(dtype)
    a = jnp.asarray(rng.standard_normal((m, k)), jnp.float32).astype(dt)
    b = jnp.asarray(rng.standard_normal((k, n)), jnp.float32).astype(dt)
    bias = jnp.asarray(rng.standard_normal((n,)), jnp.float32).astype(dt) if has_bias else None
    g = jnp.asarray(rng.standard_normal((m, n)), jnp.float32).astype(dt)

    def vjp(fn, a, b, bias):
        out, back = jax.vjp(lambda a, b, bias: fn(a, b, bias=bias, activation=act), a, b, bias)
        return (out, *back(g.astype(out.dtype)))

    kern = jax.jit(lambda a, b, bias: vjp(functools.partial(kp.matmul, interpret=interpret),
                                          a, b, bias))
    f32 = lambda x: None if x is None else x.astype(jnp.float32)
    ref = jax.jit(lambda a, b, bias: vjp(kp.matmul_reference, f32(a), f32(b), f32(bias)))
    xla = jax.jit(lambda a, b, bias: vjp(kp.matmul_reference, a, b, bias))
    err = _rel_err(kern(a, b, bias), ref(a, b, bias))
    row = {"kernel": "matmul", "case": name, "dtype": dtype, "shape": f"{m}x{k} @ {k}x{n}",
           "max_rel_err": err, "tol": TOL[dtype], "ok": err <= TOL[dtype]}
    row["kernel_ms"] = _median_ms(lambda: kern(a, b, bias), runs)
    row["xla_ms"] = _median_ms(lambda: xla(a, b, bias), runs)
    return row


def run(dry: bool, budget: float | None = None, path: str | None = None) -> dict:
    """Every case while ``budget`` seconds last (None: all), in order; ``path``: the JSON
    rewritten after each case."""
    import jax

    import kernels_pallas as kp
    from kernels_pallas._common import gpu_backend

    t_end = None if budget is None else time.monotonic() + budget
    interpret = dry or kp.default_interpret()
    runs = 2 if interpret else 20
    res = {"backend": jax.default_backend(), "interpret": interpret,
           "gpu_pallas_backend": gpu_backend() if jax.default_backend() == "gpu" else None,
           "note": "interpret mode: values checked, timings not meaningful" if interpret
           else "compiled kernels", "rows": [], "ok": False}
    # (in order of importance: what lazyrt's GPT rows and the routing table need first)
    cases = ([(check_attention, c) for c in (ATTENTION_DRY if interpret else ATTENTION)]
             + [(check_matmul, c) for c in (MATMUL_DRY if interpret else MATMUL)])
    if not interpret:
        cases = [cases[1], cases[len(ATTENTION)], cases[2], cases[len(ATTENTION) + 2],
                 *[c for i, c in enumerate(cases) if i not in (1, 2, len(ATTENTION),
                                                               len(ATTENTION) + 2)]]

    def save():
        if path:
            with open(path, "w") as f:
                json.dump(res, f)

    for fn, case in cases:
        if t_end is not None and time.monotonic() > t_end:
            res["rows"].append({"kernel": fn.__name__[6:], "case": case[0], "ok": None,
                                "skipped": "kernels' time budget spent"})
            continue
        t0 = time.perf_counter()
        try:
            row = fn(case, interpret, runs)
        except Exception as e:  # one case failing never stops the others
            row = {"kernel": fn.__name__[6:], "case": case[0], "ok": False,
                   "error": f"{type(e).__name__}: {e}"[:1000],
                   "traceback": traceback.format_exc()[-3000:]}
        row["seconds"] = round(time.perf_counter() - t0, 2)
        res["rows"].append(row)
        print(f"  {row['kernel']} {row['case']}: {'ok' if row['ok'] else 'FAILED'} "
              f"({row['seconds']} s)", file=sys.stderr, flush=True)
        res["ok"] = all(r["ok"] is not False for r in res["rows"])
        save()
    res["ok"] = all(r["ok"] is not False for r in res["rows"])
    save()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.device_kernels")
    ap.add_argument("--dry-run", action="store_true", help="interpret mode, tiny sizes")
    ap.add_argument("--json", default="-")
    ap.add_argument("--budget", type=float, default=None,
                    help="start no case after this many seconds")
    a = ap.parse_args(argv)
    res = run(a.dry_run, a.budget, None if a.json == "-" else a.json)
    if a.json == "-":
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

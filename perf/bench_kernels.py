"""Time the Pallas kernels against XLA's own path (the jnp references under jit).

    python -m perf.bench_kernels [--json FILE] [--runs N] [--warmup N]   (from the repository root)

Cases: attention forward, attention forward+backward, matmul (+ fused bias/GELU).
Each timing is the median of ``--runs`` calls after ``--warmup`` calls (the first of which
compiles), every call ended with ``block_until_ready``. On CPU the kernels run in Pallas
interpret mode, so the shapes are tiny and the timings are labelled as not meaningful:
the run only checks that everything executes and agrees with the reference.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import kernels_pallas as kp

CPU_NOTE = "interpret mode — not meaningful"


@dataclasses.dataclass
class Result:
    name: str
    shape: str
    dtype: str
    kernel_ms: float
    xla_ms: float
    max_abs_err: float

    @property
    def speedup(self) -> float:
        return self.xla_ms / self.kernel_ms if self.kernel_ms > 0 else float("nan")


def _median_ms(fn: Callable[[], Any], runs: int, warmup: int) -> float:
    for _ in range(max(1, warmup)):
        jax.block_until_ready(fn())
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _max_err(a: Any, b: Any) -> float:
    leaves = zip(jax.tree.leaves(a), jax.tree.leaves(b))
    return max(float(jnp.max(jnp.abs(x.astype(jnp.float32) - y.astype(jnp.float32))))
               for x, y in leaves)


_ATTN_KEYS = ("b", "h", "kvh", "q", "kv", "d", "causal", "dtype")
_MATMUL_KEYS = ("m", "k", "n", "activation", "bias", "dtype")


def _attention_cases(tiny: bool) -> list[dict[str, Any]]:
    rows = [
        (1, 2, 2, 64, 64, 16, False, "float32"),
        (1, 4, 2, 64, 64, 32, True, "float32"),
    ] if tiny else [
        (4, 16, 16, 1024, 1024, 64, False, "bfloat16"),
        (4, 16, 16, 2048, 2048, 64, True, "bfloat16"),
        (2, 32, 8, 2048, 2048, 128, True, "bfloat16"),  # GQA
        (2, 16, 16, 1024, 1024, 64, True, "float32"),
    ]
    return [dict(zip(_ATTN_KEYS, row, strict=True)) for row in rows]


def _matmul_cases(tiny: bool) -> list[dict[str, Any]]:
    rows = [
        (64, 64, 64, None, False, "float32"),
        (96, 64, 128, "gelu", True, "float32"),
    ] if tiny else [
        (4096, 4096, 4096, None, False, "bfloat16"),
        (8192, 1024, 4096, "gelu", True, "bfloat16"),  # MLP up-projection
        (2048, 2048, 2048, None, False, "float32"),
    ]
    return [dict(zip(_MATMUL_KEYS, row, strict=True)) for row in rows]


def bench_attention(case: dict[str, Any], runs: int, warmup: int) -> list[Result]:
    rng = np.random.default_rng(0)
    dt = jnp.dtype(case["dtype"])

    def rand(*shape):
        return jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(dt)

    q = rand(case["b"], case["h"], case["q"], case["d"])
    k = rand(case["b"], case["kvh"], case["kv"], case["d"])
    v = rand(case["b"], case["kvh"], case["kv"], case["d"])
    causal = case["causal"]
    kernel = jax.jit(lambda q, k, v: kp.flash_attention(q, k, v, causal=causal))
    xla = jax.jit(lambda q, k, v: kp.flash_attention_reference(q, k, v, causal=causal))

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v, causal=causal).astype(jnp.float32) ** 2)

    kernel_grad = jax.jit(jax.grad(loss(kp.flash_attention), argnums=(0, 1, 2)))
    xla_grad = jax.jit(jax.grad(loss(kp.flash_attention_reference), argnums=(0, 1, 2)))
    shape = (f"b{case['b']} h{case['h']}/{case['kvh']} q{case['q']} kv{case['kv']} "
             f"d{case['d']}{' causal' if causal else ''}")
    results = []
    for name, kfn, xfn in (("attention fwd", kernel, xla),
                           ("attention fwd+bwd", kernel_grad, xla_grad)):
        results.append(Result(
            name=name, shape=shape, dtype=case["dtype"],
            kernel_ms=_median_ms(functools.partial(kfn, q, k, v), runs, warmup),
            xla_ms=_median_ms(functools.partial(xfn, q, k, v), runs, warmup),
            max_abs_err=_max_err(kfn(q, k, v), xfn(q, k, v)),
        ))
    return results


def bench_matmul(case: dict[str, Any], runs: int, warmup: int) -> list[Result]:
    rng = np.random.default_rng(0)
    dt = jnp.dtype(case["dtype"])
    a = jnp.asarray(rng.standard_normal((case["m"], case["k"])), jnp.float32).astype(dt)
    b = jnp.asarray(rng.standard_normal((case["k"], case["n"])), jnp.float32).astype(dt)
    bias = jnp.asarray(rng.standard_normal((case["n"],)), dt) if case["bias"] else None
    act = case["activation"]
    kernel = jax.jit(lambda a, b, bias: kp.matmul(a, b, bias=bias, activation=act))
    xla = jax.jit(lambda a, b, bias: kp.matmul_reference(a, b, bias=bias, activation=act))
    epilogue = "+".join(x for x in ("bias" if case["bias"] else "", act or "") if x)
    return [Result(
        name=f"matmul{' ' + epilogue if epilogue else ''}",
        shape=f"{case['m']}x{case['k']} @ {case['k']}x{case['n']}",
        dtype=case["dtype"],
        kernel_ms=_median_ms(lambda: kernel(a, b, bias), runs, warmup),
        xla_ms=_median_ms(lambda: xla(a, b, bias), runs, warmup),
        max_abs_err=_max_err(kernel(a, b, bias), xla(a, b, bias)),
    )]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--runs", type=int, default=None, help="timed runs per case")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs (compile) per case")
    args = parser.parse_args(argv)

    backend = jax.default_backend()
    interpret = kp.default_interpret()
    runs = args.runs if args.runs is not None else (3 if interpret else 20)
    note = CPU_NOTE if interpret else "compiled"
    print(f"backend={backend} devices={jax.devices()} jax={jax.__version__} ({note})")

    results: list[Result] = []
    for case in _attention_cases(tiny=interpret):
        results += bench_attention(case, runs, args.warmup)
    for case in _matmul_cases(tiny=interpret):
        results += bench_matmul(case, runs, args.warmup)

    header = (f"{'case':<22} {'shape':<34} {'dtype':<9} {'kernel ms':>10} {'xla ms':>10} "
              f"{'xla/kernel':>10} {'max err':>9}")
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r.name:<22} {r.shape:<34} {r.dtype:<9} {r.kernel_ms:>10.3f} "
              f"{r.xla_ms:>10.3f} {r.speedup:>10.2f} {r.max_abs_err:>9.2e}")
    if interpret:
        print(f"NOTE: {CPU_NOTE}: the kernels ran in Pallas interpret mode on CPU; "
              "these timings say nothing about kernel performance.")

    if args.json:
        payload = {
            "backend": backend,
            "jax_version": jax.__version__,
            "interpret": interpret,
            "note": note,
            "runs": runs,
            "warmup": args.warmup,
            "results": [dict(dataclasses.asdict(r), speedup=r.speedup) for r in results],
        }
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The performance targets (from the issues; #13 on the CPU backend), in one place.

``python -m perf`` reports each against its measurement (``suite.check_bars``),
``python -m perf.compile_time`` the compile ones; they are never asserted by tests (timing
on a shared machine is not a test). ``python -m perf.targets`` prints the table that
perf/README.md shows (``tests/test_perf_quick.py`` checks that it is the same).
"""
from __future__ import annotations

# defer at least this much faster than strict (median ms/step; attention: every shape)
SPEEDUP_VS_STRICT = {"default": 1.5, "adamw_many": 2.0, "tiny_ops": 2.0}
# defer's step at most this factor times the plain-JAX whole step (``jax`` mode)
VS_JAX = {"mlp_train": 1.3, "gpt_train": 1.3}
# tiny_ops, per op: mode <= factor * floor
VS_FLOOR = {"defer": ("floor_dispatch", 2.0), "strict": ("floor_jit", 2.0)}
# defer's HBM peak at most this factor times strict's (every workload)
HBM_DEFER_VS_STRICT = 1.0
# training workloads after warm-up: defer's cache misses and flushes per step
TRAINING_MISSES, TRAINING_FLUSHES = 0, 1
# compile_time: lazyrt's step-1 compile (trace + lower + XLA) over plain JAX's lower +
# compile of the same step, and defer's peak RSS over strict's
COMPILE_VS_JAX = 2.0
RSS_DEFER_VS_STRICT = 1.5


def rows() -> list[tuple[str, str]]:
    """(what, target), as perf/README.md's table shows them."""
    out = [(f"defer vs strict, ms/step ({w})" if w != "default" else
            "defer vs strict, ms/step (other workloads; attention: every shape)", f">= {t}x")
           for w, t in sorted(SPEEDUP_VS_STRICT.items(), key=lambda kv: kv[0] == "default")]
    out += [(f"{w}: defer / plain-JAX whole step", f"<= {t}") for w, t in VS_JAX.items()]
    out += [(f"tiny_ops: {m} per op / {f}", f"<= {t}") for m, (f, t) in VS_FLOOR.items()]
    out += [("HBM peak defer / strict (every workload)", f"<= {HBM_DEFER_VS_STRICT:g}"),
            ("training workloads: defer cache misses after warm-up / flushes per step",
             f"{TRAINING_MISSES} / {TRAINING_FLUSHES}"),
            ("compile_time: step-1 compile defer / plain JAX", f"<= {COMPILE_VS_JAX:g}x"),
            ("compile_time: peak RSS defer / strict", f"<= {RSS_DEFER_VS_STRICT:g}x")]
    return out


def table() -> str:
    lines = ["| target | bar |", "| --- | --- |"]
    lines += [f"| {what} | {bar} |" for what, bar in rows()]
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())

"""Run ONE (workload, mode) and report it as JSON. ``python -m perf`` starts one of these per
row in a fresh subprocess, so compile caches, counters and memory peaks never leak between
rows.

    python -m perf._worker --workload W [--variant V] --mode strict|defer|cpu \
        --steps N --warmup K --json FILE|-

Protocol: step 1 (compiles; its time and the compile seconds it took are reported
separately), then warm-up steps until ``warmup`` steps have run, then ``steps`` timed steps.
Counters (cache hits/misses, flushes) and the HBM peak are measured over the timed steps only.
Losses come from the steps themselves; for workloads without a loss, a checksum of the state
(``probe``) is read after each warm-up step, outside the timed window.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import traceback

# mode -> lazyrt mode underneath torch.compile
COMPILED = {"compiled": "defer", "compiled_step": "defer"}
# Reference modes that run without lazyrt: plain PyTorch CPU eager, the plain-JAX
# whole-step jit (``jax_floor``), and tiny_ops' per-op floors (``workloads.TinyOps``).
REFERENCE = ("cpu", "jax", "floor_dispatch", "floor_jit")


def lazyrt_mode(mode: str) -> tuple[str, int | None]:
    """The lazyrt mode a perf mode runs in, and its fusion window (``defer_w16``: defer
    with ``LAZYRT_FUSION_WINDOW=16``; None: lazyrt's default)."""
    if mode.startswith("defer_w") and mode[7:].isdigit():
        return "defer", int(mode[7:])
    return COMPILED.get(mode, mode), None


def _run_jax_floor(workload: str, steps: int, warmup: int, variant: str | None) -> dict:
    from . import jax_floor

    if workload not in jax_floor.FLOORS:
        raise ValueError(f"{workload}: no plain-JAX floor (only {sorted(jax_floor.FLOORS)})")
    ms, steps_ms, losses = jax_floor.run(workload, steps, warmup, per_step=True,
                                         variant=variant)
    return {"workload": workload, "mode": "jax", "device": "jax", "steps": steps,
            "warmup": warmup, "median_ms": ms, "step_ms": steps_ms, "min_ms": min(steps_ms),
            "losses": [], "jax_losses": losses[:8], "ok": True,
            "description": "the same step in plain JAX, jitted whole"}


def _counters():
    import lazyrt

    c = lazyrt.metrics.counters()
    return {k: v for k, v in c.items() if isinstance(v, (int, float))}


def _diff(after: dict, before: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in after}


def run(workload: str, mode: str, steps: int, warmup: int, variant: str | None = None,
        threads: int | None = None, after=None) -> dict:
    """``after(workload)``: called after the timed steps (``perf.device`` profiles a few
    more steps there)."""
    import torch

    if threads:
        torch.set_num_threads(threads)

    from .workloads import WORKLOADS

    if mode == "jax":
        return _run_jax_floor(workload, steps, warmup, variant)
    device = "cpu" if mode in REFERENCE else "tpu"
    lazyrt = None
    base_mode, window = lazyrt_mode(mode)
    if device == "tpu":
        import lazyrt

        # compiled modes: torch.compile (the tpu backend) on top of DeferAndFuse
        lazyrt.set_mode(base_mode)
        if window is not None:
            lazyrt.config.fusion_window = window
    torch.manual_seed(0)

    res: dict = {"workload": workload, "variant": variant, "mode": mode, "device": device,
                 "steps": steps, "warmup": warmup, "torch_threads": torch.get_num_threads(),
                 "xla_flags": os.environ.get("XLA_FLAGS")}

    t0 = time.perf_counter()
    wl = WORKLOADS[workload](device, mode if device == "cpu" else base_mode, variant)
    if mode in COMPILED and not wl.compile(step=mode == "compiled_step"):
        raise ValueError(f"{workload}: nothing to compile")
    if lazyrt is not None:
        lazyrt.sync()
    res["setup_s"] = time.perf_counter() - t0
    res["description"] = wl.describe()
    res["ops_per_step"] = wl.ops_per_step

    losses: list = []

    def _record(out):
        if out is None:
            out = wl.probe()
        if out is not None:
            losses.append(float(out))

    # --- step 1: the compile step --------------------------------------------------------
    if lazyrt is not None:
        lazyrt.metrics.reset()
    t0 = time.perf_counter()
    out = wl.step()
    res["first_step_s"] = time.perf_counter() - t0
    if lazyrt is not None:
        c1 = _counters()
        res["first_step_compile_s"] = c1["compile_seconds"]
        res["first_step_cache_misses"] = c1["cache_misses"]
        res["first_step_flushes"] = c1["flushes"]
        res["first_step_ops_recorded"] = c1["ops_recorded"]
        res["first_step_ops_dispatched"] = c1["ops_dispatched"]
    _record(out)

    # --- warm-up ------------------------------------------------------------------------
    for _ in range(max(warmup - 1, 0)):
        _record(wl.step())

    # --- timed steps --------------------------------------------------------------------
    gc.collect()
    if lazyrt is not None:
        before = _counters()
        torch.tpu.reset_peak_memory_stats()
    times, host, wait, proc = [], [], [], []
    counters = lazyrt.metrics.COUNTERS if lazyrt is not None else {"wait_seconds": 0.0}
    for _ in range(steps):
        h0, p0 = time.thread_time(), time.process_time()
        w0 = counters["wait_seconds"]
        t0 = time.perf_counter()
        out = wl.step()
        times.append(time.perf_counter() - t0)
        host.append(time.thread_time() - h0)
        proc.append(time.process_time() - p0)
        wait.append(counters["wait_seconds"] - w0)
        if out is not None:
            losses.append(float(out))
    if lazyrt is not None:
        res["hbm_peak_bytes"] = int(torch.tpu.max_memory_allocated())
        d = _diff(_counters(), before)
        hits, misses = d["cache_hits"], d["cache_misses"]
        res["counters_timed"] = d
        res["cache_hits_after_warmup"] = hits
        res["cache_misses_after_warmup"] = misses
        res["cache_hit_rate_after_warmup"] = hits / (hits + misses) if hits + misses else None
        res["flushes_per_step"] = d["flushes"] / steps
        res["executions_per_step"] = d["executions"] / steps
        res["ops_recorded_per_step"] = d["ops_recorded"] / steps
        res["ops_dispatched_per_step"] = d["ops_dispatched"] / steps
        res["compile_s_after_warmup"] = d["compile_seconds"]
        res["cpu_fallbacks"] = d["cpu_fallbacks"]
    ms = [t * 1e3 for t in times]
    res["step_ms"] = ms
    res["median_ms"] = statistics.median(ms)
    # CPU time of the Python thread that issues the step (XLA runs on its own threads):
    # what an accelerator host spends per step.
    res["host_ms"] = statistics.median(h * 1e3 for h in host)
    # CPU time of the whole process (XLA's threads too): on a loaded machine, the figure
    # least disturbed by waiting for a core.
    res["process_cpu_ms"] = statistics.median(p * 1e3 for p in proc)
    if lazyrt is not None:
        # Time the host sat blocked on device results (``loss.item()``, ``lazyrt.sync()``),
        # and the rest of the step: issuing it (recording, dispatch, flush bookkeeping).
        res["wait_ms"] = statistics.median(w * 1e3 for w in wait)
        res["issue_ms"] = statistics.median((t - w) * 1e3 for t, w in zip(times, wait))
    res["min_ms"] = min(ms)
    if wl.ops_per_step:
        res["us_per_op"] = res["median_ms"] * 1e3 / wl.ops_per_step
    res["losses"] = losses[:8]
    if after is not None:
        after(wl)
    final = wl.probe()
    res["final_checksum"] = None if final is None else float(final)
    res["ok"] = True
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf._worker")
    ap.add_argument("--workload", required=True)
    ap.add_argument("--variant", default=None)
    ap.add_argument("--mode", required=True,
                    help="strict, defer, defer_wN (fusion window N), compiled, compiled_step, "
                         "or a reference: " + ", ".join(REFERENCE))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default="-")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads (the parent also sets XLA's CPU threading)")
    a = ap.parse_args(argv)
    try:
        res = run(a.workload, a.mode, a.steps, max(a.warmup, 1), a.variant, a.threads)
    except Exception as e:
        res = {"workload": a.workload, "variant": a.variant, "mode": a.mode, "ok": False,
               "error": f"{type(e).__name__}: {e}"[:2000],
               "traceback": traceback.format_exc()[-6000:]}
    text = json.dumps(res)
    if a.json == "-":
        sys.stdout.write(text + "\n")
    else:
        with open(a.json, "w") as f:
            f.write(text)
    sys.stdout.flush()
    # Skip interpreter teardown (JAX/XLA thread pools can take a while to wind down).
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())

"""Smoke test of the perf suite: ``python -m perf --quick`` on two workloads.

Checks the JSON schema and that strict, defer and CPU eager agree on the losses of the first
steps. Never checks timings (they depend on the machine and its load).
"""
from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = ["ew_chain", "mlp_train"]
MODES = ["strict", "defer", "compiled", "cpu"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("perf") / "perf.json"
    env = dict(os.environ)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.pop("TORCH_TPU_MODE", None)
    cmd = [sys.executable, "-m", "perf", "--quick", "--only", ",".join(WORKLOADS),
           "--steps", "2", "--warmup", "2", "--threads", "1", "--modes", ",".join(MODES),
           "--json", str(out)]
    p = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, f"python -m perf failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    assert "workload" in p.stdout  # the readable table was printed
    with open(out) as f:
        return json.load(f)


def _num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def test_machine_and_config(report):
    assert report["schema"] == "lazyrt-perf/1"
    m = report["machine"]
    for key in ("cpu_model", "cores", "jax_backend", "jax_version", "torch_version"):
        assert m.get(key) not in (None, ""), key
    assert report["config"]["modes"] == MODES
    assert report["config"]["workloads"] == WORKLOADS
    assert report["config"]["quick"] is True


def test_results_per_mode(report):
    res = report["results"]
    assert {(r["workload"], r["mode"]) for r in res} == {(w, m) for w in WORKLOADS for m in MODES}
    for r in res:
        assert r["ok"], r.get("error")
        assert len(r["step_ms"]) == report["config"]["steps"]
        assert _num(r["median_ms"]) and r["median_ms"] > 0
        assert r["losses"] and all(_num(x) for x in r["losses"])
        if r["mode"] == "cpu":
            assert "hbm_peak_bytes" not in r
            continue
        for key in ("hbm_peak_bytes", "first_step_compile_s", "cache_misses_after_warmup",
                    "flushes_per_step", "counters_timed"):
            assert key in r, key
        assert r["hbm_peak_bytes"] > 0
        assert r["first_step_compile_s"] > 0  # step 1 compiled something
        assert 0.0 <= r["cache_hit_rate_after_warmup"] <= 1.0


def test_summary_schema(report):
    summary = {s["label"]: s for s in report["summary"]}
    assert list(summary) == WORKLOADS
    for s in summary.values():
        for m in MODES:
            assert _num(s[f"{m}_ms"])
        assert _num(s["speedup_defer_vs_strict"]) and _num(s["speedup_defer_vs_cpu"])
        for m in ("strict", "defer"):
            for key in ("hbm_peak_bytes", "first_step_compile_s", "cache_hit_rate",
                        "cache_misses_after_warmup", "flushes_per_step"):
                assert f"{m}_{key}" in s, (m, key)
        assert s["errors"] == {}
    assert isinstance(report["bars"], list) and report["bars"]
    assert all(b["status"] in ("PASS", "MISS", "n/a", "info") for b in report["bars"])


@pytest.mark.parametrize("workload", WORKLOADS)
def test_losses_agree_across_modes(report, workload):
    by_mode = {r["mode"]: r["losses"] for r in report["results"] if r["workload"] == workload}
    ref = by_mode["cpu"]
    for m in ("strict", "defer"):
        got = by_mode[m]
        n = min(len(got), len(ref))
        assert n >= 2
        for a, b in zip(got[:n], ref[:n]):
            assert a == pytest.approx(b, rel=1e-3, abs=1e-5), (workload, m, got, ref)
    s = next(s for s in report["summary"] if s["label"] == workload)
    assert s["losses_agree"] is True



def test_combine_rounds_takes_median_of_round_medians():
    sys.path.insert(0, ROOT)
    from perf.suite import combine_rounds

    rounds = [{"ok": True, "median_ms": m, "step_ms": [m, m], "ops_per_step": 1000,
               "us_per_op": m, "hbm_peak_bytes": 7} for m in (3.0, 1.0, 2.0)]
    out = combine_rounds(rounds)
    assert out["median_ms"] == 2.0
    assert out["round_median_ms"] == [3.0, 1.0, 2.0]
    assert len(out["step_ms"]) == 6
    assert out["us_per_op"] == pytest.approx(2.0)
    assert out["hbm_peak_bytes"] == 7
    failed = {"ok": False, "error": "boom"}
    assert combine_rounds(rounds + [failed]) is failed
    assert combine_rounds(rounds[:1]) is rounds[0]


def test_jax_floor_mlp_trains():
    sys.path.insert(0, ROOT)
    from perf.jax_floor import run

    ms, losses = run("mlp_train", steps=2, warmup=2)
    assert _num(ms) and ms > 0
    assert len(losses) == 4 and all(_num(x) for x in losses)
    assert losses[-1] < losses[0]  # AdamW on a fixed batch: the loss goes down


def test_jax_floor_attention_matches_the_workload():
    # The attention floor has the suite's shapes and computes what the workload's loss
    # computes (SDPA, causal, (o * o).mean()) on the same numbers.
    sys.path.insert(0, ROOT)
    import jax.numpy as jnp
    import numpy as np
    import torch
    import torch.nn.functional as F

    from perf import jax_floor
    from perf.workloads import ATTENTION_SHAPES

    assert jax_floor.ATTENTION_SHAPES == ATTENTION_SHAPES
    assert set(jax_floor.FLOORS) >= {"mlp_train", "gpt_train", "gpt_infer", "attention"}
    from perf.suite import ONLY_FOR

    assert set(ONLY_FOR["jax"]) == set(jax_floor.FLOORS)  # the suite runs every floor
    for shape in [(1, 2, 8, 4), (1, 2, 200, 4)]:  # one block; 4 row blocks, the last short
        q, k, v = (np.random.default_rng(i).standard_normal(shape).astype(np.float32)
                   for i in range(3))
        o = F.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)), is_causal=True)
        got = jax_floor.attention_loss(*map(jnp.asarray, (q, k, v)))
        assert float(got) == pytest.approx(float((o * o).mean()), rel=1e-5)
    ms, losses = jax_floor.run("attention", steps=1, warmup=1, variant="b8h4s128d64")
    assert _num(ms) and len(losses) == 2 and losses[0] == losses[1]


def test_step_overhead_floor_backend_computes_what_cpu_does():
    # perf.step_overhead's "tpu floor" row is a real backend (CPU kernels under a tpu
    # wrapper tensor), or the floor it reports would mean nothing.
    import torch
    import torch.nn.functional as F
    from torch import nn

    from perf.step_overhead import _floor_type, _on_floor

    floor = _floor_type()
    torch.manual_seed(0)
    ref = nn.Linear(5, 3)
    x, y = torch.randn(4, 5), torch.randint(0, 3, (4,))
    model = _on_floor(copy.deepcopy(ref))
    opts = [torch.optim.AdamW(m.parameters(), lr=0.1) for m in (ref, model)]
    for m, opt, xx, yy in ((ref, opts[0], x, y), (model, opts[1], floor(x), floor(y))):
        for _ in range(2):
            opt.zero_grad()
            loss = F.cross_entropy(m(xx), yy)
            loss.backward()
            opt.step()
    assert model.weight.device.type == "tpu"
    torch.testing.assert_close(model.weight._t, ref.weight.detach())
    torch.testing.assert_close(model.bias._t, ref.bias.detach())

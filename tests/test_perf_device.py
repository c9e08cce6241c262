"""``python -m perf.device --dry-run``: the accelerator check's whole path on the CPU (tiny
sizes, Pallas kernels in interpret mode, the CUDA-eager rows on the CPU), so the script a GPU
machine runs never rots."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.subprocess
def test_device_check_dry_run(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("OUT", None)
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, "-m", "perf.device", "--dry-run", "--out", str(out),
         "--only", "mlp_train,kernels", "--modes", "cuda,inductor,jax,strict,defer",
         "--sizes", "default"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    report = json.loads((out / "device.json").read_text())
    # nothing was checked about the machine in a dry run: skipped, never passed
    assert report["env"]["status"] == "skipped" and "ok" not in report["env"]
    rows = {(r["workload"], r["mode"]): r for r in report["rows"]}
    assert rows["mlp_train", "inductor"]["status"] == "skipped"
    assert report["summary"] == {"passed": 5, "skipped": 2}
    kernels = rows["kernels", None]
    assert kernels["status"] == "passed" and kernels["interpret"]
    assert {r["kernel"] for r in kernels["rows"]} == {"flash_attention", "matmul"}
    assert all(r["max_rel_err"] <= r["tol"] for r in kernels["rows"])
    for m in ("cuda", "jax", "strict", "defer"):
        r = rows["mlp_train", m]
        assert r["status"] == "passed" and r["median_ms"] > 0, m
    lazy = {m: rows["mlp_train", m] for m in ("strict", "defer")}
    for r in lazy.values():
        assert r["host_ms"] > 0 and r["hbm_peak_bytes"] > 0 and len(r["losses"]) > 0
    # lazyrt's modes and PyTorch's own (on the CPU here) train the same model from the same
    # numbers
    first = rows["mlp_train", "cuda"]["losses"][0]
    for r in lazy.values():
        assert r["losses"][0] == pytest.approx(first, rel=1e-4)
    # one flush per step and no recompiles once warm, as in the CPU suite
    assert lazy["defer"]["flushes_per_step"] == 1
    assert lazy["defer"]["cache_misses_after_warmup"] == 0
    md = (out / "device.md").read_text()
    assert md.count("\n| ") >= 4 and "| mlp_train default |" in md
    assert "kernel flash_attention" in md and "skipped 2" in md


def test_plan_order_and_filters():
    # (no subprocess: the plan as data) the headline d1024 GPT rows come first; every row
    # is capped; the filters keep the order
    from perf import device

    assert device.PLAN[0][:3] == ("gpt_train", "d1024", "cuda")
    assert device.PLAN[1][:3] == ("gpt_train", "d1024", "defer")
    assert all(0 < cap <= 150 for *_, cap in device.PLAN)
    plan = device._plan(["gpt_train", "kernels"], ["cuda", "defer"], ["d1024"], dry=False)
    assert [p[:3] for p in plan] == [("gpt_train", "d1024", "cuda"),
                                     ("gpt_train", "d1024", "defer"), ("kernels", None, None)]

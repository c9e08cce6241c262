"""``python -m perf.device --dry-run``: the accelerator check's whole path on the CPU (no
install, Pallas kernels in interpret mode at tiny sizes, tiny models), so the script a GPU
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
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, "-m", "perf.device", "--dry-run", "--out", str(out),
         "--only", "mlp_train", "--modes", "strict,defer,compiled"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    report = json.loads((out / "device.json").read_text())
    assert report["ok"] == {"install": True, "kernels": True, "timing": True}
    assert report["install"]["skipped"] == "dry run"
    kernels = report["kernels"]
    assert kernels["interpret"] and {r["kernel"] for r in kernels["rows"]} == {
        "flash_attention", "matmul"}
    assert all(r["max_rel_err"] <= r["tol"] for r in kernels["rows"])
    rows = {r["mode"]: r for r in report["timing"]}
    assert sorted(rows) == ["compiled", "defer", "strict"]
    for r in rows.values():
        assert r["workload"] == "mlp_train" and r["median_ms"] > 0 and r["host_ms"] > 0
        assert r["hbm_peak_bytes"] > 0 and len(r["losses"]) > 0
    # the three modes train the same model from the same numbers
    first = rows["strict"]["losses"][0]
    for r in rows.values():
        assert r["losses"][0] == pytest.approx(first, rel=1e-4)
    # one flush per step and no recompiles once warm, as in the CPU suite
    assert rows["defer"]["flushes_per_step"] == 1 and rows["defer"]["cache_misses_after_warmup"] == 0
    md = (out / "device.md").read_text()
    assert "| mlp_train | defer |" in md and "flash_attention" in md

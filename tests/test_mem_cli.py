"""The ``lazyrt-mem`` CLI, run in subprocesses on the example scripts."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from lazyrt import mem
from lazyrt._memcli import export

pytestmark = pytest.mark.subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")

RECORD_KEYS = {
    "index", "mode", "trace_hash", "num_ops", "cache_hit", "compile_seconds", "execute_seconds",
    "argument_bytes", "output_bytes", "temp_bytes", "alias_bytes", "live_bytes_before",
    "live_bytes_after", "hbm_peak_bytes", "source", "largest_tensors", "start_seconds", "name",
}
SUMMARY_KEYS = {
    "script", "argv", "mode", "exit_status", "peak_bytes", "peak_where", "num_records",
    "num_flushes", "cache_hit_rate", "compile_seconds", "execute_seconds", "live_bytes_at_exit",
}


def _cli(*args, cwd=ROOT, console=False):
    exe = shutil.which("lazyrt-mem") if console else None
    cmd = [exe] if exe else [sys.executable, "-m", "lazyrt.mem"]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("TORCH_TPU_MODE", None)
    return subprocess.run([*cmd, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("mlp")
    j, t = d / "report.json", d / "trace.json"
    p = _cli("run", "--mode", "defer", "--top", "3", "--json", str(j), "--trace", str(t),
             "examples/mlp_step.py", "3")
    assert p.returncode == 0, p.stderr
    return p, json.loads(j.read_text()), json.loads(t.read_text())


def test_run_prints_script_output_table_and_summary(mlp_run):
    p, _, _ = mlp_run
    out = p.stdout
    assert "step 2: loss" in out and "step 3" not in out  # the script saw its argv
    assert "top 3 of" in out and "HBM peak" in out and "triggered at" in out
    assert "examples/mlp_step.py:" in out  # the sync point's source line
    assert ("miss" in out) and ("hit" in out)
    for line in ("process HBM peak:", "reached at:", "computations:", "cache hit rate:",
                 "compile time:", "execute time:", "live bytes at exit:"):
        assert line in out
    assert "Traceback" not in p.stderr


def test_run_json_schema(mlp_run):
    _, doc, _ = mlp_run
    assert doc["schema"] == "lazyrt-mem/1"
    s = doc["summary"]
    assert SUMMARY_KEYS <= set(s)
    assert s["mode"] == "defer" and s["exit_status"] == 0 and s["argv"] == ["3"]
    recs = doc["records"]
    assert len(recs) == s["num_records"] >= 3
    for r in recs:
        assert RECORD_KEYS <= set(r)
        assert r["hbm_peak_bytes"] > 0
        # defer flushes, and the optimizer state the first step makes on the spot (strict)
        assert r["mode"] == "defer" or (r["mode"] == "strict" and r["name"] == "zeros_like"), r
    assert sum(r["mode"] == "defer" for r in recs) >= 3
    assert s["peak_bytes"] >= max(r["hbm_peak_bytes"] for r in recs)
    assert any(r["cache_hit"] for r in recs) and not all(r["cache_hit"] for r in recs)


def test_run_trace_has_counter_and_slices(mlp_run):
    _, doc, trace = mlp_run
    ev = trace["traceEvents"]
    counters = [e for e in ev if e["ph"] == "C"]
    slices = [e for e in ev if e["ph"] == "X"]
    assert counters and all("bytes" in e["args"] for e in counters)
    assert {e["cat"] for e in slices} == {"compile", "execute"}
    assert all("mlp_step.py" in e["args"]["source"] for e in slices)
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in slices)
    assert max(e["args"]["bytes"] for e in counters) == max(
        r["hbm_peak_bytes"] for r in doc["records"])


def test_failing_script_reports_and_exits_nonzero(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent("""\
        import sys
        import torch
        import lazyrt
        print("name", __name__, "argv", sys.argv[1:])
        x = torch.ones(1000, device="tpu")
        print("sum", (x * 2).sum().item())
        raise ValueError("boom from the script")
    """))
    j = tmp_path / "r.json"
    p = _cli("run", "--mode", "strict", "--json", str(j), str(script), "a", "--b",
             console=True)
    assert p.returncode == 1
    assert "name __main__ argv ['a', '--b']" in p.stdout
    assert "sum 2000.0" in p.stdout
    assert "ValueError: boom from the script" in p.stderr
    assert 'fails.py", line 7' in p.stderr
    assert "lazyrt/mem.py" not in p.stderr and "runpy" not in p.stderr
    assert "process HBM peak:" in p.stdout and "script exit status:  1" in p.stdout
    doc = json.loads(j.read_text())
    assert doc["summary"]["exit_status"] == 1
    assert "boom" in doc["summary"]["error"]
    assert any(r["mode"] == "strict" and "fails.py:6" in r["source"] for r in doc["records"])


def test_compare_side_by_side(capsys, compile_at_first_run):
    rc = mem.main(["compare", os.path.join(EXAMPLES, "ew_chain.py"), str(1 << 18)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "strict" in out and "defer" in out and "defer/strict" in out
    rows = {line.split("  ")[0]: line.split() for line in out.splitlines()}
    peak = rows["HBM peak"]
    assert peak[-1].endswith("x") and float(peak[-1][:-1]) < 1.0  # fusion lowers the peak
    assert "computations" in rows and "compile time" in rows and "execute time" in rows


def test_missing_script(capsys):
    assert mem.main(["run", "no/such/script.py"]) == 2
    err = capsys.readouterr().err
    assert "script not found: no/such/script.py" in err and "Traceback" not in err
    assert mem.main(["compare", "no/such/script.py"]) == 2


def test_unwritable_output_path(tmp_path, capsys):
    script = os.path.join(EXAMPLES, "ew_chain.py")
    assert mem.main(["run", "--json", str(tmp_path / "missing" / "r.json"), script]) == 2
    err = capsys.readouterr().err
    assert "cannot write --json file" in err and "does not exist" in err
    assert mem.main(["run", "--trace", str(tmp_path), script]) == 2
    assert "is a directory" in capsys.readouterr().err


@pytest.mark.skipif(export.plot_available(), reason="matplotlib is installed")
def test_plot_without_matplotlib_says_how_to_install(tmp_path, capsys):
    rc = mem.main(["run", "--plot", str(tmp_path / "p.png"), os.path.join(EXAMPLES, "ew_chain.py")])
    assert rc == 2
    assert "pip install 'lazyrt[plot]'" in capsys.readouterr().err

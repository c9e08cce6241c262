"""The accelerator check in one call: lazyrt beside its peers on the same workloads.

    python -m perf.device [--out DIR] [--budget SECONDS] [--dry-run]
                          [--only gpt_train,kernels,...] [--modes cuda,defer,...]
                          [--sizes default,d1024]

It runs on the machine's own torch (CUDA build) and JAX (CUDA plugin), the tree on
``PYTHONPATH``; nothing is installed (docs/device-check.md gives the exact command,
cachetools carried as a wheel). One fresh process per row, in order of importance
(``PLAN``), each capped in time: a row that runs past its cap is stopped and reported as
timed out, a row that no longer fits the budget (``--budget``, default 420 s, the
whole run) as skipped; nothing hangs. Rows:

* ``perf/workloads.py``'s workloads (``gpt_train``, ``gpt_infer``, ``mlp_train``,
  ``attention``) at their default sizes and ``gpt_*`` at ``d1024`` (vocab 8192, d 1024,
  seq 512, batch 16), each in the modes: ``cuda`` (PyTorch CUDA eager, the same workload
  classes on "cuda", synced with ``torch.cuda.synchronize``), ``inductor``
  (``torch.compile`` on CUDA), ``jax`` (the plain-JAX floor, ``perf/jax_floor.py``: the
  step written in JAX and jitted whole), and lazyrt's ``strict``, ``defer`` and
  ``compiled``: median ms of 10 timed steps after 3 warm-up steps (the first compiles; its
  seconds are reported too), float32, TF32 off; lazyrt rows add device busy time per step
  (a ``jax.profiler`` trace of 3 more steps) and counters;
* ``kernels``: ``python -m perf.device_kernels``: the Pallas kernels compiled and checked
  against their references, timed against XLA's path (and cuDNN's attention);
* ``serving``: ``generate_batch`` tokens/s, transformers' own on CUDA against lazyrt's
  defer on the same model and prompts (``perf/serving.py``).

Writes ``device.md`` (one markdown table) and ``device.json`` (everything) into ``--out``
(default ``$OUT`` when set, else ``device-check``). ``--dry-run`` runs the same path on the
CPU (tiny sizes, kernels in interpret mode, the ``cuda`` rows on the CPU, no inductor);
CI runs it (tests/test_perf_device.py). Each row has a status: passed, failed, timed out
or skipped; the exit status is 1 when a row failed or timed out, and a skipped row never
counts as passed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAZYRT_MODES = ("strict", "defer", "compiled")
PEER_MODES = ("cuda", "inductor", "jax")
MODES = PEER_MODES + LAZYRT_MODES
# a row's timed steps, warm-up steps and profiled steps
STEPS, WARMUP, PROFILED = 10, 3, 3
BUDGET = 420.0  # seconds, the whole run
# The issue-38 size of the GPT workloads (GPTTrain/GPTInfer class attributes).
SIZES = {"d1024": {"VOCAB": 8192, "SEQ": 512, "BATCH": 16, "D": 1024}}

# (workload, size or attention shape, mode, cap in seconds), in order of importance: the
# headline d1024 GPT step first, then the small GPT with its floor, inference, the
# kernels, serving, the rest. A cap covers the process (imports, compiling, steps).
PLAN: list[tuple[str, str | None, str | None, float]] = [
    ("gpt_train", "d1024", "cuda", 45),
    ("gpt_train", "d1024", "defer", 150),
    ("gpt_train", "d1024", "inductor", 75),
    ("gpt_train", "default", "cuda", 30),
    ("gpt_train", "default", "jax", 30),
    ("gpt_train", "default", "defer", 90),
    ("gpt_infer", "d1024", "cuda", 30),
    ("gpt_infer", "d1024", "defer", 90),
    ("kernels", None, None, 60),
    ("serving", None, "defer", 90),
    ("mlp_train", "default", "cuda", 30),
    ("mlp_train", "default", "jax", 30),
    ("mlp_train", "default", "defer", 60),
    ("attention", "b8h4s128d64", "cuda", 30),
    ("attention", "b8h4s128d64", "jax", 30),
    ("attention", "b8h4s128d64", "defer", 60),
    ("gpt_infer", "default", "cuda", 30),
    ("gpt_infer", "default", "jax", 30),
    ("gpt_infer", "default", "defer", 60),
    ("gpt_train", "default", "strict", 150),
    ("gpt_train", "default", "compiled", 120),
    ("gpt_train", "default", "inductor", 60),
    ("gpt_infer", "default", "inductor", 60),
    ("gpt_infer", "d1024", "inductor", 60),
    ("gpt_train", "d1024", "jax", 60),
    ("mlp_train", "default", "strict", 90),
    ("mlp_train", "default", "compiled", 90),
    ("mlp_train", "default", "inductor", 60),
    ("attention", "b4h8s256d64", "cuda", 30),
    ("attention", "b4h8s256d64", "defer", 60),
    ("attention", "b2h8s512d64", "cuda", 30),
    ("attention", "b2h8s512d64", "defer", 60),
]
WORKLOADS = ("gpt_train", "gpt_infer", "mlp_train", "attention", "kernels", "serving")
# rows start only with this many seconds of the budget left
MIN_ROW_S = 15


def _env(dry: bool = False) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = _ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("TORCH_TPU_MODE", None)
    env.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    env["PYTHONUNBUFFERED"] = "1"
    # NOTE: torch's CUDA and JAX share the GPU in the serving row: JAX must not take 75%
    # of its memory up front.
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if dry:
        env["JAX_PLATFORMS"] = "cpu"
    return env


def _py(args: list, timeout: float, dry: bool) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          env=_env(dry), cwd=_ROOT, timeout=max(timeout, 1))


# ---- the rows, each in its own process --------------------------------------------------


def _resize(size: str | None, dry: bool) -> None:
    """Set the workloads' sizes: tiny in a dry run, else ``SIZES[size]`` (None/"default":
    as they are)."""
    from . import workloads as W

    if dry:
        W.MLPTrain.WIDTH, W.MLPTrain.BATCH = 32, 4
        W.GPTTrain.VOCAB, W.GPTTrain.SEQ, W.GPTTrain.BATCH, W.GPTTrain.D = 64, 16, 2, 32
        for name in list(W.ATTENTION_SHAPES):
            W.ATTENTION_SHAPES[name] = (1, 2, 16, 8)
        return
    for attr, value in SIZES.get(size or "default", {}).items():
        setattr(W.GPTTrain, attr, value)


def device_busy_ms(trace_dir: str, steps: int) -> float | None:
    """The device's busy time per step in a ``jax.profiler`` trace: the union of the event
    intervals on the device processes (``/device:...``; streams and op lines overlap, so
    a union, never a sum). None where the trace has no device process (the CPU)."""
    import glob
    import gzip

    files = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)
    if not files:
        return None
    with gzip.open(files[0]) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    dev = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
           and str(e.get("args", {}).get("name", "")).startswith("/device:")}
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events
                   if e.get("ph") == "X" and e.get("pid") in dev)
    if not dev or not spans:
        return None
    busy, end = 0.0, float("-inf")
    for s, t in spans:
        if t > end:
            busy += t - max(s, end)
            end = t
    return busy / 1e3 / steps


def _torch_row(w: str, v: str | None, mode: str, dry: bool, steps: int) -> dict:
    """PyTorch's own CUDA eager (``cuda``) or inductor (``inductor``) on the workload."""
    import torch

    from .workloads import WORKLOADS as W

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not dry:
        raise RuntimeError("torch sees no CUDA device")
    if device == "cuda":  # float32 as lazyrt computes it
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    wl = W[w](device, device, v if w == "attention" else None)
    if mode == "inductor" and not wl.compile(step=False):
        raise ValueError(f"{w}: nothing to compile")
    losses = []
    t0 = time.perf_counter()
    out = wl.step()
    first = time.perf_counter() - t0
    losses.append(out if out is not None else wl.probe())
    for _ in range(WARMUP - 1):
        wl.step()
    ts = []
    for _ in range(steps):
        t0 = time.perf_counter()
        out = wl.step()
        ts.append((time.perf_counter() - t0) * 1e3)
        if out is not None:
            losses.append(out)
    return {"device": device, "torch": torch.__version__, "first_step_s": first,
            "median_ms": statistics.median(ts), "step_ms": ts, "min_ms": min(ts),
            "losses": [float(x) for x in losses[:8] if x is not None], "ok": True}


def _jax_row(w: str, v: str | None, size: str | None, dry: bool, steps: int) -> dict:
    import jax

    from . import jax_floor

    t0 = time.perf_counter()
    ms, ts, losses = jax_floor.run(w, steps, WARMUP, per_step=True,
                                   variant=v if w == "attention" else None,
                                   size="tiny" if dry and w != "attention" else size)
    return {"median_ms": ms, "step_ms": ts, "min_ms": min(ts), "jax_losses": losses[:8],
            "seconds": time.perf_counter() - t0, "jax": jax.__version__,
            "backend": jax.default_backend(), "ok": True}


def _lazyrt_row(w: str, v: str | None, mode: str, steps: int) -> dict:
    from . import _worker

    extra: dict = {}

    def after(wl):
        import jax

        d = tempfile.mkdtemp(prefix="lazyrt-device-")
        with jax.profiler.trace(d, create_perfetto_trace=True):
            for _ in range(PROFILED):
                wl.step()
        extra["device_ms"] = device_busy_ms(d, PROFILED)
        stats = jax.devices()[0].memory_stats() or {}
        extra["allocator_peak_bytes"] = stats.get("peak_bytes_in_use")

    res = _worker.run(w, mode, steps, WARMUP, v if w == "attention" else None, after=after)
    res.update(extra)
    import jax

    import lazyrt

    res["backend"] = jax.default_backend()
    res["pallas"] = lazyrt.config.pallas
    return res


def _serving_row(mode: str, dry: bool) -> dict:
    import torch

    from . import serving

    peer = "cuda" if torch.cuda.is_available() else "cpu"
    if peer == "cpu" and not dry:
        raise RuntimeError("torch sees no CUDA device")
    kw = {"requests": 4, "new": 4, "calls": 2, "hidden": 32} if dry else {}
    return serving.serving_row(mode, peer, **kw)


def run_row(spec: str, dry: bool) -> dict:
    """One row (``workload:size-or-shape:mode``), in this process."""
    w, v, m = spec.split(":")
    v = v or None
    steps = 3 if dry else STEPS
    if w == "serving":
        return _serving_row(m, dry)
    if m == "jax":
        return _jax_row(w, v, v if w != "attention" else None, dry, steps)
    _resize(v if w != "attention" else None, dry)
    if m in ("cuda", "inductor"):
        return _torch_row(w, v, m, dry, steps)
    return _lazyrt_row(w, v, m, steps)


# ---- the driver ----------------------------------------------------------------------------


def _status(r: dict) -> str:
    if r.get("skipped"):
        return "skipped"
    if r.get("timed_out"):
        return "timed out"
    return "passed" if r.get("ok") else "failed"


def section_env(dry: bool) -> dict:
    """Versions and what the process sees: JAX's backend and device, torch's CUDA, the
    Pallas GPU backend, cuDNN attention's probe. On a GPU machine it passes when JAX sees
    a GPU and torch sees CUDA; a dry run only reports (status "skipped": nothing checked)."""
    code = (
        "import json, jax, torch; from kernels_pallas._common import gpu_backend;"
        "from lazyrt._base import backend_choices as bc; d = jax.devices()[0];"
        "r = {'jax': jax.__version__, 'torch': torch.__version__, 'backend': "
        "jax.default_backend(), 'device_kind': d.device_kind, 'torch_cuda': "
        "torch.cuda.is_available(), 'pallas_gpu_backend': gpu_backend() if "
        "jax.default_backend() == 'gpu' else None};"
        "import cachetools; r['cachetools'] = cachetools.__version__;"
        "from lazyrt.lowering import pallas_router as pr;"
        "r['cudnn_attention'] = pr.cudnn_ok() if jax.default_backend() == 'gpu' else None;"
        "r['cudnn_probe_error'] = pr.cudnn_probe_error;"
        "r['pallas_auto_uses_kernels'] = bc.uses_pallas(jax.default_backend());"
        "print(json.dumps(r))")
    t0 = time.perf_counter()
    try:
        p = _py(["-c", code], 120, dry)
        res = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {
            "error": p.stderr[-2000:]}
    except (subprocess.TimeoutExpired, ValueError, IndexError) as e:
        res = {"error": f"{type(e).__name__}: {e}"}
    res["seconds"] = round(time.perf_counter() - t0, 1)
    if dry:
        res["skipped"] = "dry run: no GPU expected"
    else:
        res["ok"] = res.get("backend") == "gpu" and bool(res.get("torch_cuda"))
    res["status"] = _status(res)
    return res


def _run_kernels(dry: bool, cap: float, tmp: str) -> dict:
    path = os.path.join(tmp, "kernels.json")
    # the subprocess starts no case after cap - 15 s; the cap kills it whatever it runs
    args = ["-m", "perf.device_kernels", "--json", path, "--budget", str(max(cap - 15, 1))]
    res: dict = {}
    try:
        p = _py(args + (["--dry-run"] if dry else []), cap, dry)
        if p.returncode != 0:
            res = {"ok": False, "error": f"exit {p.returncode}", "stderr": p.stderr[-3000:]}
    except subprocess.TimeoutExpired:
        res = {"ok": False, "timed_out": True, "error": f"stopped at its cap, {cap:.0f} s"}
    if os.path.exists(path):
        with open(path) as f:
            got = json.load(f)
        got.update(res)  # a timeout or a crash keeps its mark; finished cases are kept
        res = got
    return res


def run_plan(plan, dry: bool, budget: float, tmp: str) -> list:
    t_end = time.monotonic() + budget
    rows = []
    for w, v, m, cap in plan:
        row: dict = {"workload": w, "size": v, "mode": m, "cap_s": cap}
        left = t_end - time.monotonic()
        if left < MIN_ROW_S:
            row["skipped"] = "time budget spent"
        elif dry and m == "inductor":
            row["skipped"] = "dry run: no CUDA for inductor"
        else:
            t0 = time.perf_counter()
            limit = min(cap, left)
            if w == "kernels":
                row.update(_run_kernels(dry, limit, tmp))
            else:
                path = os.path.join(tmp, f"row_{len(rows)}.json")
                args = ["-m", "perf.device", "--_row", f"{w}:{v or ''}:{m}", "--_json", path]
                try:
                    p = _py(args + (["--dry-run"] if dry else []), limit, dry)
                    if os.path.exists(path):
                        with open(path) as f:
                            row.update(json.load(f))
                    else:
                        row.update(ok=False, error=f"exit {p.returncode}",
                                   stderr=p.stderr[-3000:])
                except subprocess.TimeoutExpired:
                    row.update(ok=False, timed_out=True,
                               error=f"stopped at its cap, {limit:.0f} s")
            row["seconds"] = round(time.perf_counter() - t0, 1)
        row["status"] = _status(row)
        print(f"  {w} {v or ''} {m or ''}: {row['status']} ({row.get('seconds', 0)} s)",
              file=sys.stderr, flush=True)
        rows.append(row)
    return rows


# ---- the report ----------------------------------------------------------------------------


def _ms(r: dict | None) -> str:
    if r is None:
        return ""
    if r["status"] != "passed":
        return r["status"] + (f": {r.get('error', '')[:60]}" if r["status"] == "failed" else "")
    first = r.get("first_step_s")
    return f"{r['median_ms']:.2f}" + (f" (1st {first:.1f} s)" if first is not None else "")


def markdown(report: dict) -> str:
    """The one table: a line per workload and size, a column per mode (ms per step; the
    first step's seconds in brackets), then the kernels' and serving's lines."""
    env = report["env"]
    head = (f"lazyrt device check{' (dry run)' if report['dry_run'] else ''}: "
            f"{report['started']}, {report['seconds']} s; {env.get('device_kind', '?')}; "
            f"torch {env.get('torch', '?')}, jax {env.get('jax', '?')}; Pallas on GPU: "
            f"{env.get('pallas_gpu_backend')}, auto uses kernels: "
            f"{env.get('pallas_auto_uses_kernels')}; cuDNN attention: "
            f"{env.get('cudnn_attention')}. `{report['command']}`")
    lines = [head, "",
             "| row | CUDA eager | inductor | plain JAX | strict | defer | compiled "
             "| defer / CUDA eager | notes |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    by: dict = {}
    order: list = []
    for r in report["rows"]:
        if r["workload"] in ("kernels", "serving"):
            continue
        key = (r["workload"], r["size"])
        if key not in by:
            order.append(key)
        by.setdefault(key, {})[r["mode"]] = r
    for key in order:
        cells = by[key]
        ratio = ""
        c, d = cells.get("cuda"), cells.get("defer")
        if c and d and c["status"] == d["status"] == "passed":
            ratio = f"{d['median_ms'] / c['median_ms']:.2f}x"
        notes = []
        for m in LAZYRT_MODES:
            r = cells.get(m)
            if r and r["status"] == "passed":
                bits = [f"{m}: device {r['device_ms']:.2f} ms" if r.get("device_ms") else m]
                if r.get("flushes_per_step") is not None:
                    bits.append(f"{r['flushes_per_step']:.0f} flushes/step")
                if r.get("executions_per_step") is not None:
                    bits.append(f"{r['executions_per_step']:.0f} executions/step")
                if r.get("cache_misses_after_warmup"):
                    bits.append(f"{r['cache_misses_after_warmup']} misses after warm-up")
                notes.append(", ".join(bits))
        lines.append(f"| {key[0]} {key[1] or ''} | " + " | ".join(
            _ms(cells.get(m)) for m in ("cuda", "inductor", "jax") + LAZYRT_MODES)
            + f" | {ratio} | {'; '.join(notes)} |")
    for r in report["rows"]:
        if r["workload"] == "serving":
            cell = ("" if r["status"] != "passed" else
                    f"{r['peer_tokens_per_s']:.0f} tok/s (transformers on {r['peer']})")
            lazy = (r["status"] if r["status"] != "passed" else
                    f"{r['lazyrt_tokens_per_s']:.0f} tok/s")
            notes = ("" if r["status"] != "passed" else
                     f"{r['requests']} requests x {r['new_tokens']} new tokens; lazyrt compiles "
                     f"per call {r['lazyrt_compiles']}; tokens match {r['tokens_match']:.0%}")
            if r["status"] == "failed":
                notes = r.get("error", "")[:200]
            lines.append(f"| serving (generate_batch) | {cell} | | | | {lazy} | | | {notes} |")
        if r["workload"] == "kernels":
            if r["status"] in ("skipped",) or not r.get("rows"):
                why = r.get("skipped") or r.get("error", "")
                lines.append(f"| Pallas kernels | | | | | | | | {r['status']}: {why[:200]} |")
            for k in r.get("rows", []):
                name = f"kernel {k['kernel']} {k['case']} {k.get('dtype', '')} {k.get('shape', '')}"
                if k.get("skipped"):
                    lines.append(f"| {name} | | | | | | | | skipped: {k['skipped']} |")
                    continue
                if "kernel_ms" not in k:
                    lines.append(f"| {name} | | | | | | | | FAILED: {k.get('error', '')[:200]} |")
                    continue
                note = (f"Pallas {k['kernel_ms']:.3f} ms, max rel err {k['max_rel_err']:.2g} "
                        f"({'ok' if k['ok'] else 'OFF'}); XLA / Pallas "
                        f"{k['xla_ms'] / k['kernel_ms']:.2f}x")
                if "cudnn_ms" in k:
                    note += f"; cuDNN {k['cudnn_ms']:.3f} ms"
                elif "cudnn_error" in k:
                    note += f"; cuDNN failed: {k['cudnn_error'][:80]}"
                lines.append(f"| {name} | | | {k['xla_ms']:.3f} (XLA) | | | | | {note} |")
            if r["status"] == "timed out":
                lines.append(f"| Pallas kernels | | | | | | | | {r.get('error', '')} |")
    lines += ["", "ms per step, median of the timed steps (the first step's seconds in "
              "brackets); plain JAX: the step jitted whole; kernel lines: fwd+bwd, XLA's "
              "path in the plain-JAX column. Row statuses: " + ", ".join(
                  f"{k} {v}" for k, v in report["summary"].items())]
    return "\n".join(lines) + "\n"


def _plan(only, modes, sizes, dry: bool) -> list:
    plan = [p for p in PLAN if p[0] in only and (p[2] is None or p[2] in modes or p[0] == "serving")
            and (p[1] is None or p[0] == "attention" or p[1] in sizes)]
    if dry:  # the dry run's attention shapes are one tiny shape: one is enough
        plan = [p for p in plan if p[0] != "attention" or p[1] == "b8h4s128d64"]
    return plan


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.device", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "device-check",
                    help="folder for device.md and device.json (default $OUT or device-check)")
    ap.add_argument("--budget", type=float, default=None,
                    help=f"seconds for the whole run (default {BUDGET:.0f}; dry run 900)")
    ap.add_argument("--dry-run", action="store_true",
                    help="on the CPU: tiny sizes, interpret-mode kernels, no inductor")
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--sizes", default="default,d1024")
    ap.add_argument("--_row", help=argparse.SUPPRESS)
    ap.add_argument("--_json", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a._row:  # one row, in its own process
        import traceback

        try:
            res = run_row(a._row, a.dry_run)
        except Exception as e:
            res = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000],
                   "traceback": traceback.format_exc()[-4000:]}
        with open(a._json, "w") as f:
            json.dump(res, f)
        sys.stdout.flush()
        os._exit(0)  # skip XLA's thread-pool teardown

    t_start = time.monotonic()
    budget = a.budget or (900 if a.dry_run else BUDGET)
    os.makedirs(a.out, exist_ok=True)
    report: dict = {"command": "python -m perf.device " + " ".join(argv or sys.argv[1:]),
                    "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                    "dry_run": a.dry_run, "budget_s": budget}
    print("env ...", file=sys.stderr, flush=True)
    report["env"] = section_env(a.dry_run)
    plan = _plan(a.only.split(","), a.modes.split(","), a.sizes.split(","), a.dry_run)
    with tempfile.TemporaryDirectory(prefix="lazyrt-device-") as tmp:
        report["rows"] = run_plan(plan, a.dry_run,
                                  budget - (time.monotonic() - t_start), tmp)
    report["seconds"] = round(time.monotonic() - t_start, 1)
    statuses = [report["env"]["status"]] + [r["status"] for r in report["rows"]]
    report["summary"] = {s: statuses.count(s) for s in
                         ("passed", "failed", "timed out", "skipped") if s in statuses}
    with open(os.path.join(a.out, "device.json"), "w") as f:
        json.dump(report, f, indent=1)
    text = markdown(report)
    with open(os.path.join(a.out, "device.md"), "w") as f:
        f.write(text)
    print(text)
    print(f"wrote {a.out}/device.md, {a.out}/device.json; rows: {report['summary']}")
    return 1 if {"failed", "timed out"} & set(statuses) else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The accelerator check: what a machine with an NVIDIA GPU runs from a fresh clone.

    python -m perf.device [--out DIR] [--budget SECONDS] [--skip-install] [--dry-run]
                          [--only mlp_train,attention] [--modes strict,defer,compiled]

Sections, each reported on its own (one failing never stops the rest):

1. ``install``: ``pip install "jax[cuda12]==<the installed jax version>"`` unless JAX
   already sees a GPU (``--skip-install`` skips it);
2. ``kernels``: ``python -m perf.device_kernels``: the Pallas kernels compiled for real and
   checked against their references (flash attention forward and backward, causal, GQA,
   odd lengths; matmul with and without epilogue), each timed against XLA's own path;
3. ``timing``: strict, defer and compiled on ``mlp_train``, ``gpt_train``, ``gpt_infer``
   and the ``attention`` shapes, one fresh process per row (``perf._worker``): the step's
   wall time, the host's issue time (the step minus the time blocked on results) and CPU
   time, the device's busy time per step (kernel intervals on the device in a
   ``jax.profiler`` trace of a few extra steps), lazyrt's HBM peak and the allocator's.

Writes ``device.json`` and ``device.md`` (a markdown table) into ``--out``. A time budget
(``--budget``, default 450 s after the install) skips the rows that no longer fit, each
reported as skipped. ``--dry-run`` runs the whole path on the CPU: no install, kernels in
interpret mode, tiny model sizes; CI runs it (tests/test_perf_device.py).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = ["mlp_train", "gpt_train", "gpt_infer", "attention"]
MODES = ["strict", "defer", "compiled"]
ATTENTION = ["b8h4s128d64", "b4h8s256d64", "b2h8s512d64"]
# a row's timed steps and warm-up steps
STEPS, WARMUP, PROFILED = 10, 3, 3


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = _ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("TORCH_TPU_MODE", None)
    env.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    return env


def _py(args: list, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=_env(),
                          cwd=_ROOT, timeout=max(timeout, 1))


def _backend(timeout: float = 180) -> str:
    p = _py(["-c", "import jax; print(jax.default_backend())"], timeout)
    return p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else "?"


def section_install(dry: bool, skip: bool) -> dict:
    import importlib.metadata as md

    version = md.version("jax")
    res = {"jax": version, "backend_before": _backend()}
    if dry or skip or res["backend_before"] == "gpu":
        res.update(ok=True, skipped="dry run" if dry else "--skip-install" if skip
                   else "JAX already sees a GPU", backend=res["backend_before"])
        return res
    spec = f"jax[cuda12]=={version}"
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec],
                       capture_output=True, text=True, timeout=420)
    res.update(pip=spec, pip_rc=p.returncode, pip_seconds=round(time.perf_counter() - t0, 1),
               pip_tail=(p.stdout + p.stderr)[-2000:], backend=_backend())
    res["ok"] = p.returncode == 0 and res["backend"] == "gpu"
    return res


def section_kernels(dry: bool, out: str, timeout: float) -> dict:
    path = os.path.join(out, "kernels.json")
    args = ["-m", "perf.device_kernels", "--json", path] + (["--dry-run"] if dry else [])
    try:
        p = _py(args, timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    if p.returncode != 0 or not os.path.exists(path):
        return {"ok": False, "error": f"exit {p.returncode}", "stderr": p.stderr[-3000:]}
    with open(path) as f:
        return json.load(f)


def _rows(only, modes, dry: bool) -> list:
    rows = []
    for w in only:
        # (the dry run shrinks every attention shape to one tiny shape: one is enough)
        for v in ((ATTENTION[:1] if dry else ATTENTION) if w == "attention" else [None]):
            rows += [(w, v, m) for m in modes]
    return rows


def section_timing(dry: bool, out: str, only, modes, deadline: float) -> list:
    res = []
    for w, v, m in _rows(only, modes, dry):
        left = deadline - time.monotonic()
        row = {"workload": w, "variant": v, "mode": m}
        if left < 20:
            res.append(dict(row, ok=False, skipped="time budget spent"))
            continue
        path = os.path.join(out, f"row_{w}_{v or ''}_{m}.json")
        args = ["-m", "perf.device", "--_row", f"{w}:{v or ''}:{m}", "--_json", path]
        t0 = time.perf_counter()
        try:
            p = _py(args + (["--dry-run"] if dry else []), left)
            if os.path.exists(path):
                with open(path) as f:
                    row = json.load(f)
            else:
                row.update(ok=False, error=f"exit {p.returncode}", stderr=p.stderr[-3000:])
        except subprocess.TimeoutExpired:
            row.update(ok=False, error="time budget spent while running")
        row["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"  {w} {v or ''} {m}: {'ok' if row.get('ok') else 'FAILED'} ({row['seconds']} s)",
              file=sys.stderr, flush=True)
        res.append(row)
    return res


# ---- one timing row (in its own process) ----------------------------------------------


def _shrink() -> None:
    """Tiny sizes for the dry run (the same code path, seconds instead of minutes)."""
    from . import workloads as W

    W.MLPTrain.WIDTH, W.MLPTrain.BATCH = 32, 4
    W.GPTTrain.VOCAB, W.GPTTrain.SEQ, W.GPTTrain.BATCH, W.GPTTrain.D = 64, 16, 2, 32
    for name in list(W.ATTENTION_SHAPES):
        W.ATTENTION_SHAPES[name] = (1, 2, 16, 8)


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


def run_row(spec: str, dry: bool) -> dict:
    import tempfile

    from . import _worker

    w, v, m = spec.split(":")
    if dry:
        _shrink()
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

    res = _worker.run(w, m, 3 if dry else STEPS, WARMUP, v or None, after=after)
    res.update(extra)
    import jax

    res["backend"] = jax.default_backend()
    return res


# ---- report ---------------------------------------------------------------------------


def _f(x, nd=2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def markdown(report: dict) -> str:
    k = report["kernels"]
    lines = [f"# lazyrt device check ({report['backend']}{', dry run' if report['dry_run'] else ''})",
             "", f"`{report['command']}`; {report['started']}; {report['seconds']} s; "
             f"jax {report['install'].get('jax')}; {report.get('device_kind', '?')}.", "",
             "## Pallas kernels vs reference" + (f" ({k['note']})" if k.get("note") else ""), "",
             "| kernel | case | dtype | shape | max rel err | ok | kernel ms | XLA ms |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in k.get("rows", []):
        lines.append(f"| {r['kernel']} | {r['case']} | {r.get('dtype', '')} | {r.get('shape', '')} "
                     f"| {_f(r.get('max_rel_err'), 6) if 'max_rel_err' in r else r.get('error', '')} "
                     f"| {'yes' if r['ok'] else 'NO'} | {_f(r.get('kernel_ms'), 3)} "
                     f"| {_f(r.get('xla_ms'), 3)} |")
    if not k.get("rows"):
        lines.append(f"| kernels section failed: {k.get('error', '?')} | | | | | | | |")
    lines += ["", "## Steps (median of the timed steps)", "",
              "| workload | mode | step ms | host issue ms | host CPU ms | device busy ms "
              "| lazyrt HBM peak MB | allocator peak MB | flushes/step | misses after warm-up |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in report["timing"]:
        name = r["workload"] + (f" {r['variant']}" if r.get("variant") else "")
        if not r.get("ok"):
            why = r.get("skipped") or r.get("error", "failed")
            lines.append(f"| {name} | {r['mode']} | {why} | | | | | | | |")
            continue
        mb = lambda b: None if b is None else b / 2**20
        lines.append(
            f"| {name} | {r['mode']} | {_f(r['median_ms'])} | {_f(r.get('issue_ms'))} "
            f"| {_f(r.get('host_ms'))} | {_f(r.get('device_ms'))} "
            f"| {_f(mb(r.get('hbm_peak_bytes')), 1)} | {_f(mb(r.get('allocator_peak_bytes')), 1)} "
            f"| {_f(r.get('flushes_per_step'), 1)} | {r.get('cache_misses_after_warmup', '-')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.device", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="device-check", help="folder for device.json, device.md")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for kernels + timing after the install (default 450; dry 600)")
    ap.add_argument("--skip-install", action="store_true")
    ap.add_argument("--dry-run", action="store_true",
                    help="on the CPU: no install, interpret-mode kernels, tiny sizes")
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--_row", help=argparse.SUPPRESS)
    ap.add_argument("--_json", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a._row:  # one timing row, in its own process
        import traceback

        try:
            res = run_row(a._row, a.dry_run)
        except Exception as e:
            w, v, m = a._row.split(":")
            res = {"workload": w, "variant": v or None, "mode": m, "ok": False,
                   "error": f"{type(e).__name__}: {e}"[:2000],
                   "traceback": traceback.format_exc()[-4000:]}
        with open(a._json, "w") as f:
            json.dump(res, f)
        sys.stdout.flush()
        os._exit(0)  # skip XLA's thread-pool teardown

    t_start = time.monotonic()
    os.makedirs(a.out, exist_ok=True)
    report: dict = {"command": "python -m perf.device " + " ".join(argv or sys.argv[1:]),
                    "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                    "dry_run": a.dry_run}
    print("install ...", file=sys.stderr, flush=True)
    try:
        report["install"] = section_install(a.dry_run, a.skip_install)
    except Exception as e:
        report["install"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    report["backend"] = report["install"].get("backend", "?")
    deadline = time.monotonic() + (a.budget or (600 if a.dry_run else 450))
    try:
        p = _py(["-c", "import jax; print(jax.devices()[0].device_kind)"], 120)
        report["device_kind"] = p.stdout.strip().splitlines()[-1] if p.returncode == 0 else "?"
    except Exception:
        report["device_kind"] = "?"
    print("kernels ...", file=sys.stderr, flush=True)
    try:
        # the kernels get at most a third of the budget; the timing rows the rest
        report["kernels"] = section_kernels(a.dry_run, a.out, (deadline - time.monotonic()) / 3)
    except Exception as e:
        report["kernels"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    print("timing ...", file=sys.stderr, flush=True)
    report["timing"] = section_timing(a.dry_run, a.out, a.only.split(","), a.modes.split(","),
                                      deadline)
    report["seconds"] = round(time.monotonic() - t_start, 1)
    report["ok"] = {"install": bool(report["install"].get("ok")),
                    "kernels": bool(report["kernels"].get("ok")),
                    "timing": all(r.get("ok") for r in report["timing"])}
    with open(os.path.join(a.out, "device.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(a.out, "device.md"), "w") as f:
        f.write(markdown(report))
    print(markdown(report))
    print(f"wrote {a.out}/device.json, {a.out}/device.md; sections ok: {report['ok']}")
    return 0 if all(report["ok"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())

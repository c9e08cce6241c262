"""``python -m perf.pytorch_suite``: PyTorch's own device-generic test files on tpu.

PyTorch tests every device with the same files: ``instantiate_device_type_tests`` makes a
``...CPU`` and a ``...PRIVATEUSE1`` class of each test class, and with
``PYTORCH_TESTING_DEVICE_ONLY_FOR=tpu`` (lazyrt imported before
``torch.testing._internal.common_device_type``) the second runs on lazyrt's device, unmodified.
This runs the files of a PyTorch checkout (``--src``; nothing of it belongs to lazyrt) on
CPU (plain PyTorch: lazyrt not imported, its autoload off) and on tpu in each mode, each run
in its own pytest process, and prints per file: the tests that pass on CPU and also run on
tpu, how many of those pass on tpu, and the failures grouped by cause (exception type and
first message line with numbers and dtypes blanked), with an example test per group.

    python -m perf.pytorch_suite --src /work/pytorch-src --files test_shape_ops.py test_view_ops.py
        [--modes strict,defer] [--timeout 120] [--wall 3600] [--out DIR] [-k EXPR]
        [--sample K] [--reuse] [--report-only] [--json FILE]

A test over ``--timeout`` seconds fails as a timeout (``SIGALRM`` in the test process); a
process that hangs past that (inside a C call) or dies is killed and restarted without the
tests it finished, so one test can never stop a run. ``--wall`` bounds a whole (file, mode)
run; tests it leaves are reported as not run. Events are kept under ``--out`` (one
JSON-lines file per file and mode); ``--reuse`` keeps finished runs there, ``--report-only``
prints from them. ``--sample K`` runs every K-th test of the file (by name, so the same K
picks the same tests) on CPU and on tpu, for files whose runs would take hours; the report
then counts those tests only.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PASSING = ("passed", "xfailed")


# ---------------------------------------------------------------------------
# one (file, target) run


def _read_events(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # a line cut by a kill
    return out


def _env(target: str, out: str, events: str, done: str, timeout: float, select: str | None) -> dict:
    env = dict(os.environ)
    if select:
        env["PT_SUITE_SELECT"] = select
    env["PYTHONPATH"] = os.pathsep.join([_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(PT_SUITE_EVENTS=events, PT_SUITE_DONE=done, PT_SUITE_TIMEOUT=str(timeout))
    env.setdefault("JAX_PLATFORMS", "cpu")
    if target == "cpu":
        env.update(PYTORCH_TESTING_DEVICE_ONLY_FOR="cpu", TORCH_DEVICE_BACKEND_AUTOLOAD="0",
                   PT_SUITE_LAZYRT="0")
    else:
        env.update(PYTORCH_TESTING_DEVICE_ONLY_FOR="tpu", TORCH_DEVICE_BACKEND_AUTOLOAD="0",
                   PT_SUITE_LAZYRT="1", TORCH_TPU_MODE=target)
        env.setdefault("LAZYRT_CACHE_DIR", os.path.join(out, "compile-cache"))
    return env


def run_target(path: str, target: str, out: str, *, timeout: float, wall: float, kexpr: str | None,
               reuse: bool, select: str | None = None, log=print) -> dict:
    """Runs one test file on one target; returns {"results": {id: report}, "secs": wall seconds}."""
    stem = os.path.splitext(os.path.basename(path))[0]
    events = os.path.join(out, f"{stem}.{target}.jsonl")
    done = os.path.join(out, f"{stem}.{target}.done")
    meta = os.path.join(out, f"{stem}.{target}.meta.json")
    if reuse and not os.path.exists(meta) and os.path.exists(events) and reuse == "report":
        return {"results": _results(events, {}), "secs": 0.0, "reused": True}
    if reuse and os.path.exists(meta):
        with open(meta) as f:
            m = json.load(f)
        return {"results": _results(events, m.get("killed", {})), "secs": m["secs"], "reused": True}
    for p in (events, done):
        if os.path.exists(p):
            os.remove(p)
    open(done, "w").close()
    t0 = time.time()
    killed: dict[str, str] = {}  # id -> why (a hang past the limit, a crash)
    env = _env(target, out, events, done, timeout, select)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "perf.pytorch_suite._plugin",
           "-o", "addopts=", "--no-header", "-rN", path]
    if kexpr:
        cmd += ["-k", kexpr]
    logf = open(os.path.join(out, f"{stem}.{target}.log"), "a")
    restarts = 0
    while True:
        seen = len(_read_events(events))
        proc = subprocess.Popen(cmd, cwd=os.path.dirname(path), env=env, stdout=logf, stderr=subprocess.STDOUT,
                                start_new_session=True)
        why = None
        while proc.poll() is None:
            time.sleep(1.0)
            evs = _read_events(events)[seen:]
            current = None
            for e in evs:
                if e["kind"] == "start":
                    current = e
                elif e["kind"] == "report" and current is not None and e["id"] == current["id"]:
                    current = None
            if time.time() - t0 > wall:
                why = "wall"
            elif current is not None and time.time() - current["t"] > timeout * 1.5 + 30:
                why = "hang"
            if why:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
        evs = _read_events(events)[seen:]
        finished = {e["id"] for e in evs if e["kind"] == "report"}
        started = [e["id"] for e in evs if e["kind"] == "start"]
        collected = next((e["ids"] for e in evs if e["kind"] == "collected"), [])
        with open(done, "a") as f:
            for tid in finished:
                f.write(tid + "\n")
            unfinished = [t for t in started if t not in finished]
            if unfinished and why != "wall":
                tid = unfinished[-1]
                killed[tid] = "timeout" if why == "hang" else f"crashed (exit {proc.returncode})"
                f.write(tid + "\n")
        left = [t for t in collected if t not in finished and t not in killed]
        if why == "wall" or not left or not collected:
            if why == "wall":
                for t in left:
                    killed.setdefault(t, "not run (wall limit)")
            break
        restarts += 1
        log(f"    restarting {stem} on {target} ({len(left)} tests left; {restarts} restarts)")
    logf.close()
    secs = time.time() - t0
    with open(meta, "w") as f:
        json.dump({"secs": secs, "killed": killed, "restarts": restarts}, f)
    return {"results": _results(events, killed), "secs": secs}


def _results(events: str, killed: dict) -> dict:
    res: dict[str, dict] = {}
    collected: list[str] = []
    for e in _read_events(events):
        if e["kind"] == "report":
            res[e["id"]] = e
        elif e["kind"] == "collected" and not collected:
            collected = e["ids"]
    for tid, why in killed.items():
        outcome = "timeout" if why == "timeout" else ("not-run" if why.startswith("not run") else "crashed")
        res[tid] = {"id": tid, "outcome": outcome, "etype": outcome.capitalize(), "msg": why, "secs": 0.0}
    for tid in collected:
        res.setdefault(tid, {"id": tid, "outcome": "not-run", "etype": "NotRun", "msg": "", "secs": 0.0})
    return res


# ---------------------------------------------------------------------------
# comparison


def test_key(tid: str) -> str:
    """``TestFooCPU::test_x_cpu_float32`` and ``TestFooPRIVATEUSE1::test_x_tpu_float32`` -> one key."""
    cls, _, name = tid.partition("::")
    cls = re.sub(r"(CPU|PRIVATEUSE1|TPU)$", "", cls)
    name = re.sub(r"_(cpu|tpu)(?=(_|$))(?!.*_(cpu|tpu)(_|$))", "_DEV", name)
    return f"{cls}::{name}"


_DTYPE = re.compile(r"\b(torch\.)?(u?int(8|16|32|64)|float(8\w*|16|32|64)?|bfloat16|half|double|long|short|"
                    r"c?float|cdouble|complex(32|64|128)?|bool|q?u?int\d+x?\d*|Float|Double|Long|Int|Short|Byte|"
                    r"Char|Half|BFloat16|Bool|ComplexFloat|ComplexDouble|ComplexHalf)\b")


def normalize(msg: str) -> str:
    m = msg.strip().splitlines()[0] if msg.strip() else ""
    m = re.sub(r"0x[0-9a-fA-F]+", "0x?", m)
    m = _DTYPE.sub("<dtype>", m)
    m = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", m)
    m = re.sub(r"\s+", " ", m)
    return m[:160]


def compare(cpu: dict, tpu: dict) -> dict:
    cpu_pass = {test_key(t) for t, r in cpu.items() if r["outcome"] in PASSING}
    by_key = {test_key(t): r for t, r in tpu.items()}
    skipped = sorted(k for k in cpu_pass if k in by_key and by_key[k]["outcome"] == "skipped")
    applicable = sorted(k for k in cpu_pass if k in by_key and by_key[k]["outcome"] != "skipped")
    passed = [k for k in applicable if by_key[k]["outcome"] in PASSING]
    failed = [k for k in applicable if by_key[k]["outcome"] not in PASSING]
    groups: dict[tuple, list] = defaultdict(list)
    for k in failed:
        r = by_key[k]
        groups[(r["etype"], normalize(r["msg"]))].append(r["id"])
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return {"cpu_passing": len(cpu_pass), "applicable": len(applicable), "skipped_on_tpu": len(skipped),
            "passed": len(passed), "failed": len(failed),
            "groups": [{"etype": e, "msg": m, "count": len(ids), "example": sorted(ids)[0], "tests": sorted(ids)}
                       for (e, m), ids in ordered]}


def compiles(tpu: dict) -> tuple[int, list]:
    """Programs compiled in a tpu run: the total and the op families that compiled most."""
    by_op: dict[str, int] = defaultdict(int)
    for r in tpu.values():
        for k, v in (r.get("compiles") or {}).items():
            by_op[k] += v
    return sum(by_op.values()), sorted(by_op.items(), key=lambda kv: -kv[1])[:12]


def report(rows: list[dict], out=print) -> None:
    out("| file | mode | CPU-passing, run on tpu | pass on tpu | fail | skipped on tpu | CPU s | tpu s |")
    out("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        c = r["cmp"]
        pct = 100.0 * c["passed"] / c["applicable"] if c["applicable"] else 100.0
        out(f"| {r['file']} | {r['mode']} | {c['applicable']} | {c['passed']} ({pct:.1f}%) | {c['failed']} | "
            f"{c['skipped_on_tpu']} | {r['cpu_secs']:.0f} | {r['tpu_secs']:.0f} |")
    for r in rows:
        if r.get("compiles"):
            n, top = r["compiles"]
            out(f"\n{r['file']}, {r['mode']}: {n} programs compiled; most by "
                + ", ".join(f"{k} {v}" for k, v in top))
    for r in rows:
        c = r["cmp"]
        if not c["groups"]:
            continue
        out(f"\n{r['file']}, {r['mode']}: {c['failed']} failures in {len(c['groups'])} groups")
        for g in c["groups"]:
            out(f"- {g['count']} x {g['etype']}: {g['msg']}  (e.g. {g['example']})")


def _sample(path: str, out: str, k: int, kexpr: str | None) -> str:
    """A file of every ``k``-th test key of ``path`` (collected on the CPU, sorted by key: the
    same ``k`` picks the same tests), for ``PT_SUITE_SELECT``; both targets run just those."""
    stem = os.path.splitext(os.path.basename(path))[0]
    select = os.path.join(out, f"{stem}.sample{k}.txt")
    if os.path.exists(select):
        return select
    env = _env("cpu", out, "", "", 0.0, None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
           "--collect-only", path] + (["-k", kexpr] if kexpr else [])
    res = subprocess.run(cmd, cwd=os.path.dirname(path), env=env, capture_output=True, text=True)
    ids = [line.split("::", 1)[1] for line in res.stdout.splitlines() if "::" in line]
    keys = sorted({test_key(t) for t in ids})[::k]
    with open(select, "w") as f:
        f.write("".join(key + "\n" for key in keys))
    return select


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.pytorch_suite", description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True, help="a PyTorch checkout (files under DIR/test or DIR)")
    ap.add_argument("--files", nargs="+", required=True)
    ap.add_argument("--modes", default="strict,defer")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per test")
    ap.add_argument("--wall", type=float, default=3600.0, help="seconds per (file, mode) run")
    ap.add_argument("--out", default="/tmp/pytorch_suite")
    ap.add_argument("-k", dest="kexpr", default=None, help="pytest -k expression (a subset)")
    ap.add_argument("--sample", type=int, default=1, help="run every K-th test (by name)")
    ap.add_argument("--reuse", action="store_true", help="keep finished runs found under --out")
    ap.add_argument("--report-only", action="store_true", help="print from the runs under --out")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    modes = [m for m in args.modes.split(",") if m]
    rows = []
    for name in args.files:
        path = next((p for p in (os.path.join(args.src, "test", name), os.path.join(args.src, name))
                     if os.path.exists(p)), None)
        if path is None:
            print(f"{name}: not found under {args.src}", file=sys.stderr)
            return 2
        path = os.path.abspath(path)
        reuse = "report" if args.report_only else args.reuse
        select = None
        if args.sample > 1:
            select = _sample(path, args.out, args.sample, args.kexpr)
        print(f"{name}: cpu ...", flush=True)
        cpu = run_target(path, "cpu", args.out, timeout=args.timeout, wall=args.wall, kexpr=args.kexpr,
                         reuse=reuse, select=select)
        cpu_results, cpu_secs = cpu["results"], cpu["secs"]
        for mode in modes:
            print(f"{name}: tpu {mode} ...", flush=True)
            tpu = run_target(path, mode, args.out, timeout=args.timeout, wall=args.wall, kexpr=args.kexpr,
                             reuse=reuse, select=select)
            rows.append({"file": name, "mode": mode, "cmp": compare(cpu_results, tpu["results"]),
                         "cpu_secs": cpu_secs, "tpu_secs": tpu["secs"], "compiles": compiles(tpu["results"])})
    print()
    report(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0

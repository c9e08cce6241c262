"""Time to first step: lazyrt defer's compile vs the same math jitted in plain JAX.

    python -m perf.compile_time [--only adamw_many,mlp_train] [--repeat 3] [--json FILE]
                                [--no-strict] [--no-warm-cache]

For each workload, every measurement runs in a fresh subprocess (so no compile cache, in
memory or on disk, is shared between them):

* ``jax``: the workload's math written directly in JAX (below, same shapes, same update
  formulas, the hyperparameters as traced scalars) and ``jax.jit``-ed whole: lower and
  compile seconds and the size of its StableHLO, with lazyrt's XLA compile options so only
  the program differs;
* ``defer``: the workload on ``tpu`` in defer mode: each of its first three steps (wall and
  CPU seconds, programs compiled), the flush programs' lower and XLA-compile CPU seconds
  and StableHLO sizes, the process's peak RSS;
* ``strict``: the same workload in strict mode (first step and peak RSS, the memory bar);
* ``warm``: defer again, twice in two processes sharing a fresh ``LAZYRT_CACHE_DIR``; the
  second process's first step is the warm-cache time to first step.

Times are CPU seconds of the whole process (``time.process_time``: XLA compiles on a
thread pool, and CPU time is much less noisy than wall time on a shared machine); wall
seconds are reported beside them. With ``--repeat R`` each measurement runs R times and
the median is shown. The ratio column is lazyrt's compile (trace + lower + XLA compile of
the step's flush programs) over plain JAX's (lower + compile); its bar and the RSS bar are
in ``perf/targets.py``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from . import targets

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = ("inplace2", "adamw_many", "mlp_train", "gpt_train", "llama_infer")
N_PARAMS = 200


def _hlo_ops(text: str) -> int:
    return len(re.findall(r"^\s*%\S+ = ", text, re.M))


def _hlo_hist(text: str) -> dict:
    out: dict = {}
    for name in re.findall(r"^\s*%\S+ = \"?([a-z_]+\.[a-z_]+)", text, re.M):
        out[name] = out.get(name, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------------------
# the workloads in plain JAX


def _jax_inplace2():
    """``p.mul_(s1); p.add_(g, alpha=s2)`` per parameter."""
    import jax
    import jax.numpy as jnp

    def step(ps, gs, s1, s2):
        return [p * s1 + g * s2 for p, g in zip(ps, gs)]

    ps = [jnp.ones((128, 128), jnp.float32) for _ in range(N_PARAMS)]
    gs = [jnp.ones((128, 128), jnp.float32) for _ in range(N_PARAMS)]
    return jax.jit(step, donate_argnums=(0,)), (ps, gs, 0.99, -0.01)


def _jax_adamw_many():
    """torch.optim.AdamW's for-loop (``_single_tensor_adam``, decoupled weight decay) over
    200 parameters of 128x128: the same eight tensor ops per parameter."""
    import jax
    import jax.numpy as jnp

    b1, b2, eps, wd = 0.9, 0.999, 1e-8, 0.01

    def step(ps, gs, ms, vs, lr, t):
        bc1 = 1 - b1 ** t
        bc2_sqrt = jnp.sqrt(1 - b2 ** t)
        step_size = lr / bc1
        out = []
        for p, g, m, v in zip(ps, gs, ms, vs):
            p = p * (1 - lr * wd)
            m = m + (1 - b1) * (g - m)
            v = v * b2 + (1 - b2) * g * g
            p = p + (-step_size) * m / (jnp.sqrt(v) / bc2_sqrt + eps)
            out.append((p, m, v))
        return out

    def mk():
        return [jnp.ones((128, 128), jnp.float32) for _ in range(N_PARAMS)]

    return jax.jit(step, donate_argnums=(0, 2, 3)), (mk(), mk(), mk(), mk(), 1e-2, 1.0)


def _jax_train(name):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from . import jax_floor

    params, loss_fn, lr = jax_floor.SETUPS[name](np.random.default_rng(0))

    def step(p, m, v, t):
        loss, g = jax.value_and_grad(loss_fn)(p)
        p, m, v = jax_floor._adamw(p, g, m, v, t, lr)
        return p, m, v, loss

    m = jax.tree.map(jnp.zeros_like, params)
    v = jax.tree.map(jnp.zeros_like, params)
    return jax.jit(step, donate_argnums=(0, 1, 2)), (params, m, v, 1.0)


def _jax_llama_infer(V=512, D=256, H=4, KV=2, HID=512, L=2, T=128, B=1):
    """``perf.workloads.Llama``'s forward, and the last position's top logit."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    hd = D // H

    def P(*s):
        return jnp.asarray(rng.standard_normal(s) * 0.05, jnp.float32)

    layers = [{"ln1": jnp.ones(D), "q": P(H * hd, D), "k": P(KV * hd, D), "v": P(KV * hd, D),
               "o": P(D, H * hd), "ln2": jnp.ones(D), "gate": P(HID, D), "up": P(HID, D),
               "down": P(D, HID)} for _ in range(L)]
    params = {"emb": P(V, D), "layers": layers, "norm": jnp.ones(D), "head": P(V, D)}
    idx = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)

    def rms(x, w):
        return w * (x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6))

    def rot(x):
        x1, x2 = jnp.split(x, 2, -1)
        return jnp.concatenate([-x2, x1], -1)

    def fwd(p, idx):
        x = p["emb"][idx]
        inv = 1.0 / (10000.0 ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd))
        fr = jnp.outer(jnp.arange(T, dtype=jnp.float32), inv)
        emb = jnp.concatenate([fr, fr], -1)
        cos, sin = jnp.cos(emb), jnp.sin(emb)
        causal = jnp.tril(jnp.ones((T, T), bool))
        for lp in p["layers"]:
            h = rms(x, lp["ln1"])
            q = (h @ lp["q"].T).reshape(B, T, H, hd).transpose(0, 2, 1, 3)
            k = (h @ lp["k"].T).reshape(B, T, KV, hd).transpose(0, 2, 1, 3)
            v = (h @ lp["v"].T).reshape(B, T, KV, hd).transpose(0, 2, 1, 3)
            q = q * cos + rot(q) * sin
            k = k * cos + rot(k) * sin
            k, v = jnp.repeat(k, H // KV, 1), jnp.repeat(v, H // KV, 1)
            s = jnp.where(causal, (q @ k.transpose(0, 1, 3, 2)) / np.sqrt(hd), -jnp.inf)
            a = (jax.nn.softmax(s, -1) @ v).transpose(0, 2, 1, 3).reshape(B, T, D)
            x = x + a @ lp["o"].T
            h = rms(x, lp["ln2"])
            x = x + (jax.nn.silu(h @ lp["gate"].T) * (h @ lp["up"].T)) @ lp["down"].T
        logits = rms(x, p["norm"]) @ p["head"].T
        return logits[:, -1].max()

    return jax.jit(fwd), (params, idx)


JAX_PROGRAMS = {
    "inplace2": _jax_inplace2,
    "adamw_many": _jax_adamw_many,
    "mlp_train": lambda: _jax_train("mlp_train"),
    "gpt_train": lambda: _jax_train("gpt_train"),
    "llama_infer": _jax_llama_infer,
}


def measure_jax(name: str) -> dict:
    import jax

    from lazyrt._exec.xla import compile_options  # the same options lazyrt compiles with

    fn, args = JAX_PROGRAMS[name]()
    opts = compile_options()
    c0, w0 = time.process_time(), time.perf_counter()
    lowered = fn.lower(*args)
    c1, w1 = time.process_time(), time.perf_counter()
    exe = lowered.compile(compiler_options=opts) if opts else lowered.compile()
    c2, w2 = time.process_time(), time.perf_counter()
    jax.block_until_ready(exe(*args))
    text = lowered.as_text()
    return {"lower_cpu_s": c1 - c0, "compile_cpu_s": c2 - c1, "lower_wall_s": w1 - w0,
            "compile_wall_s": w2 - w1, "total_cpu_s": c2 - c0, "total_wall_s": w2 - w0,
            "ops": _hlo_ops(text), "hist": _hlo_hist(text), "rss_mb": _rss_mb()}


# ---------------------------------------------------------------------------
# the workloads on tpu


class _Inplace2:
    """200 parameters, ``p.mul_(0.99); p.add_(g, alpha=-0.01)`` each, then sync."""

    training = False

    def __init__(self, device):
        import torch

        torch.manual_seed(0)
        self.ps = [torch.randn(128, 128).to(device) for _ in range(N_PARAMS)]
        self.gs = [torch.randn(128, 128).to(device) for _ in range(N_PARAMS)]

    def step(self):
        import lazyrt

        for p, g in zip(self.ps, self.gs):
            p.mul_(0.99)
            p.add_(g, alpha=-0.01)
        lazyrt.sync()


def measure_lazyrt(name: str, mode: str, steps: int = 3) -> dict:
    import lazyrt
    from lazyrt._exec import xla as _xla

    lazyrt.set_mode(mode)
    programs: list = []
    orig_compile, orig_program = _xla.compile, _xla.compile_program

    def compile_(lowered, opts=None):
        c0 = time.process_time()
        exe = orig_compile(lowered, opts)
        xla_s = time.process_time() - c0
        if mode == "defer":
            text = lowered.as_text()
            programs.append({"xla_cpu_s": xla_s, "ops": _hlo_ops(text), "hist": _hlo_hist(text),
                             "probe_s": time.process_time() - c0 - xla_s})
        else:
            programs.append({"xla_cpu_s": xla_s, "probe_s": 0.0})
        return exe

    def compile_program(*a, **k):
        c0 = time.process_time()
        out = orig_program(*a, **k)
        # (what this harness's own as_text() above cost is not lazyrt's)
        programs[-1]["total_cpu_s"] = time.process_time() - c0 - programs[-1]["probe_s"]
        return out

    _xla.compile, _xla.compile_program = compile_, compile_program
    if name == "inplace2":
        wl = _Inplace2("tpu")
    else:
        from .workloads import WORKLOADS

        wl = WORKLOADS[name]("tpu", mode)
    lazyrt.sync()
    programs.clear()
    res: dict = {"steps": []}
    for _ in range(steps):
        c0, w0 = time.process_time(), time.perf_counter()
        wl.step()
        st = {"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - w0,
              "compiles": len(programs)}
        if mode == "defer":
            big = [p for p in programs if p["ops"] >= 50]
            st["programs"] = big
            st["small_programs"] = len(programs) - len(big)
        st["compile_cpu_s"] = sum(p.get("total_cpu_s", 0.0) for p in programs)
        st["xla_cpu_s"] = sum(p["xla_cpu_s"] for p in programs)
        st["cpu_s"] -= sum(p["probe_s"] for p in programs)
        res["steps"].append(st)
        programs.clear()
    res["rss_mb"] = _rss_mb()
    return res


# ---------------------------------------------------------------------------
# driver


def _worker(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", required=True, choices=["jax", "defer", "strict"])
    ap.add_argument("--workload", required=True)
    ap.add_argument("--json", required=True)
    a = ap.parse_args(argv)
    try:
        if a.side == "jax":
            res = measure_jax(a.workload)
        else:
            res = measure_lazyrt(a.workload, a.side)
        res["ok"] = True
    except Exception as e:  # reported, not raised: the table shows the failure
        import traceback

        res = {"ok": False, "error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()}
    with open(a.json, "w") as f:
        json.dump(res, f)
    sys.stdout.flush()
    os._exit(0)


def _run(side: str, name: str, env: dict | None = None, timeout: float = 900) -> dict:
    fd, path = tempfile.mkstemp(prefix="ctime_", suffix=".json")
    os.close(fd)
    wenv = dict(os.environ)
    wenv.update(env or {})
    cmd = [sys.executable, "-m", "perf.compile_time", "--worker", "--side", side,
           "--workload", name, "--json", path]
    try:
        p = subprocess.run(cmd, cwd=_ROOT, env=wenv, capture_output=True, text=True,
                           timeout=timeout, check=False)
        with open(path) as f:
            text = f.read()
        res = json.loads(text) if text.strip() else {
            "ok": False, "error": f"exit {p.returncode}: {p.stderr[-2000:]}"}
    except subprocess.TimeoutExpired:
        res = {"ok": False, "error": f"timed out after {timeout} s"}
    finally:
        os.unlink(path)
    return res


def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _lazy_summary(runs: list[dict]) -> dict:
    ok = [r for r in runs if r.get("ok")]
    if not ok:
        return {"ok": False, "error": runs[0].get("error")}
    s1 = [r["steps"][0] for r in ok]
    out = {"ok": True, "rss_mb": _med([r["rss_mb"] for r in ok]),
           "step_cpu_s": [_med([r["steps"][i]["cpu_s"] for r in ok]) for i in range(3)],
           "step_wall_s": [_med([r["steps"][i]["wall_s"] for r in ok]) for i in range(3)],
           "compiles": [ok[0]["steps"][i]["compiles"] for i in range(3)],
           "compile_cpu_s": _med([s["compile_cpu_s"] for s in s1]),
           "xla_cpu_s": _med([s["xla_cpu_s"] for s in s1]),
           "compile2_cpu_s": _med([r["steps"][1]["compile_cpu_s"] for r in ok])}
    if "programs" in s1[0]:
        progs = s1[0]["programs"]
        out["ops"] = sum(p["ops"] for p in progs)
        out["hist"] = progs[0]["hist"] if len(progs) == 1 else None
        out["programs_step1"] = len(progs)
        out["big_programs"] = [len(r["steps"][i]["programs"]) for r in ok[:1] for i in range(3)]
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--worker":
        return _worker(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m perf.compile_time")
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-strict", action="store_true")
    ap.add_argument("--no-warm-cache", action="store_true")
    a = ap.parse_args(argv)
    names = [n.strip() for n in a.only.split(",") if n.strip()]
    for n in names:
        if n not in JAX_PROGRAMS:
            ap.error(f"unknown workload {n!r}; choose from {list(JAX_PROGRAMS)}")
    results = {}
    for name in names:
        raw: dict = {"jax": [], "defer": [], "strict": [], "warm": []}
        for _ in range(a.repeat):
            raw["jax"].append(_run("jax", name))
            raw["defer"].append(_run("defer", name))
            if not a.no_strict:
                raw["strict"].append(_run("strict", name))
            if not a.no_warm_cache:
                with tempfile.TemporaryDirectory(prefix="lazyrt_cache_") as d:
                    env = {"LAZYRT_CACHE_DIR": d}
                    _run("defer", name, env)
                    raw["warm"].append(_run("defer", name, env))
        jx = [r for r in raw["jax"] if r.get("ok")]
        res = {"jax": {"ok": bool(jx)} if jx else raw["jax"][0]}
        if jx:
            res["jax"].update({
                "total_cpu_s": _med([r["total_cpu_s"] for r in jx]),
                "lower_cpu_s": _med([r["lower_cpu_s"] for r in jx]),
                "compile_cpu_s": _med([r["compile_cpu_s"] for r in jx]),
                "total_wall_s": _med([r["total_wall_s"] for r in jx]),
                "ops": jx[0]["ops"], "hist": jx[0]["hist"]})
        res["defer"] = _lazy_summary(raw["defer"])
        if raw["strict"]:
            res["strict"] = _lazy_summary(raw["strict"])
        if raw["warm"]:
            res["warm"] = _lazy_summary(raw["warm"])
        results[name] = res
        _print_row(name, res)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"results": results, "loadavg": os.getloadavg()}, f, indent=1)
    return 0


def _f(x, fmt="{:.2f}"):
    return "-" if x is None else fmt.format(x)


def _print_row(name: str, res: dict) -> None:
    jx, d = res["jax"], res["defer"]
    print(f"== {name}", flush=True)
    if not jx.get("ok") or not d.get("ok"):
        print(f"   failed: jax {jx.get('error')} / defer {d.get('error')}")
        return
    ratio = d["compile_cpu_s"] / jx["total_cpu_s"] if jx["total_cpu_s"] else None
    per = f" ({d['ops'] / N_PARAMS:.1f}/param)" if name in ("inplace2", "adamw_many") else ""
    jper = f" ({jx['ops'] / N_PARAMS:.1f}/param)" if name in ("inplace2", "adamw_many") else ""
    print(f"   plain JAX : lower+compile {jx['total_cpu_s']:.2f} s cpu "
          f"(lower {jx['lower_cpu_s']:.2f}, compile {jx['compile_cpu_s']:.2f}), "
          f"{jx['ops']} StableHLO ops{jper}")
    print(f"   defer     : step-1 compile {d['compile_cpu_s']:.2f} s cpu "
          f"(XLA {d['xla_cpu_s']:.2f}), {d['ops']} StableHLO ops{per} in "
          f"{d['programs_step1']} program(s); ratio defer/JAX {_f(ratio)}x "
          f"(bar {targets.COMPILE_VS_JAX:g}x)")
    print(f"               steps 1-3: {' / '.join(_f(x) for x in d['step_cpu_s'])} s cpu, "
          f"{' / '.join(_f(x) for x in d['step_wall_s'])} s wall; programs compiled per "
          f"step {d['compiles']} (step 2 compile {d['compile2_cpu_s']:.2f} s cpu); "
          f"peak RSS {d['rss_mb']:.0f} MB")
    s = res.get("strict")
    if s and s.get("ok"):
        print(f"   strict    : step 1 {s['step_cpu_s'][0]:.2f} s cpu, peak RSS {s['rss_mb']:.0f} MB;"
              f" defer/strict RSS {d['rss_mb'] / s['rss_mb']:.2f}x "
              f"(bar {targets.RSS_DEFER_VS_STRICT:g}x)")
    w = res.get("warm")
    if w and w.get("ok"):
        print(f"   warm cache: step 1 {w['step_cpu_s'][0]:.2f} s cpu / {w['step_wall_s'][0]:.2f} s "
              f"wall (second process, LAZYRT_CACHE_DIR); compiles {w['compiles']}")
    if d.get("hist"):
        top = ", ".join(f"{k.split('.')[-1]} {v}" for k, v in list(d["hist"].items())[:8])
        print(f"   defer ops : {top}")
    top = ", ".join(f"{k.split('.')[-1]} {v}" for k, v in list(jx["hist"].items())[:8])
    print(f"   JAX ops   : {top}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())

"""Time to the first results, in fresh processes: cold (an empty compile cache) and warm
(a second process with the same cache), for PyTorch CPU eager and lazyrt's strict and defer.

    python -m perf.first_calls [--only unet_train,cnn_train] [--modes cpu,strict,defer]
                               [--steady 5] [--json FILE] [--lazyrt PATH] [--cache xdg|dir]
                               [--config LABEL=PATH[,K=V...]]... [--cold-only LABEL,...]

Rows (``ROWS``): a tiny diffusers ``UNet2DConditionModel`` training step (AdamW), a tiny
Llama's ``generate(num_beams=2, cache_implementation="static")``, a MobileNetV2-like CNN
(transformers' ``MobileNetV2ForImageClassification``) training step, and ``gpt_train`` from
``perf/workloads.py``. A training row's figure is the wall time from the end of the imports
to the end of its third step (model built on the CPU, moved to ``tpu``, three steps, each
reading its loss); the generation row's is its first ``generate`` call. Then ``--steady``
more steps (calls) are run: their median time and their compiles are the steady state.

For each (row, lazyrt mode) the driver makes a fresh cache: with ``--cache xdg`` (default)
an empty ``XDG_CACHE_HOME``, so lazyrt runs with its default settings (whatever they are in
the tree measured); with ``--cache dir`` an empty ``LAZYRT_CACHE_DIR``. It runs the cold
process, then the warm one with the same cache. ``--lazyrt PATH`` measures the lazyrt
package under PATH (another checkout) with this harness. Columns: seconds to the first
results, programs compiled (``cache_misses``), seconds lazyrt spent compiling and
executing (its counters; time not in either is Python: tracing, dispatch, PyTorch), and
the losses' largest relative difference from CPU's. A second table splits each figure
into the row's model build (the builder constructing the model on the CPU, its lazy imports
included, before ``.to(device)``; wall and process CPU seconds) and the rest (lazyrt's
part, with the model's own Python per step), and gives warm / cold of both in CPU seconds.
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
ROWS = ("unet_train", "llama_beam", "cnn_train", "gpt_train")
STEPS = 3


# ---------------------------------------------------------------------------
# the rows (built on the CPU from a fixed seed, then moved to the device)


def _timed(fn):
    """``fn()`` and the (wall, process CPU) seconds it took: the rows' builders report the
    model's construction on the CPU (its lazy imports included), before ``.to(device)``."""
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, (time.perf_counter() - t, time.process_time() - c)


class _Train:
    """A model, a batch and AdamW; ``step()`` is one training step returning its loss."""

    def __init__(self, device):
        import torch

        torch.manual_seed(0)
        self.device = device
        (self.model, self.batch), self.build_time = _timed(self.build)
        self.model = self.model.to(device)
        self.batch = [b.to(device) for b in self.batch]
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss(*self.batch)
        loss.backward()
        self.opt.step()
        return loss.item()


class UNetTrain(_Train):
    """diffusers UNet2DConditionModel (32/64 channels, cross-attention), batch 2 of 16x16."""

    def build(self):
        import torch
        from diffusers import UNet2DConditionModel

        m = UNet2DConditionModel(
            sample_size=16, in_channels=4, out_channels=4, layers_per_block=2,
            block_out_channels=(32, 64), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
            attention_head_dim=8, norm_num_groups=32)
        return m.train(), [torch.randn(2, 4, 16, 16), torch.tensor([10, 500]),
                           torch.randn(2, 8, 32), torch.randn(2, 4, 16, 16)]

    def loss(self, x, t, ctx, target):
        import torch.nn.functional as F

        return F.mse_loss(self.model(x, t, encoder_hidden_states=ctx).sample, target)


class CNNTrain(_Train):
    """transformers MobileNetV2 (depth multiplier 0.5, 96x96 images, 10 classes), batch 8;
    no classifier dropout, so that the losses compare with CPU's (the random streams differ)."""

    def build(self):
        import torch
        import transformers as tf

        cfg = tf.MobileNetV2Config(image_size=96, depth_multiplier=0.5, num_labels=10,
                                   classifier_dropout_prob=0.0)
        m = tf.MobileNetV2ForImageClassification(cfg)
        return m.train(), [torch.randn(8, 3, 96, 96), torch.randint(0, 10, (8,))]

    def loss(self, x, y):
        import torch.nn.functional as F

        return F.cross_entropy(self.model(pixel_values=x).logits, y)


class GPTTrain:
    """``perf.workloads.GPTTrain``."""

    def __init__(self, device):
        from perf.workloads import GPTTrain as W

        self.w = W(device, "defer" if device == "cpu" else "x")
        self.build_time = None  # built and moved in one constructor: not separable

    def step(self):
        return self.w.step()


class LlamaBeam:
    """A 2-layer Llama (hidden 64, vocab 128), beam search (2 beams) with a static cache, 8
    new tokens from a 6-token prompt; the 'loss' is the sum of the generated ids."""

    def __init__(self, device):
        import torch

        torch.manual_seed(0)
        model, self.build_time = _timed(self.build)
        self.model = model.to(device)
        self.ids = torch.randint(0, 128, (1, 6)).to(device)

    def build(self):
        import transformers as tf

        cfg = tf.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=128)
        return tf.LlamaForCausalLM(cfg).eval()

    def step(self):
        out = self.model.generate(self.ids, max_new_tokens=8, min_new_tokens=8, num_beams=2,
                                  do_sample=False, cache_implementation="static")
        return float(out.cpu().sum())


BUILDERS = {"unet_train": UNetTrain, "llama_beam": LlamaBeam, "cnn_train": CNNTrain,
            "gpt_train": GPTTrain}
FIRST = {"unet_train": STEPS, "cnn_train": STEPS, "gpt_train": STEPS, "llama_beam": 1}


# ---------------------------------------------------------------------------
# worker: one (row, mode) in this process


def _counters():
    import lazyrt

    c = lazyrt.metrics.counters()
    return {k: v for k, v in c.items() if isinstance(v, (int, float))}


def work(row: str, mode: str, steady: int) -> dict:
    t_imp = time.perf_counter()
    import torch  # noqa: F401

    if row == "unet_train":
        import diffusers  # noqa: F401
    else:
        import transformers  # noqa: F401
    device = "cpu"
    if mode != "cpu":
        import lazyrt

        lazyrt.set_mode(mode)
        device = "tpu"
    t0 = time.perf_counter()
    c0 = time.process_time()
    res: dict = {"row": row, "mode": mode, "import_s": t0 - t_imp}
    wl = BUILDERS[row](device)
    res["build_s"] = time.perf_counter() - t0
    if wl.build_time is not None:
        res["model_s"], res["model_cpu_s"] = wl.build_time
    losses, times = [], []
    for _ in range(FIRST[row]):
        t = time.perf_counter()
        losses.append(wl.step())
        times.append(time.perf_counter() - t)
    res["first_s"] = time.perf_counter() - t0
    res["first_cpu_s"] = time.process_time() - c0
    res["step_s"] = times
    if mode != "cpu":
        c = _counters()
        res.update(compiles=int(c["cache_misses"]), compile_s=c["compile_seconds"],
                   execute_s=c["execute_seconds"], disk_hits=int(c.get("disk_cache_hits", 0)),
                   tier_swaps=int(c.get("tier_swaps", 0)))
    if steady:
        before = _counters() if mode != "cpu" else None
        st = []
        for _ in range(steady):
            t = time.perf_counter()
            losses.append(wl.step())
            st.append(time.perf_counter() - t)
        res["steady_ms"] = 1000 * statistics.median(st)
        if before is not None:
            res["steady_compiles"] = int(_counters()["cache_misses"] - before["cache_misses"])
    res["losses"] = losses
    if mode != "cpu":
        import lazyrt

        res["cache_dir"] = getattr(lazyrt.config, "cache_dir", None)
        res["lazyrt"] = os.path.dirname(os.path.dirname(os.path.abspath(lazyrt.__file__)))
    res["load"] = os.getloadavg()[0]
    return res


# ---------------------------------------------------------------------------
# driver


def _run(row, mode, steady, env, timeout, lazyrt_path) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, "-m", "perf.first_calls", "--worker", row, mode, "--steady",
           str(steady), "--json", out]
    if lazyrt_path:
        cmd += ["--lazyrt", lazyrt_path]
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, cwd=_ROOT, capture_output=True, text=True,
                           timeout=timeout)
        with open(out) as f:
            res = json.load(f)
        if p.returncode != 0:
            res.setdefault("error", p.stderr[-2000:])
    except Exception as e:  # reported in the table
        res = {"row": row, "mode": mode, "error": f"{type(e).__name__}: {e}"}
    finally:
        if os.path.exists(out):
            os.unlink(out)
    res["process_s"] = time.perf_counter() - t
    return res


def _rel(a, b):
    if a is None or b is None:
        return None
    return max((abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)), default=None)


def _fmt(r: dict | None, cpu: dict | None) -> str:
    if r is None:
        return "-"
    if "error" in r and "first_s" not in r:
        return "error"
    s = f"{r['first_s']:.1f} s"
    if cpu and cpu.get("first_s"):
        s += f" ({r['first_s'] / cpu['first_s']:.1f}x)"
    s += f", cpu {r['first_cpu_s']:.1f} s"
    if "compiles" in r:
        s += f"; {r['compiles'] - r['disk_hits']} compiled"
        if r["disk_hits"]:
            s += f", {r['disk_hits']} loaded"
        s += f"; {r['compile_s']:.1f} s compiling, {r['execute_s']:.1f} s running"
    return s


def _rest(r: dict):
    """(wall, cpu) seconds to the first results less the model's build, or None."""
    if "model_s" not in r:
        return None
    return r["first_s"] - r["model_s"], r["first_cpu_s"] - r["model_cpu_s"]


def table(results: dict, cols: list) -> str:
    lines = ["| row | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for row, by in results.items():
        cpu = by.get("cpu")
        cells = [_fmt(by.get(c), None if c == "cpu" else cpu) for c in cols]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines += ["", "Model build: the row's builder constructing the model on the CPU (its lazy imports "
              "included), before ``.to(device)``; 'rest' = first results - build (lazyrt's part, "
              "plus the model's own Python per step); warm / cold of CPU seconds.", "",
              "| row | column | first results wall / cpu s | build wall / cpu s | "
              "rest wall / cpu s | warm / cold, total | warm / cold, rest |",
              "|---|---|---|---|---|---|---|"]
    for row, by in results.items():
        for c in cols:
            r = by.get(c) or {}
            if "first_s" not in r:
                continue
            rest = _rest(r)
            cold = by.get(c[:-len("warm")] + "cold") if c.endswith("warm") else None
            rt = rr = "-"
            if cold and "first_s" in cold:
                rt = f"{r['first_cpu_s'] / cold['first_cpu_s']:.2f}"
                if rest and _rest(cold):
                    rr = f"{rest[1] / _rest(cold)[1]:.2f}"
            b = (f"{r['model_s']:.1f} / {r['model_cpu_s']:.1f}" if "model_s" in r else "-")
            lines.append(f"| {row} | {c} | {r['first_s']:.1f} / {r['first_cpu_s']:.1f} | {b} | "
                         + (f"{rest[0]:.1f} / {rest[1]:.1f}" if rest else "-")
                         + f" | {rt} | {rr} |")
    lines += ["", "| row | column | steady ms | steady compiles | tier swaps | "
              "loss rel. diff vs CPU |", "|---|---|---|---|---|---|"]
    for row, by in results.items():
        cpu = by.get("cpu") or {}
        for c in cols:
            r = by.get(c) or {}
            if "steady_ms" in r:
                d = _rel(r.get("losses"), cpu.get("losses")) if c != "cpu" else None
                lines.append(f"| {row} | {c} | {r['steady_ms']:.1f} | "
                             f"{r.get('steady_compiles', '-')} | {r.get('tier_swaps', '-')} | "
                             f"{'-' if d is None else f'{d:.1e}'} |")
    return "\n".join(lines)


def _config(spec: str):
    """``label=PATH[,K=V...]``: lazyrt imported from PATH ('.': this tree) with env K=V."""
    label, _, rest = spec.partition("=")
    path, *env = rest.split(",") if rest else (".",)
    return label, (None if path in (".", "") else path), dict(e.split("=", 1) for e in env)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.first_calls",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(ROWS))
    ap.add_argument("--modes", default="cpu,strict,defer")
    ap.add_argument("--steady", type=int, default=5, help="steps after the first ones")
    ap.add_argument("--cache", default="xdg", choices=("xdg", "dir"))
    ap.add_argument("--lazyrt", default=None, help="import lazyrt from this directory")
    ap.add_argument("--config", action="append", default=None,
                    help="label=PATH[,K=V...]: measure lazyrt from PATH ('.': this tree) with "
                         "these environment variables, beside the other --config's (each "
                         "row runs every config in turn); default: one, this tree")
    ap.add_argument("--cold-only", default="",
                    help="labels of --config's measured cold only (no second process)")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", nargs=2, metavar=("ROW", "MODE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.lazyrt:
        sys.path.insert(0, os.path.abspath(a.lazyrt))
    if a.worker:
        row, mode = a.worker
        try:
            res = work(row, mode, a.steady)
        except Exception as e:
            import traceback

            res = {"row": row, "mode": mode, "error": f"{type(e).__name__}: {e}",
                   "tb": traceback.format_exc()}
        with open(a.json, "w") as f:
            json.dump(res, f)
        return 0 if "error" not in res else 1

    rows = [r.strip() for r in a.only.split(",") if r.strip()]
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    configs = [_config(c) for c in a.config] if a.config else [("", a.lazyrt, {})]
    base = dict(os.environ)
    for k in ("TORCH_TPU_MODE", "LAZYRT_CACHE_DIR", "LAZYRT_COMPILE"):
        base.pop(k, None)
    base.setdefault("JAX_PLATFORMS", "cpu")
    print(f"load avg {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores; configs "
          f"{[(lbl, p or _ROOT, env) for lbl, p, env in configs]}; cache {a.cache}", flush=True)
    results: dict = {}
    cols: list = []
    for row in rows:
        by: dict = {}
        results[row] = by
        for mode in modes:
            if mode == "cpu":
                by["cpu"] = _run(row, "cpu", a.steady, base, a.timeout, None)
                print(f"{row} cpu: {_fmt(by['cpu'], None)}", flush=True)
                if "cpu" not in cols:
                    cols.append("cpu")
                continue
            for label, path, extra in configs:
                with tempfile.TemporaryDirectory(prefix="lazyrt-first-") as tmp:
                    env = dict(base, **extra)
                    if a.cache == "xdg":
                        env["XDG_CACHE_HOME"] = tmp
                    else:
                        env["LAZYRT_CACHE_DIR"] = tmp
                    cold_only = [x for x in a.cold_only.split(",") if x]
                    kinds = ("cold",) if label in cold_only else ("cold", "warm")
                    for kind in kinds:
                        col = " ".join(x for x in (label, mode, kind) if x)
                        if col not in cols:
                            cols.append(col)
                        r = _run(row, mode, a.steady, env, a.timeout, path)
                        by[col] = r
                        print(f"{row} {col}: {_fmt(r, by.get('cpu'))}"
                              + (f"  ERROR {r['error'][-300:]}" if "error" in r else ""),
                              flush=True)
    print()
    print(f"load avg at the end {os.getloadavg()[0]:.1f}")
    print(table(results, cols))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"load": os.getloadavg(), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

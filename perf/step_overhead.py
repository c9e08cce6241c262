"""Host time per training step that is not kernel time: the ``mlp_train`` step (3 Linear
layers, AdamW, ``loss.item()``) at a tiny width, where every kernel costs next to nothing,
so the step's time is the Python/C++ machinery around the kernels.

    python -m perf.step_overhead [--width 8] [--steps 40] [--warmup 20] [--repeat 3]
                                 [--skip "cpu aot_eager"]

Rows, each in a fresh process (median step, median of ``--repeat`` rounds):

- ``cpu eager``: PyTorch CPU eager (autograd, the optimizer's Python, C++ kernels);
- ``cpu aot_eager`` / ``+ step``: ``torch.compile(model, backend="aot_eager")`` (and the
  optimizer step compiled too) on CPU tensors: Dynamo's guards, AOTAutograd's runtime
  wrappers, eager kernels. What ``torch.compile`` itself costs per step, with no backend
  work at all;
- ``tpu floor``: the least any Python ``__torch_dispatch__`` backend on the ``tpu`` device
  costs: a wrapper tensor around a CPU tensor whose dispatch only unwraps the arguments,
  calls PyTorch's CPU kernel and wraps the outputs (no lowering, recording or program).
  It pays what lazyrt pays around its own work: Python dispatch per op, autograd's device
  thread, the optimizer's foreach Python;
- ``tpu strict`` / ``tpu defer`` / ``tpu compiled`` / ``tpu compiled + step``: lazyrt.

A whole-step plain-JAX program has about 0.1 ms of host time, so on a CPU (where the
host's cores are the device's) a compiled step can be no closer to that floor than this
machinery allows. Reported, never asserted.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import subprocess
import sys

CONFIGS = [("cpu", "eager", False), ("cpu", "aot_eager", False), ("cpu", "aot_eager", True),
           ("tpu", "floor", False), ("tpu", "strict", False), ("tpu", "defer", False),
           ("tpu", "compiled", False), ("tpu", "compiled", True)]


@functools.cache
def _floor_type():
    """A wrapper tensor on ``tpu`` whose ops run PyTorch's CPU kernels on an inner tensor
    (one class per process: torch.optim's foreach list gets it once)."""
    import torch
    import torch.optim.optimizer as optim_mod

    import lazyrt  # noqa: F401  (registers the tpu device)

    make, dev = torch.Tensor._make_wrapper_subclass, torch.device("tpu:0")

    class Floor(torch.Tensor):
        __torch_function__ = torch._C._disabled_torch_function_impl

        @staticmethod
        def __new__(cls, inner):
            r = make(cls, inner.shape, strides=inner.stride(), dtype=inner.dtype, device=dev,
                     requires_grad=inner.requires_grad)
            r._t = inner
            return r

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            args = [a._t if type(a) is Floor else
                    [b._t if type(b) is Floor else b for b in a] if type(a) is list else a
                    for a in args]
            if kwargs:
                out = func(*args, **{k: v._t if type(v) is Floor else v
                                     for k, v in kwargs.items()})
            else:
                out = func(*args)
            if type(out) is torch.Tensor:
                return Floor(out)
            if type(out) in (list, tuple):
                return type(out)(Floor(o) if type(o) is torch.Tensor else o for o in out)
            return out

    # torch.optim takes its foreach path on the tpu device, as it does for lazyrt's tensor
    optim_mod._foreach_supported_types.append(Floor)
    return Floor


def _on_floor(model):
    """``model`` with each parameter moved under the floor wrapper (in place)."""
    from torch import nn

    floor = _floor_type()
    for m in model.modules():
        for name, p in list(m.named_parameters(recurse=False)):
            setattr(m, name, nn.Parameter(floor(p.detach().clone())))
    return model


def _run_one(device: str, kind: str, step: bool, width: int, steps: int,
             warmup: int) -> tuple[float, float, float]:
    import time

    import torch
    import torch.nn.functional as F
    from torch import nn

    if device == "tpu" and kind != "floor":
        import lazyrt

        lazyrt.set_mode("strict" if kind == "strict" else "defer")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width),
                          nn.ReLU(), nn.Linear(width, 10))
    x = torch.randn(64, width)
    y = torch.randint(0, 10, (64,))
    if kind == "floor":
        floor = _floor_type()
        model, x, y = _on_floor(model), floor(x), floor(y)
    else:
        model, x, y = model.to(device), x.to(device), y.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if kind in ("aot_eager", "compiled"):
        kw = {"backend": "aot_eager"} if kind == "aot_eager" else {}
        model = torch.compile(model, **kw)
        if step:
            opt.step = torch.compile(opt.step, **kw)
    ts, cs, hs = [], [], []
    for i in range(warmup + steps):
        t0, c0, h0 = time.perf_counter(), time.process_time(), time.thread_time()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
        if i >= warmup:
            ts.append(time.perf_counter() - t0)
            cs.append(time.process_time() - c0)
            hs.append(time.thread_time() - h0)
    return (statistics.median(ts) * 1e3, statistics.median(cs) * 1e3,
            statistics.median(hs) * 1e3)


def _label(device, kind, step):
    return f"{device} {kind}" + (" + step" if step else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.step_overhead")
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip", default="",
                    help="comma-separated rows to leave out, e.g. 'cpu aot_eager'")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one is not None:  # a worker: one configuration, in this process
        device, kind, step = a.one.split(":")
        print(*_run_one(device, kind, step == "1", a.width, a.steps, a.warmup))
        return 0
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    configs = [c for c in CONFIGS if _label(*c) not in skip and f"{c[0]} {c[1]}" not in skip]
    res: dict = {c: [] for c in configs}
    cpu: dict = {c: [] for c in configs}
    thr: dict = {c: [] for c in configs}
    for r in range(a.repeat):
        # each round starts from the next configuration, so none always runs first
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        for c in order:
            env_one = f"{c[0]}:{c[1]}:{int(c[2])}"
            out = subprocess.run(
                [sys.executable, "-m", "perf.step_overhead", "--one", env_one,
                 "--width", str(a.width), "--steps", str(a.steps), "--warmup", str(a.warmup)],
                capture_output=True, text=True, timeout=600)
            if out.returncode != 0:
                raise SystemExit(f"{_label(*c)} failed:\n{out.stderr[-2000:]}")
            wall, proc, thread = out.stdout.strip().splitlines()[-1].split()
            res[c].append(float(wall))
            cpu[c].append(float(proc))
            thr[c].append(float(thread))
    print(f"mlp_train step at width {a.width} (kernels ~free): median ms per step (wall; the "
          f"process's CPU time, all threads; the CPU time of the thread running the step), "
          f"median of {a.repeat} rounds")
    for c in configs:
        print(f"  {_label(*c):24s} {statistics.median(res[c]):7.3f} ms   "
              f"cpu {statistics.median(cpu[c]):7.3f} ms   "
              f"thread {statistics.median(thr[c]):7.3f} ms   "
              f"(rounds: {', '.join(f'{v:.3f}' for v in res[c])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Distributed ``tpu`` timings: DDP and FSDP2 step time on 2 ranks vs 1, flushes per step,
and the cost of one collective. Reported, never asserted.

    python -m perf.distributed [--steps 10] [--warmup 4] [--world 1,2] [--modes strict,defer,fused]
                               [--wrappers ddp,fsdp2] [--width 512] [--batch 32] [--json FILE]

Every (world size, wrapper, mode) runs in fresh processes (one per rank, env:// on
127.0.0.1, ``LAZYRT_DIST_FUSED`` for ``fused``); each rank trains the same MLP at the same
per-rank batch, and rank 0 reports the median step (the step ends when the updated
parameters are ready), flushes per step (defer) and executions per step. The collective
micro-benchmark (2 ranks) times one all_reduce run isolated (its own program, strict mode)
and the per-collective share of 16 all_reduces fused into one program, for three sizes,
and the cross-rank check a fused flush makes.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------
# one rank
# ---------------------------------------------------------------------------


def _model(width: int, depth: int = 4):
    import torch

    torch.manual_seed(0)
    layers = [torch.nn.Linear(64, width), torch.nn.GELU()]
    for _ in range(depth - 2):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    layers.append(torch.nn.Linear(width, 16))
    return torch.nn.Sequential(*layers)


def _ready(model) -> None:
    from lazyrt.distributed import _rt

    p = next(model.parameters())
    p = getattr(p, "_local_tensor", p)  # a DTensor parameter: its local shard, no op
    _rt.wait_ready(p)


def _train(args, wrapper: str, mode: str) -> dict:
    import torch
    import torch.distributed as dist

    import lazyrt
    from lazyrt.metrics import COUNTERS

    lazyrt.set_mode("strict" if mode == "strict" else "defer")
    model = _model(args.width).to("tpu")
    if wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        run = DDP(model, gradient_as_bucket_view=True)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("tpu", (dist.get_world_size(),))
        for m in model:
            if isinstance(m, torch.nn.Linear):
                fully_shard(m, mesh=mesh)
        run = fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(args.batch, 64, generator=g).to("tpu")
    y = torch.randn(args.batch, 16, generator=g).to("tpu")
    times, flushes, execs = [], [], []
    for step in range(args.warmup + args.steps):
        f0, e0 = COUNTERS["flushes"], COUNTERS["executions"]
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(run(x), y)
        loss.backward()
        opt.step()
        _ready(model)
        dt = time.perf_counter() - t0
        if os.environ.get("LAZYRT_PERF_SHOW_FLUSHES") and dist.get_rank() == 0:
            from lazyrt import memory

            print("step", step, [(r.name, r.source.rsplit("/", 1)[-1], r.num_ops)
                                 for r in memory.flush_log()[-6:] if r.mode == "defer"],
                  file=sys.stderr, flush=True)
        if step >= args.warmup:
            times.append(dt * 1e3)
            flushes.append(COUNTERS["flushes"] - f0)
            execs.append(COUNTERS["executions"] - e0)
    loss.item()
    return {"step_ms": statistics.median(times), "step_ms_min": min(times),
            "flushes_per_step": statistics.median(flushes),
            "executions_per_step": statistics.median(execs)}


def _collectives(args) -> dict:
    import torch
    import torch.distributed as dist

    import lazyrt
    import lazyrt.distributed as ld
    from lazyrt.distributed import _engine, _rt

    out = {}
    for n in (1024, 65536, 1 << 20):
        t = torch.ones(n, device="tpu")
        with lazyrt.set_mode("strict"):
            for _ in range(3):
                dist.all_reduce(t)
            _rt.array_of(t).block_until_ready()
            ts = []
            for _ in range(args.steps):
                t0 = time.perf_counter()
                dist.all_reduce(t)
                _rt.array_of(t).block_until_ready()
                ts.append((time.perf_counter() - t0) * 1e6)
        out[f"isolated all_reduce {n} floats (us)"] = statistics.median(ts)
        ts = []
        with lazyrt.set_mode("defer"), ld.fused():
            k = 16
            ps = [torch.ones(n, device="tpu") for _ in range(k)]
            for rep in range(args.steps + 2):
                t0 = time.perf_counter()
                for p in ps:
                    dist.all_reduce(p)
                lazyrt.sync()
                _rt.array_of(ps[-1]).block_until_ready()
                if rep >= 2:
                    ts.append((time.perf_counter() - t0) * 1e6 / k)
        out[f"fused all_reduce {n} floats, per collective of 16 (us)"] = statistics.median(ts)
    st = _engine.STATS
    if st["checks"]:
        out["cross-rank check per fused flush (us)"] = st["check_seconds"] / st["checks"] * 1e6
    return out


def _rank_main(args) -> None:
    import torch.distributed as dist

    import lazyrt  # noqa: F401

    dist.init_process_group("tpu")
    if args.case == "collectives":
        res = _collectives(args)
    else:
        wrapper, mode = args.case.split(":")
        res = _train(args, wrapper, mode)
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------------------
# the driver
# ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(args, case: str, world: int, fused: bool, timeout: float = 600) -> dict:
    port = _free_port()
    out = tempfile.mktemp(suffix=".json")
    procs = []
    for r in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                   WORLD_SIZE=str(world), LOCAL_RANK=str(r), JAX_PLATFORMS="cpu",
                   LAZYRT_DIST_FUSED="1" if fused else "0",
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [sys.executable, "-m", "perf.distributed", "--rank-worker", "--case", case,
               "--out", out, "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--width", str(args.width), "--batch", str(args.batch)]
        procs.append(subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True))
    deadline = time.monotonic() + timeout
    errs = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    os.killpg(q.pid, signal.SIGKILL)
            raise RuntimeError(f"{case} on {world} ranks timed out") from None
        errs.append(err)
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{case} on {world} ranks failed:\n" + "\n".join(e[-2000:] for e in errs))
    with open(out) as f:
        return json.load(f)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--world", default="1,2")
    ap.add_argument("--modes", default="strict,defer,fused")
    ap.add_argument("--wrappers", default="ddp,fsdp2")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--no-collectives", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank_worker:
        _rank_main(args)
        return 0
    rows = []
    print(f"MLP 64-{args.width}x3-16 (GELU), AdamW, per-rank batch {args.batch}; "
          f"median of {args.steps} steps after {args.warmup}")
    print(f"{'wrapper':8} {'mode':7} {'ranks':>5} {'step ms':>9} {'min ms':>8} "
          f"{'flushes/step':>12} {'execs/step':>10}")
    for wrapper in args.wrappers.split(","):
        for mode in args.modes.split(","):
            for world in [int(w) for w in args.world.split(",")]:
                r = _launch(args, f"{wrapper}:{mode}", world, fused=(mode == "fused"))
                r.update(wrapper=wrapper, mode=mode, world=world)
                rows.append(r)
                print(f"{wrapper:8} {mode:7} {world:5d} {r['step_ms']:9.2f} {r['step_ms_min']:8.2f} "
                      f"{r['flushes_per_step']:12g} {r['executions_per_step']:10g}", flush=True)
    coll = {}
    if not args.no_collectives:
        coll = _launch(args, "collectives", 2, fused=False)
        for k, v in coll.items():
            print(f"{k}: {v:.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "collectives": coll, "args": vars(args)}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

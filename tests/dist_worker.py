"""One rank of a distributed test (started by tests/_dist_launch.py).

usage: dist_worker.py OUT_DIR CHECK[,CHECK...]

Every check returns a list of ``(name, got, expected)`` (CPU tensors or Python values) or
any picklable value; the list of all checks' results is saved to OUT_DIR/result{rank}.pt
and compared by the test. Expected values are computed on the CPU with plain PyTorch.
"""
from __future__ import annotations

import datetime
import os
import sys
import time

import torch

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
CHECKS: dict = {}


def check(fn):
    CHECKS[fn.__name__] = fn
    return fn


def _init(backend="tpu"):
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
    return dist


def _inp(shape, dtype, rank, salt=0):
    g = torch.Generator().manual_seed(1000 * salt + rank)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 4).to(dtype)
    return torch.randint(-50, 50, shape, generator=g, dtype=dtype)


def _all(shape, dtype, salt=0):
    return [_inp(shape, dtype, r, salt) for r in range(WORLD)]


def _red(xs, op):
    s = torch.stack(xs)
    if s.dtype == torch.bool:
        s = s.to(torch.int64)
        r = {"sum": s.sum(0) > 0, "max": s.max(0).values > 0, "min": s.min(0).values > 0,
             "product": s.prod(0) > 0}[op]
        return r
    if op == "sum":
        return s.sum(0).to(s.dtype)
    if op == "avg":
        if s.dtype.is_floating_point:
            return (s.sum(0) / len(xs)).to(s.dtype)
        return torch.div(s.sum(0), len(xs), rounding_mode="trunc")
    if op == "max":
        return s.max(0).values
    if op == "min":
        return s.min(0).values
    if op == "product":
        return s.prod(0).to(s.dtype)
    if op == "band":
        out = xs[0]
        for x in xs[1:]:
            out = out & x
        return out
    raise ValueError(op)


def _ops():
    import torch.distributed as dist

    return {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX,
            "min": dist.ReduceOp.MIN, "product": dist.ReduceOp.PRODUCT, "band": dist.ReduceOp.BAND}


def _collectives(tag):
    """Every c10d collective on tpu tensors vs the CPU answer (this rank's part)."""
    dist = _init()
    ops = _ops()
    out = []
    tpu = lambda c: c.to("tpu")  # noqa: E731
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        opnames = ["sum", "avg", "max", "min", "product"] + (["band"] if dtype == torch.int64 else [])
        for op in opnames:
            xs = _all((3, 5), dtype, salt=1)
            t = tpu(xs[RANK])
            dist.all_reduce(t, op=ops[op])
            out.append((f"{tag} all_reduce {op} {dtype}", t.cpu(), _red(xs, op)))
        xs = _all((4,), dtype, salt=2)
        t = tpu(xs[RANK])
        dist.broadcast(t, src=1 % WORLD)
        out.append((f"{tag} broadcast {dtype}", t.cpu(), xs[1 % WORLD]))
        xs = _all((2, 3), dtype, salt=3)
        outs = [torch.zeros(2, 3, dtype=dtype, device="tpu") for _ in range(WORLD)]
        dist.all_gather(outs, tpu(xs[RANK]))
        out.append((f"{tag} all_gather {dtype}", [o.cpu() for o in outs], xs))
        o = torch.empty(WORLD * 2, 3, dtype=dtype, device="tpu")
        dist.all_gather_into_tensor(o, tpu(xs[RANK]))
        out.append((f"{tag} all_gather_into_tensor {dtype}", o.cpu(), torch.cat(xs)))
        o = torch.empty(WORLD, 2, 3, dtype=dtype, device="tpu")
        dist.all_gather_into_tensor(o, tpu(xs[RANK]))
        out.append((f"{tag} all_gather_into_tensor stacked {dtype}", o.cpu(), torch.stack(xs)))
        # reduce_scatter: rank r's list [c_0 .. c_{W-1}]; result on r = sum_j c_r of rank j
        lists = [[_inp((3,), dtype, r, salt=10 + i) for i in range(WORLD)] for r in range(WORLD)]
        for op in ("sum", "max"):
            o = torch.zeros(3, dtype=dtype, device="tpu")
            dist.reduce_scatter(o, [tpu(c) for c in lists[RANK]], op=ops[op])
            out.append((f"{tag} reduce_scatter {op} {dtype}", o.cpu(),
                        _red([lists[j][RANK] for j in range(WORLD)], op)))
            big = [torch.cat(lists[r]) for r in range(WORLD)]
            o = torch.zeros(3, dtype=dtype, device="tpu")
            dist.reduce_scatter_tensor(o, tpu(big[RANK]), op=ops[op])
            out.append((f"{tag} reduce_scatter_tensor {op} {dtype}", o.cpu(),
                        _red([lists[j][RANK] for j in range(WORLD)], op)))
        # all_to_all
        outs = [torch.zeros(3, dtype=dtype, device="tpu") for _ in range(WORLD)]
        dist.all_to_all(outs, [tpu(c) for c in lists[RANK]])
        out.append((f"{tag} all_to_all {dtype}", [o.cpu() for o in outs],
                    [lists[j][RANK] for j in range(WORLD)]))
        o = torch.zeros(3 * WORLD, dtype=dtype, device="tpu")
        dist.all_to_all_single(o, tpu(torch.cat(lists[RANK])))
        out.append((f"{tag} all_to_all_single {dtype}", o.cpu(),
                    torch.cat([lists[j][RANK] for j in range(WORLD)])))
        # uneven all_to_all_single: rank r sends (j + 1) rows to rank j... of width 2
        in_splits = [j + 1 + RANK for j in range(WORLD)]
        out_splits = [RANK + 1 + j for j in range(WORLD)]
        full = [_inp((sum(k + 1 + r for k in range(WORLD)), 2), dtype, r, salt=20)
                for r in range(WORLD)]
        o = torch.zeros(sum(out_splits), 2, dtype=dtype, device="tpu")
        dist.all_to_all_single(o, tpu(full[RANK]), out_splits, in_splits)
        exp = []
        for j in range(WORLD):
            splits_j = [k + 1 + j for k in range(WORLD)]
            exp.append(torch.split(full[j], splits_j)[RANK])
        out.append((f"{tag} all_to_all_single uneven {dtype}", o.cpu(), torch.cat(exp)))
        # scatter / gather / reduce
        src = WORLD - 1
        chunks = [_inp((2, 2), dtype, 99, salt=30 + i) for i in range(WORLD)]
        o = torch.zeros(2, 2, dtype=dtype, device="tpu")
        dist.scatter(o, [tpu(c) for c in chunks] if RANK == src else None, src=src)
        out.append((f"{tag} scatter {dtype}", o.cpu(), chunks[RANK]))
        xs = _all((2, 2), dtype, salt=4)
        gl = [torch.zeros(2, 2, dtype=dtype, device="tpu") for _ in range(WORLD)] if RANK == 0 else None
        dist.gather(tpu(xs[RANK]), gl, dst=0)
        if RANK == 0:
            out.append((f"{tag} gather {dtype}", [g.cpu() for g in gl], xs))
        t = tpu(xs[RANK])
        dist.reduce(t, dst=0, op=ops["sum"])
        if RANK == 0:
            out.append((f"{tag} reduce {dtype}", t.cpu(), _red(xs, "sum")))
        else:
            out.append((f"{tag} reduce non-dst keeps {dtype}", t.cpu(), xs[RANK]))
    # bool all_reduce
    xs = _all((6,), torch.bool, salt=5)
    for op in ("sum", "max", "min"):
        t = tpu(xs[RANK])
        dist.all_reduce(t, op=ops[op])
        out.append((f"{tag} all_reduce {op} bool", t.cpu(), _red(xs, op)))
    # float64, 0-d, views
    xs = _all((), torch.float64, salt=6)
    t = tpu(xs[RANK])
    dist.all_reduce(t)
    out.append((f"{tag} all_reduce 0-d float64", t.cpu(), _red(xs, "sum")))
    base = _all((4, 6), torch.float32, salt=7)
    b = tpu(base[RANK])
    v = b[:, 2:4]
    dist.all_reduce(v)
    exp = base[RANK].clone()
    exp[:, 2:4] = _red([x[:, 2:4] for x in base], "sum")
    out.append((f"{tag} all_reduce through a view", b.cpu(), exp))
    # send / recv (ring)
    x = tpu(_inp((5,), torch.float32, RANK, salt=8))
    r = torch.zeros(5, device="tpu")
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    if RANK % 2 == 0:
        dist.send(x, nxt)
        dist.recv(r, prv)
    else:
        dist.recv(r, prv)
        dist.send(x, nxt)
    out.append((f"{tag} send/recv ring", r.cpu(), _inp((5,), torch.float32, prv, salt=8)))
    # async_op work
    t = tpu(_inp((3,), torch.float32, RANK, salt=9))
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    out.append((f"{tag} all_reduce async", t.cpu(), _red(_all((3,), torch.float32, 9), "sum")))
    return out


@check
def collectives_strict():
    import lazyrt

    with lazyrt.set_mode("strict"):
        return _collectives("strict")


@check
def collectives_defer():
    import lazyrt

    with lazyrt.set_mode("defer"):
        return _collectives("defer")


@check
def collectives_fused():
    import lazyrt
    import lazyrt.distributed as ld

    with lazyrt.set_mode("defer"), ld.fused():
        return _collectives("fused")


@check
def host_side():
    """CPU tensors (gloo), object collectives, barrier, subgroups, backend names."""
    dist = _init()
    out = []
    c = torch.full((3,), float(RANK + 1))
    dist.all_reduce(c)
    out.append(("cpu all_reduce over gloo", c, torch.full((3,), float(sum(range(1, WORLD + 1))))))
    objs = [None] * WORLD
    dist.all_gather_object(objs, {"rank": RANK, "s": "x" * RANK})
    out.append(("all_gather_object", objs, [{"rank": r, "s": "x" * r} for r in range(WORLD)]))
    lst = [RANK * 10, "a"] if RANK == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0)
    out.append(("broadcast_object_list", lst, [0, "a"]))
    g = [None] * WORLD if RANK == 0 else None
    dist.gather_object(RANK + 0.5, g, dst=0)
    if RANK == 0:
        out.append(("gather_object", g, [r + 0.5 for r in range(WORLD)]))
    so = [None]
    dist.scatter_object_list(so, [f"o{r}" for r in range(WORLD)] if RANK == 0 else None, src=0)
    out.append(("scatter_object_list", so[0], f"o{RANK}"))
    dist.barrier()
    out.append(("backend name", dist.get_backend(), "tpu"))
    out.append(("world size / rank", (dist.get_world_size(), dist.get_rank()), (WORLD, RANK)))
    import torch.distributed.distributed_c10d as c10d

    out.append(("default device backend for tpu", c10d.Backend.default_device_backend_map["tpu"], "tpu"))
    # subgroup of ranks {0, W-1} (and new_group of everyone)
    members = [0, WORLD - 1]
    sub = dist.new_group(members)
    if RANK in members:
        t = torch.full((2,), float(RANK), device="tpu")
        dist.all_reduce(t, group=sub)
        out.append(("subgroup all_reduce", t.cpu(), torch.full((2,), float(sum(members)))))
        o = [torch.zeros(1, device="tpu") for _ in members]
        dist.all_gather(o, torch.tensor([RANK + 0.0], device="tpu"), group=sub)
        out.append(("subgroup all_gather", [x.cpu() for x in o], [torch.tensor([m + 0.0]) for m in members]))
        dist.broadcast(t, src=WORLD - 1, group=sub)
    everyone = dist.new_group(list(range(WORLD)))
    t = torch.ones(2, device="tpu") * (RANK + 1)
    dist.all_reduce(t, group=everyone, op=dist.ReduceOp.MAX)
    out.append(("new_group all ranks", t.cpu(), torch.full((2,), float(WORLD))))
    out.append(("device is tpu:0", str(t.device), "tpu:0"))
    import jax

    out.append(("jax process", (jax.process_index(), jax.process_count()), (RANK, WORLD)))
    return out


@check
def functional():
    """The _c10d_functional ops DTensor and FSDP2 dispatch."""
    dist = _init()
    import torch.distributed._functional_collectives as funcol

    out = []
    g = dist.group.WORLD
    xs = _all((2, 3), torch.float32, salt=40)
    x = xs[RANK].to("tpu")
    out.append(("funcol all_reduce", funcol.all_reduce(x, "sum", g).cpu(), _red(xs, "sum")))
    out.append(("funcol all_reduce avg", funcol.all_reduce(x, "avg", g).cpu(), _red(xs, "avg")))
    out.append(("funcol all_gather_tensor", funcol.all_gather_tensor(x, 0, g).cpu(), torch.cat(xs)))
    out.append(("funcol all_gather_tensor dim1", funcol.all_gather_tensor(x, 1, g).cpu(),
                torch.cat(xs, 1)))
    big = [_inp((2 * WORLD, 3), torch.float32, r, salt=41) for r in range(WORLD)]
    rs = funcol.reduce_scatter_tensor(big[RANK].to("tpu"), "sum", 0, g)
    out.append(("funcol reduce_scatter_tensor", rs.cpu(),
                _red([b.chunk(WORLD)[RANK] for b in big], "sum")))
    a2a = funcol.all_to_all_single(big[RANK].to("tpu"), None, None, g)
    out.append(("funcol all_to_all_single", a2a.cpu(),
                torch.cat([b.chunk(WORLD)[RANK] for b in big])))
    out.append(("funcol broadcast", funcol.broadcast(x, 0, g).cpu(), xs[0]))
    y = x.clone()
    torch.ops._c10d_functional.all_reduce_(y, "max", g.group_name)
    out.append(("_c10d_functional.all_reduce_", y.cpu(), _red(xs, "max")))
    res = torch.ops._c10d_functional.all_reduce_coalesced([x, x * 2], "sum", g.group_name)
    out.append(("all_reduce_coalesced", [r.cpu() for r in res],
                [_red(xs, "sum"), _red([v * 2 for v in xs], "sum")]))
    w = torch.ops._c10d_functional.wait_tensor(res[0])
    out.append(("wait_tensor", w.cpu(), _red(xs, "sum")))
    return out


@check
def start_late():
    """A tpu op before init_process_group: a clear error, not an abort."""
    import torch.distributed as dist

    import lazyrt  # noqa: F401

    _ = torch.ones(2, device="tpu") + 1
    try:
        dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=20))
    except Exception as e:  # noqa: BLE001
        return [("error", type(e).__name__, "RuntimeError"), ("message", str(e), None)]
    return [("error", None, "RuntimeError")]


@check
def missing_peer():
    import torch.distributed as dist

    import lazyrt  # noqa: F401

    t0 = time.monotonic()
    try:
        dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=10))
    except Exception as e:  # noqa: BLE001
        return [("error", type(e).__name__, None), ("message", str(e), None),
                ("seconds", time.monotonic() - t0, None)]
    return [("error", None, "an error")]


def main():
    out_dir, names = sys.argv[1], sys.argv[2].split(",")
    import lazyrt  # noqa: F401

    results = {}
    for name in names:
        results[name] = CHECKS[name]()
    torch.save(results, os.path.join(out_dir, f"result{RANK}.pt"))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

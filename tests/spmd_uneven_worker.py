"""Uneven shardings: SPMD ``mark_sharding``/``FSDPv2`` on 4 CPU devices in one process, and
DTensor's uneven shards over c10d on 2 ranks (started by tests/test_spmd_uneven.py through
tests/_dist_launch.py).

usage: spmd_uneven_worker.py OUT_DIR CHECK[,CHECK...]

Each check returns ``(name, got, expected)`` items (expected None: information), compared
by ``_dist_launch.check_items``; expected values come from plain PyTorch on the CPU.
"""
from __future__ import annotations

import datetime
import os
import sys

import torch

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ["WORLD_SIZE"])
CHECKS: dict = {}
# LAZYRT_TEST_FULL=1: every case (the slow tests); else a representative sample (CI)
FULL = os.environ.get("LAZYRT_TEST_FULL") == "1"


def check(fn):
    CHECKS[fn.__name__] = fn
    return fn


def _trim(spec):
    t = list(spec)
    while t and t[-1] is None:
        t.pop()
    return tuple(t)


def _error(fn):
    try:
        fn()
    except Exception as e:
        return type(e).__name__, str(e)
    return None, ""


@check
def marks():
    """mark_sharding on uneven dimensions (1-D and 2-D meshes), then ops, in strict and
    defer; what sharding_info reports; the errors that stay errors."""
    import jax
    from jax.sharding import PartitionSpec as P

    import lazyrt
    import lazyrt.distributed as ld

    out = [("devices", len(jax.devices()), 4)]
    m1 = ld.Mesh(range(4), (4,), ("fsdp",))
    m2 = ld.Mesh(range(4), (2, 2), ("dp", "fsdp"))
    g = torch.Generator().manual_seed(5)
    # (shape, mesh, spec, stored spec, dims kept whole, one device's block)
    cases = [
        ((2, 8), m1, ("fsdp", None), (), (0,), (2, 8)),
        ((7, 8), m1, ("fsdp", None), (), (0,), (7, 8)),
        ((8, 7), m1, (None, "fsdp"), (), (1,), (8, 7)),
        ((2,), m1, ("fsdp",), (), (0,), (2,)),
        ((7, 12), m2, ("dp", "fsdp"), (None, "fsdp"), (0,), (7, 6)),
        ((12, 7), m2, ("dp", "fsdp"), ("dp",), (1,), (6, 7)),
        ((6, 5), m2, (("dp", "fsdp"), None), ("dp",), (0,), (3, 5)),
        ((2, 3), m2, (1, 0), ("fsdp",), (1,), (1, 3)),
        ((8, 4), m1, ("fsdp", None), ("fsdp",), (), (2, 4)),
    ]
    if not FULL:
        cases = [cases[i] for i in (0, 1, 4, 6, 7)]
    for mode in ("strict", "defer"):
        with lazyrt.set_mode(mode):
            for shape, mesh, spec, stored, whole, block in cases:
                x = torch.randn(shape, generator=g)
                w = torch.randn(shape[-1], 3, generator=g)
                for pending in (False, True) if FULL or mode == "defer" else (False,):
                    tag = f"{mode} {shape} {spec}{' pending' if pending else ''}"
                    t = x.to("tpu")
                    if pending:
                        t = t * 1.0  # a pending value in defer mode
                    err = _error(lambda t=t, m=mesh, s=spec: ld.mark_sharding(t, m, s))
                    out.append((f"{tag}: accepted", err[1], ""))
                    if err[0] is not None:
                        continue
                    info = ld.sharding_info(t)
                    out.append((f"{tag}: stored spec", _trim(info.spec), stored))
                    out.append((f"{tag}: get_sharding is the stored one",
                                _trim(ld.get_sharding(t).spec), stored))
                    out.append((f"{tag}: requested", _trim(info.requested),
                                _trim(ld._spmd._spec(spec, mesh))))
                    out.append((f"{tag}: whole dims", info.whole_dims, whole))
                    out.append((f"{tag}: shard shape", info.shard_shape, block))
                    import math

                    out.append((f"{tag}: bytes per device", info.bytes_per_device,
                                math.prod(block) * 4))
                    out.append((f"{tag}: value", t.cpu(), x))
                    y = torch.tanh(t @ w.to("tpu")) * 2 + t.sum(-1, keepdim=True)
                    out.append((f"{tag}: ops", y.cpu(), torch.tanh(x @ w) * 2 + x.sum(-1, keepdim=True)))
                    out.append((f"{tag}: reduction .item()", torch.tensor(t.square().sum().item()),
                                x.square().sum()))
                    t.mul_(3).add_(1)
                    out.append((f"{tag}: in place", t.cpu(), x * 3 + 1))
                    v = t[:1]
                    out.append((f"{tag}: a view", v.cpu(), (x * 3 + 1)[:1]))
            # a marked view writes through its base
            b = torch.randn(4, 6, generator=g)
            tb = b.to("tpu")
            ld.mark_sharding(tb[1:], m1, ("fsdp", None))
            out.append((f"{mode} marked view (3 rows over 4): base", tb.cpu(), b))
    # truly invalid specs keep clear errors
    t = torch.randn(2, 8).to("tpu")
    for name, mesh, spec, msg in (
            ("unknown axis", m1, ("tp", None), "'tp' is not an axis of the mesh"),
            ("unknown axis in a PartitionSpec", m1, P("tp", None), "'tp' is not an axis"),
            ("axis index out of range", m2, (2, None), "out of range"),
            ("axis used twice", m1, ("fsdp", "fsdp"), "more than once"),
            ("too many entries", m1, ("fsdp", None, None), "3 entries for a 2-d tensor")):
        typ, text = _error(lambda m=mesh, s=spec: ld.mark_sharding(t, m, s))
        out.append((f"error: {name}", (typ, msg in text), ("ValueError", True)))
    return out


def _head_model():
    torch.manual_seed(0)
    # no dimension of the first layer or the head divides 4: every one of them is uneven
    return torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 8),
                               torch.nn.Tanh(), torch.nn.Linear(8, 2))


STEPS = 3


def _head_data():
    g = torch.Generator().manual_seed(9)
    return torch.randn(STEPS, 6, 6, generator=g), torch.randint(0, 2, (STEPS, 6), generator=g)


def _head_reference(kind):
    m = _head_model()
    opt = _opt(m.parameters(), kind)
    xs, ys = _head_data()
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(xs[s]), ys[s])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return [p.detach().clone() for p in m.parameters()], losses


def _opt(params, kind):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)


@check
def fsdpv2_head():
    """FSDPv2 (4-way 'fsdp') training of a model with a 2-class head and a batch of 6, in
    strict, defer and compiled, vs one process on the CPU."""
    import lazyrt
    import lazyrt.distributed as ld

    mesh = ld.Mesh(range(4), (4,), ("fsdp",))
    out = []
    for kind in ("sgd", "adamw") if FULL else ("adamw",):
        ref, ref_losses = _head_reference(kind)
        xs, ys = _head_data()
        for mode in ("strict", "defer", "compiled"):
            with lazyrt.set_mode("strict" if mode == "strict" else "defer"):
                m = _head_model().to("tpu")
                fm = ld.FSDPv2(m, mesh)
                out.append((f"{mode} FSDPv2 {kind} requested specs", list(fm.param_specs.values()),
                            [("fsdp", None), ("fsdp",), ("fsdp", None), ("fsdp",), (None, "fsdp"),
                             ("fsdp",)]))
                out.append((f"{mode} FSDPv2 {kind} stored specs",
                            [_trim(ld.get_sharding(p).spec) for p in m.parameters()],
                            [(), (), ("fsdp",), ("fsdp",), (None, "fsdp"), ()]))
                run = torch.compile(fm, backend="tpu") if mode == "compiled" else fm
                opt = _opt(m.parameters(), kind)
                losses = []
                for s in range(STEPS):
                    opt.zero_grad()
                    loss = torch.nn.functional.cross_entropy(run(xs[s].to("tpu")), ys[s].to("tpu"))
                    loss.backward()
                    opt.step()
                    losses.append(loss.item())
                out.append((f"{mode} FSDPv2 {kind} params", [p.detach().cpu() for p in m.parameters()],
                            ref))
                out.append((f"{mode} FSDPv2 {kind} losses", torch.tensor(losses),
                            torch.tensor(ref_losses)))
                out.append((f"{mode} FSDPv2 {kind} specs after training",
                            [str(ld.get_sharding(p).spec) for p in m.parameters()], None))
    return out


@check
def dtensor_uneven():
    """DTensor over c10d (2 ranks) with shards of unequal sizes (5 rows over 2 ranks)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    import lazyrt

    if not dist.is_initialized():
        dist.init_process_group("tpu", timeout=datetime.timedelta(seconds=60))
    mesh = init_device_mesh("tpu", (WORLD,))
    g = torch.Generator().manual_seed(4)
    a = torch.randn(5, 3, generator=g)
    b = torch.randn(3, 7, generator=g)
    out = []
    for mode in ("strict", "defer"):
        with lazyrt.set_mode(mode):
            da = distribute_tensor(a.to("tpu"), mesh, [Shard(0)])
            out.append((f"{mode} local shard", da.to_local().cpu(), a.chunk(WORLD)[RANK].contiguous()))
            out.append((f"{mode} full_tensor", da.full_tensor().cpu(), a))
            out.append((f"{mode} Shard(0)->Replicate", da.redistribute(mesh, [Replicate()]).to_local().cpu(), a))
            db = distribute_tensor(b.to("tpu"), mesh, [Shard(1)])
            out.append((f"{mode} Shard(1) of 7 columns", db.full_tensor().cpu(), b))
            mm = da @ distribute_tensor(b.to("tpu"), mesh, [Replicate()])
            out.append((f"{mode} matmul", mm.full_tensor().cpu(), a @ b))
            x = distribute_tensor(a.to("tpu"), mesh, [Shard(0)]).requires_grad_(True)
            (x.sin() * 3).sum().backward()
            out.append((f"{mode} grad", x.grad.full_tensor().cpu(), a.cos() * 3))
    return out


def main():
    out_dir, names = sys.argv[1], sys.argv[2].split(",")
    n_dev = int(os.environ.get("LAZYRT_TEST_CPU_DEVICES", "0") or 0)
    if n_dev:
        import jax

        jax.config.update("jax_num_cpu_devices", n_dev)
    import lazyrt  # noqa: F401

    results = {name: CHECKS[name]() for name in names}
    torch.save(results, os.path.join(out_dir, f"result{RANK}.pt"))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

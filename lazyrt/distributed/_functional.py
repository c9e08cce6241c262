"""Handlers for the collective ops that reach lazyrt through ``__torch_dispatch__``.

DTensor and FSDP2 call ``torch.ops._c10d_functional.*`` (functional collectives: a fresh
output, or ``*_`` in place) and FSDP2 its own ``fsdp::*`` copy ops on tpu tensors; they
arrive as ATen-style ops at lazyrt's dispatcher. Each handler here resolves the group by
name and runs the same collective programs the process group runs (``_engine``).
``c10d::*`` ops (what C++ code sends when a process group method is not overridden in
Python) are routed back to the group's Python method.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from . import _engine, _rt

_c = torch.ops._c10d_functional
_installed = [False]


def _pg(group_name):
    from ._backend import ProcessGroupTpu

    pg = group_name if isinstance(group_name, dist.ProcessGroup) else \
        dist.distributed_c10d._resolve_process_group(group_name)
    if not isinstance(pg, ProcessGroupTpu):
        raise RuntimeError(f"lazyrt: a collective on tpu tensors needs a 'tpu' process group; "
                           f"group {group_name!r} is {type(pg).__name__}")
    return pg


def _bind(e, args, kwargs) -> dict:
    out = {}
    for i, a in enumerate(e.op._schema.arguments):
        if i < len(args):
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def _fresh(v, like) -> torch.Tensor:
    return _rt.from_array(v, like.dtype)


# ---- the collectives -------------------------------------------------------------


def _all_reduce_vals(pg, tensors, op):
    from ._pgutil import reduce_op_name

    name = reduce_op_name(op)
    return [_engine.run(pg, "all_reduce", (("op", name), ("n", pg.size())), [t], "all_reduce")[0]
            for t in tensors]


def h_all_reduce(e, args, kwargs):
    b = _bind(e, args, kwargs)
    (v,) = _all_reduce_vals(_pg(b["group_name"]), [b["input"]], b["reduce_op"])
    return _fresh(v, b["input"])


def h_all_reduce_(e, args, kwargs):
    b = _bind(e, args, kwargs)
    t = b["input"]
    (v,) = _all_reduce_vals(_pg(b["group_name"]), [t], b["reduce_op"])
    _rt.write(t, v)
    return t


def h_all_reduce_coalesced(e, args, kwargs):
    b = _bind(e, args, kwargs)
    vals = _all_reduce_vals(_pg(b["group_name"]), b["inputs"], b["reduce_op"])
    return [_fresh(v, t) for v, t in zip(vals, b["inputs"])]


def h_all_reduce_coalesced_(e, args, kwargs):
    b = _bind(e, args, kwargs)
    vals = _all_reduce_vals(_pg(b["group_name"]), b["inputs"], b["reduce_op"])
    for v, t in zip(vals, b["inputs"]):
        _rt.write(t, v)
    return list(b["inputs"])


def _gather_dim0(pg, t, group_size):
    from ._pgutil import _reshape

    n = pg.size()
    if group_size != n:
        raise ValueError(f"lazyrt: group_size {group_size} != size of group {pg.size()}")
    (g,) = _engine.run(pg, "all_gather", (("n", n),), [t], "all_gather_into_tensor")
    shape = (n * t.shape[0],) + tuple(t.shape[1:]) if t.dim() else (n,)
    return _reshape(g, shape)


def h_all_gather_into_tensor(e, args, kwargs):
    b = _bind(e, args, kwargs)
    t = b["input"]
    return _fresh(_gather_dim0(_pg(b["group_name"]), t, b["group_size"]), t)


def h_all_gather_into_tensor_out(e, args, kwargs):
    b = _bind(e, args, kwargs)
    out = b["out"]
    _rt.write(out, _gather_dim0(_pg(b["group_name"]), b["input"], b["group_size"]))
    return out


def h_all_gather_into_tensor_coalesced(e, args, kwargs):
    b = _bind(e, args, kwargs)
    pg = _pg(b["group_name"])
    return [_fresh(_gather_dim0(pg, t, b["group_size"]), t) for t in b["inputs"]]


def _scatter_dim0(pg, t, op, group_size):
    from ._pgutil import reduce_op_name

    n = pg.size()
    if group_size != n:
        raise ValueError(f"lazyrt: group_size {group_size} != size of group {pg.size()}")
    if t.shape[0] % n:
        raise ValueError(f"lazyrt: reduce_scatter_tensor: dim 0 ({t.shape[0]}) is not divisible "
                         f"by the group size {n}")
    (v,) = _engine.run(pg, "reduce_scatter", (("op", reduce_op_name(op)), ("n", n)), [t],
                       "reduce_scatter_tensor")
    return v


def h_reduce_scatter_tensor(e, args, kwargs):
    b = _bind(e, args, kwargs)
    t = b["input"]
    return _fresh(_scatter_dim0(_pg(b["group_name"]), t, b["reduce_op"], b["group_size"]), t)


def h_reduce_scatter_tensor_out(e, args, kwargs):
    b = _bind(e, args, kwargs)
    out = b["out"]
    _rt.write(out, _scatter_dim0(_pg(b["group_name"]), b["input"], b["reduce_op"],
                                 b["group_size"]))
    return out


def h_reduce_scatter_tensor_coalesced(e, args, kwargs):
    b = _bind(e, args, kwargs)
    pg = _pg(b["group_name"])
    return [_fresh(_scatter_dim0(pg, t, b["reduce_op"], b["group_size"]), t) for t in b["inputs"]]


def h_all_to_all_single(e, args, kwargs):
    b = _bind(e, args, kwargs)
    t = b["input"]
    pg = _pg(b["group_name"])
    outs = [int(s) for s in b["output_split_sizes"]]
    ins = [int(s) for s in b["input_split_sizes"]]
    n = pg.size()
    if (not outs or len(set(outs)) == 1) and (not ins or len(set(ins)) == 1) and \
            (not outs or not ins or outs == ins):
        if t.shape[0] % n:
            raise ValueError(f"lazyrt: all_to_all_single: dim 0 ({t.shape[0]}) is not divisible "
                             f"by the group size {n}")
        (v,) = _engine.run(pg, "all_to_all", (("n", n),), [t], "all_to_all_single")
        return _fresh(v, t)
    out = torch.empty((sum(outs),) + tuple(t.shape[1:]), dtype=t.dtype, device="tpu")
    pg.all_to_all_single(out, t, outs, ins)
    return out


def h_broadcast(e, args, kwargs):
    b = _bind(e, args, kwargs)
    t = b["input"]
    pg = _pg(b["group_name"])
    (v,) = _engine.run(pg, "broadcast", (("src", int(b["src"])), ("n", pg.size())), [t])
    return _fresh(v, t)


def h_broadcast_(e, args, kwargs):
    b = _bind(e, args, kwargs)
    t = b["input"]
    pg = _pg(b["group_name"])
    (v,) = _engine.run(pg, "broadcast", (("src", int(b["src"])), ("n", pg.size())), [t])
    _rt.write(t, v)
    return t


def h_shard_dim_alltoall(e, args, kwargs):
    b = _bind(e, args, kwargs)
    t = b["input"]
    pg = _pg(b["group_name"])
    n = pg.size()
    gd, sd = int(b["gather_dim"]) % max(t.dim(), 1), int(b["shard_dim"]) % max(t.dim(), 1)
    if t.shape[sd] % n == 0:
        (v,) = _engine.run(pg, "shard_dim_all_to_all",
                           (("gather_dim", gd), ("shard_dim", sd), ("n", n)), [t],
                           "shard_dim_alltoall")
        return _fresh(v, t)
    # uneven: gather everything, keep this rank's chunk (a rank-dependent slice)
    with _engine.rank_dependent():
        (g,) = _engine.run(pg, "all_gather", (("n", n),), [t], "shard_dim_alltoall")
        full = torch.cat(list(torch.unbind(_fresh(g, t), 0)), dim=gd)
        size = full.shape[sd] // n
        out = full.narrow(sd, pg.rank() * size, size).contiguous()
    return out


def h_wait_tensor(e, args, kwargs):
    # lazyrt runs collectives in program order: the value is there (or pending) already.
    return args[0]


def h_wrap_tensor_autograd(e, args, kwargs):
    return torch.ops.aten.alias.default(args[0])


# ---- fsdp:: copy ops: their own PrivateUse1 kernels are plain ops on tpu tensors -----


def _fsdp_kernel(name):
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as fc

    fn = {"all_gather_copy_in": fc.all_gather_copy_in_cuda,
          "split_with_sizes_copy": fc.split_with_sizes_copy,
          "chunk_cat": fc.chunk_cat}[name]

    def h(e, args, kwargs):
        if name == "all_gather_copy_in" and _engine.fused_active():
            return _copy_in_rank_free(*args, **kwargs)
        return fn(*args, **kwargs)

    return h


def _copy_in_rank_free(all_gather_inputs, all_gather_output, inp_split_sizes,
                       all_gather_input_numel, rank):
    """``fsdp::all_gather_copy_in`` without the rank: FSDP2 all-gathers the returned input
    into the returned output at once, so the input need not be a view of the output's
    slice ``rank``. Writing it there would put a rank-dependent offset into the program,
    and fused programs must be the same on every rank."""
    with torch.no_grad():
        flat = torch.cat([t.reshape(-1).to(all_gather_output.dtype) for t in all_gather_inputs])
    return flat, all_gather_output


# ---- c10d:: ops back to the group's Python methods -------------------------------


def install() -> None:
    """Register the handlers (once; at the first tpu process group)."""
    if _installed[0]:
        return
    _installed[0] = True
    # these define some of the ops (_c10d_functional._wrap_tensor_autograd, _dtensor::*)
    import torch.distributed._functional_collectives
    import torch.distributed.tensor._collective_utils

    table = {
        _c.all_reduce.default: h_all_reduce,
        _c.all_reduce_.default: h_all_reduce_,
        _c.all_reduce_coalesced.default: h_all_reduce_coalesced,
        _c.all_reduce_coalesced_.default: h_all_reduce_coalesced_,
        _c.all_gather_into_tensor.default: h_all_gather_into_tensor,
        _c.all_gather_into_tensor_out.default: h_all_gather_into_tensor_out,
        _c.all_gather_into_tensor_coalesced.default: h_all_gather_into_tensor_coalesced,
        _c.reduce_scatter_tensor.default: h_reduce_scatter_tensor,
        _c.reduce_scatter_tensor_out.default: h_reduce_scatter_tensor_out,
        _c.reduce_scatter_tensor_coalesced.default: h_reduce_scatter_tensor_coalesced,
        _c.all_to_all_single.default: h_all_to_all_single,
        _c.broadcast.default: h_broadcast,
        _c.broadcast_.default: h_broadcast_,
        _c.wait_tensor.default: h_wait_tensor,
        _c._wrap_tensor_autograd.default: h_wrap_tensor_autograd,
        torch.ops._dtensor.shard_dim_alltoall.default: h_shard_dim_alltoall,
    }
    for op, h in table.items():
        _rt.register_handler(op, h)
    import torch.distributed.fsdp  # defines the fsdp:: ops

    for name in ("all_gather_copy_in", "split_with_sizes_copy", "chunk_cat"):
        _rt.register_handler(getattr(torch.ops.fsdp, name).default, _fsdp_kernel(name))
    from . import _engine

    _rt.install_torch_patches(_engine)

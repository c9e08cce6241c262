"""Helpers of the tpu process group: reduce-op names, completed Works, argument checks,
and tiny value programs (index, reshape, slice) run or recorded like any op."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from . import _rt
from ._config import dist_config

_RED = {
    dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", dist.ReduceOp.MAX: "max",
    dist.ReduceOp.MIN: "min", dist.ReduceOp.PRODUCT: "product", dist.ReduceOp.BAND: "band",
    dist.ReduceOp.BOR: "bor", dist.ReduceOp.BXOR: "bxor",
}
_NAMES = ("sum", "avg", "max", "min", "product", "band", "bor", "bxor")


def reduce_op(op) -> tuple[str, object]:
    """c10d ``ReduceOp`` (or a functional collective's string) -> (lazyrt's name, the
    factor of ``ReduceOp.PREMUL_SUM`` or None). ``PREMUL_SUM(factor)`` (FSDP2's gradient
    reduction, ``_make_nccl_premul_sum``) is a sum of the inputs each multiplied by
    ``factor`` first (a float or a tensor): ``premul`` does the multiply, the collective
    sums."""
    if isinstance(op, str):
        name = op.lower()
        if name in _NAMES:
            return name, None
        if name == "premul_sum":
            raise NotImplementedError("lazyrt: the reduce op 'premul_sum' of a functional "
                                      "collective has no factor; use ReduceOp.PREMUL_SUM(factor)")
        raise ValueError(f"lazyrt: unknown reduce op {op!r}")
    if type(op) is dist.ReduceOp.RedOpType:  # NOTE: isinstance(it, ReduceOp) is True too
        if op == dist.ReduceOp.RedOpType.PREMUL_SUM:
            raise ValueError("lazyrt: ReduceOp.PREMUL_SUM needs a factor: "
                             "torch.distributed._make_nccl_premul_sum(factor)")
        op = dist.ReduceOp(op)
    state = op.__getstate__() if isinstance(op, dist.ReduceOp) else None
    if isinstance(state, tuple) and state[0] == dist.ReduceOp.RedOpType.PREMUL_SUM:
        return "sum", state[1]
    for k, v in _RED.items():
        if op == k:
            return v, None
    what = repr(op)
    if state is not None:  # a ReduceOp of a kind this torch added
        code = state[0] if isinstance(state, tuple) else state
        what = f"ReduceOp.{getattr(code, 'name', code)}"
    raise NotImplementedError(f"lazyrt: reduce op {what} is not supported on tpu tensors")


def reduce_op_name(op) -> str:
    """``reduce_op``'s name, for callers that take no factor (an error for PREMUL_SUM)."""
    name, factor = reduce_op(op)
    if factor is not None:
        raise NotImplementedError("lazyrt: ReduceOp.PREMUL_SUM is not supported here")
    return name


def premul(t, factor):
    """``t`` multiplied by ``PREMUL_SUM``'s factor (``t`` itself when there is none), in
    ``t``'s dtype, as NCCL's premul sum, which takes floating tensors only."""
    if factor is None:
        return t
    if not t.is_floating_point():
        raise TypeError(f"lazyrt: ReduceOp.PREMUL_SUM needs floating tensors, got {t.dtype}")
    if isinstance(factor, torch.Tensor):
        factor = factor.to(device=t.device, dtype=t.dtype)
    return t * factor


def _done(result) -> dist.Work:
    fut = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _split(tensors):
    tpu = [t for t in tensors if _rt.is_tpu(t)]
    if tpu and len(tpu) != len(tensors):
        raise ValueError("lazyrt: a collective cannot mix tpu and non-tpu tensors")
    return bool(tpu)


def _check_same(out, inp, what):
    if out.dtype != inp.dtype:
        raise TypeError(f"lazyrt: {what}: output dtype {out.dtype} differs from input dtype "
                        f"{inp.dtype}")


def _p2p_check(pg, src: int, dst: int, t, what: str) -> None:
    """A send runs as one XLA program with the matching recv on the peer: both ends must
    be at the same transfer. Checked through the store (unless LAZYRT_DIST_CHECK=off), so
    two ranks that both send first (a batch_isend_irecv ring) get an error, not a hang."""
    if dist_config.check == "off":
        return
    from . import _fused

    sig = f"p2p {src}->{dst} {tuple(t.shape)}:{t.dtype}"
    _fused.check(pg, sig, f"{what} at {_rt.user_line()}", ns="p2p")


def _max_opts():
    o = dist.AllreduceOptions()
    o.reduceOp = dist.ReduceOp.MAX
    return o


# ---- value helpers: tiny programs on values (run or recorded like any op) ------

def _index(v, i: int):
    return _rt.apply(lambda a: a[i], v, f"index{i}")


def _reshape(v, shape):
    if tuple(v.shape) == tuple(shape):
        return v
    return _rt.apply(lambda a: a.reshape(shape), v, f"reshape{shape}")


def _rt_slice(v, n: int):
    return _rt.apply(lambda a: a[:n], v, f"slice{n}")


def _stack(tensors):
    return torch.stack([t if _rt.is_tpu(t) else t.to("tpu") for t in tensors])

"""Collectives as XLA programs: a jitted ``shard_map`` over the mesh of a group's devices.

Every collective is a *body*: a pure JAX function of one rank's local values that uses
JAX's collective primitives over the mesh axis ``'r'`` (``lax.psum``, ``all_gather``,
``psum_scatter``, ``all_to_all``, ``ppermute``). The same body serves both ways a
collective runs:

* isolated (strict mode, and defer mode by default): the body alone is jitted inside a
  ``shard_map`` over the group's mesh and run at once, at the c10d call every rank of
  the group makes;
* fused (defer mode, opt-in): the body is a node of the pending trace, and the flush
  traces the whole trace inside one ``shard_map`` (see ``_fused``).

Each rank's local array enters the program as the one shard of a global array that
declares itself replicated (``PartitionSpec()``): the body sees exactly the rank's own
value, whatever its shape, with no reshaping, and each output's local shard is the
rank's own result. ``check_vma=False`` tells JAX not to verify the replication claim
(values differ between ranks by design; the bodies are where they meet).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from . import _rt

AXIS = "r"

# ---------------------------------------------------------------------------
# bodies: functions of local values, inside a shard_map over axis AXIS of size n
# ---------------------------------------------------------------------------

REDUCE_OPS = ("sum", "avg", "max", "min", "product", "band", "bor", "bxor")

# how collectives ran (isolated / fused); ``lazyrt.distributed`` reports it
STATS = {"isolated": 0, "fused_recorded": 0, "fused_flushes": 0, "checks": 0,
         "check_seconds": 0.0}


def _as_reducible(x):
    # XLA's collectives take no bool: reduce as int32, cast back afterwards.
    return x.astype(jnp.int32) if x.dtype == jnp.bool_ else x


def _reduce_stack(stacked, op: str, n: int):
    """Reduce ``stacked`` (n, ...) over axis 0 with the c10d op ``op``."""
    if op in ("sum", "avg"):
        r = jnp.sum(stacked, axis=0, dtype=stacked.dtype)
        return _avg(r, n) if op == "avg" else r
    if op == "max":
        return jnp.max(stacked, axis=0)
    if op == "min":
        return jnp.min(stacked, axis=0)
    if op == "product":
        return jnp.prod(stacked, axis=0, dtype=stacked.dtype)
    fn = {"band": jnp.bitwise_and, "bor": jnp.bitwise_or, "bxor": jnp.bitwise_xor}[op]
    return functools.reduce(fn, [stacked[i] for i in range(n)])


def _avg(x, n: int):
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return (x / n).astype(x.dtype)
    # NOTE: integer AVG truncates, as NCCL's ncclAvg does.
    return lax.div(x, jnp.asarray(n, x.dtype))


def all_reduce(x, *, op: str, n: int):
    dt = x.dtype
    if dt == jnp.bool_:
        op = {"sum": "bor", "avg": "bor", "max": "bor", "min": "band", "product": "band"}.get(op, op)
    y = _as_reducible(x)
    if op in ("sum", "avg"):
        r = lax.psum(y, AXIS)
        if op == "avg":
            r = _avg(r, n)
    elif op == "max":
        r = lax.pmax(y, AXIS)
    elif op == "min":
        r = lax.pmin(y, AXIS)
    else:
        r = _reduce_stack(lax.all_gather(y, AXIS), op, n)
    return r.astype(dt)


def all_gather(x, *, n: int):
    """(n, *x.shape): every rank's ``x``, in group-rank order."""
    dt = x.dtype
    return lax.all_gather(_as_reducible(x), AXIS).astype(dt)


def broadcast(x, *, src: int, n: int):
    """``src``'s ``x`` on every rank (bit-exact: gathered, not summed)."""
    return all_gather(x, n=n)[src]


def reduce_scatter(x, *, op: str, n: int):
    """``x`` (n*k, ...) -> (k, ...): chunk i of the reduction on rank i."""
    dt = x.dtype
    y = _as_reducible(x)
    if op in ("sum", "avg") and dt != jnp.bool_:
        r = lax.psum_scatter(y, AXIS, scatter_dimension=0, tiled=True)
        if op == "avg":
            r = _avg(r, n)
        return r.astype(dt)
    k = x.shape[0] // n
    got = lax.all_to_all(y, AXIS, 0, 0, tiled=True)  # chunk i of every rank, stacked
    red = _reduce_stack(got.reshape((n, k) + x.shape[1:]), _bool_op(op) if dt == jnp.bool_ else op, n)
    return red.astype(dt)


def _bool_op(op):
    return {"sum": "bor", "avg": "bor", "max": "bor", "min": "band", "product": "band"}.get(op, op)


def all_to_all(x, *, n: int):
    """``x`` (n*k, ...): chunk j goes to rank j; the result stacks chunk i of every rank."""
    dt = x.dtype
    return lax.all_to_all(_as_reducible(x), AXIS, 0, 0, tiled=True).astype(dt)


def shard_dim_all_to_all(x, *, gather_dim: int, shard_dim: int, n: int):
    """DTensor's Shard(a) -> Shard(b): chunk j of dim ``shard_dim`` goes to rank j; the
    chunks received are concatenated along ``gather_dim``."""
    dt = x.dtype
    return lax.all_to_all(_as_reducible(x), AXIS, shard_dim, gather_dim, tiled=True).astype(dt)


def scatter(x, *, src: int, n: int):
    """``x`` (n, *s) on ``src``: rank i gets ``src``'s ``x[i]``."""
    full = broadcast(x, src=src, n=n)
    return lax.dynamic_index_in_dim(full, lax.axis_index(AXIS), 0, keepdims=False)


def reduce(x, *, op: str, dst: int, n: int):
    """The reduction on ``dst``; the other ranks keep their ``x``."""
    r = all_reduce(x, op=op, n=n)
    return jnp.where(lax.axis_index(AXIS) == dst, r, x)


def send_recv(x, *, src: int, dst: int, n: int):
    """Point to point over the two-device mesh: ``dst`` gets ``src``'s ``x``."""
    dt = x.dtype
    y = lax.ppermute(_as_reducible(x), AXIS, perm=[(src, dst)])
    return jnp.where(lax.axis_index(AXIS) == dst, y.astype(dt), x)


BODIES = {
    "all_reduce": all_reduce, "all_gather": all_gather, "broadcast": broadcast,
    "reduce_scatter": reduce_scatter, "all_to_all": all_to_all, "scatter": scatter,
    "reduce": reduce, "send_recv": send_recv, "shard_dim_all_to_all": shard_dim_all_to_all,
}


def body(kind: str, params: tuple):
    """The body of collective ``kind`` with static ``params`` ((name, value) pairs)."""
    return functools.partial(BODIES[kind], **dict(params))


# ---------------------------------------------------------------------------
# running a body alone (isolated)
# ---------------------------------------------------------------------------


class Comm:
    """The devices of one group (in group-rank order), their mesh, and the compiled
    isolated programs of its collectives."""

    def __init__(self, devices, group_rank: int):
        self.devices = list(devices)
        self.n = len(self.devices)
        self.rank = group_rank
        self.mesh = Mesh(np.array(self.devices, dtype=object), (AXIS,))
        self.rep = NamedSharding(self.mesh, P())
        self.local = self.devices[group_rank]
        self._progs: dict = {}

    def wrap(self, a):
        """``a`` (this rank's local array) as the local shard of a global array."""
        if a.devices() != {self.local}:
            a = jax.device_put(a, self.local)
        return jax.make_array_from_single_device_arrays(a.shape, self.rep, [a])

    def unwrap(self, g):
        return g.addressable_data(0)

    def program(self, kind: str, params: tuple, n_out: int):
        key = (kind, params)
        f = self._progs.get(key)
        if f is None:
            b = body(kind, params)

            def spmd(*xs):
                out = b(*xs)
                return out if isinstance(out, tuple) else (out,)

            f = jax.jit(jax.shard_map(spmd, mesh=self.mesh, in_specs=P(), out_specs=P(),
                                      check_vma=False))
            self._progs[key] = f
        return f

    def run(self, kind: str, params: tuple, arrays: list) -> list:
        """Run collective ``kind`` on this rank's ``arrays`` now; its local results."""
        f = self.program(kind, params, 1)
        with _rt.X64(True):
            outs = f(*[self.wrap(a) for a in arrays])
        return [self.unwrap(o) for o in outs]


def out_avals(comm, kind: str, params: tuple, in_avals) -> tuple:
    """Shapes and dtypes of a collective's outputs (its bodies keep each input's dtype)."""
    f = comm.program(kind, params, 1)
    structs = [jax.ShapeDtypeStruct(s, d) for s, d in in_avals]
    with _rt.X64(True):
        outs = jax.eval_shape(f, *structs)
    return tuple((tuple(o.shape), np.dtype(o.dtype)) for o in outs)

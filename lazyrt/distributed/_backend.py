"""The ``tpu`` (and ``tpu_dist``) c10d backend: a Python ``dist.ProcessGroup``.

One rank = one process = one device (``tpu:0`` in every rank). Collectives on tpu tensors
are XLA collectives over the devices of the group (``_collectives``), run isolated or fused
(``_engine``). CPU tensors (object collectives, barriers, anything a user sends from the
host) go over an inner gloo group of the same ranks, created on first use.

Every method returns an already completed ``Work``: lazyrt runs collectives in program
order on its one stream, so there is nothing to wait for; a fused collective's result is a
pending value, and reading it is a sync point like any other.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from . import _engine, _rt, _startup
from ._collectives import Comm
from ._pgutil import (
    _check_same,
    _done,
    _index,
    _max_opts,
    _p2p_check,
    _reshape,
    _rt_slice,
    _split,
    _stack,
    premul,
    reduce_op,
)


class ProcessGroupTpu(dist.ProcessGroup):
    """c10d process group over XLA collectives (one device per rank)."""

    def __init__(self, store, rank: int, size: int, timeout, global_ranks, group_id: str = ""):
        super().__init__(rank, size)
        self._store = store
        self._timeout = timeout
        self._global_ranks = list(global_ranks)
        self._group_id = group_id
        self._name = group_id
        self._desc = ""
        self._gloo_pg = None
        self._comm = None
        self._seq = 0

    # ---- identity ----------------------------------------------------------

    def getBackendName(self) -> str:
        return "tpu"

    def name(self) -> str:
        return "tpu"

    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupName(self) -> str:
        return self._name

    def _set_group_name(self, name: str) -> None:
        self._name = name
        super()._set_group_name(name)

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc
        super()._set_group_desc(desc)

    @property
    def comm(self) -> Comm:
        if self._comm is None:
            devs = _startup.global_devices_by_rank()
            self._comm = Comm([devs[r] for r in self._global_ranks], self.rank())
            self._comm.pg = self
        return self._comm

    @property
    def store(self):
        return self._store

    @property
    def global_ranks(self) -> list:
        return list(self._global_ranks)

    def _gloo(self):
        """The inner gloo group for CPU tensors, made on first use (by every rank at the
        same c10d call)."""
        if self._gloo_pg is None:
            self._gloo_pg = dist.ProcessGroupGloo(dist.PrefixStore("lazyrt_gloo/", self._store),
                                                  self.rank(), self.size(), self._timeout)
        return self._gloo_pg

    def _host(self, what: str):
        _engine.flush_for_c10d(what)
        return self._gloo()

    def _root(self, r: int) -> int:
        if not 0 <= r < self.size():
            raise ValueError(f"lazyrt: root rank {r} is not in a group of size {self.size()}")
        return r

    # ---- all_reduce ---------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        if not isinstance(tensors, (list, tuple)):
            tensors = [tensors]
        op = opts.reduceOp if opts is not None and not isinstance(opts, dist.ReduceOp) else (
            opts if opts is not None else dist.ReduceOp.SUM)
        if isinstance(op, dist.ReduceOp.RedOpType):
            op = dist.ReduceOp(op)
        if not _split(tensors):
            o = dist.AllreduceOptions()
            o.reduceOp = op
            return self._host("all_reduce").allreduce(list(tensors), o)
        name, factor = reduce_op(op)
        with _rt.locked():
            for t in tensors:
                (v,) = _engine.run(self, "all_reduce", (("op", name), ("n", self.size())),
                                   [premul(t, factor)], "all_reduce")
                _rt.write(t, v)
        return _done(list(tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        if not _split(tensors):
            return self._host("all_reduce_coalesced").allreduce_coalesced(list(tensors), opts)
        o = dist.AllreduceOptions()
        if opts is not None:
            o.reduceOp = opts.reduceOp
        return self.allreduce(list(tensors), o)

    # ---- broadcast ----------------------------------------------------------

    def broadcast(self, tensors, opts=None):
        if not _split(tensors):
            return self._host("broadcast").broadcast(list(tensors), opts)
        src = self._root(opts.rootRank if opts is not None else 0)
        with _rt.locked():
            for t in tensors:
                (v,) = _engine.run(self, "broadcast", (("src", src), ("n", self.size())), [t])
                _rt.write(t, v)
        return _done(list(tensors))

    # ---- all_gather ---------------------------------------------------------

    def allgather(self, output_tensors, input_tensors, opts=None):
        if not _split(input_tensors):
            return self._host("all_gather").allgather(output_tensors, input_tensors,
                                                      opts or dist.AllgatherOptions())
        for outs, inp in zip(output_tensors, input_tensors):
            if len(outs) != self.size():
                raise ValueError(f"lazyrt: all_gather needs {self.size()} output tensors, got "
                                 f"{len(outs)}")
            for o in outs:
                _check_same(o, inp, "all_gather")
                if tuple(o.shape) != tuple(inp.shape):
                    raise ValueError(f"lazyrt: all_gather output shape {list(o.shape)} differs "
                                     f"from the input's {list(inp.shape)}")
            with _rt.locked():
                (g,) = _engine.run(self, "all_gather", (("n", self.size()),), [inp])
                for i, o in enumerate(outs):
                    _rt.write(o, _index(g, i))
        return _done(output_tensors)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        if not _split(input_list):
            return self._host("all_gather_coalesced").allgather_coalesced(
                output_lists, input_list, opts or dist.AllgatherOptions())
        return self.allgather(output_lists, input_list, opts)

    def _allgather_base(self, output, input, opts=None):
        return self.all_gather_single(output, input, opts)

    def all_gather_single(self, output, input, opts=None):
        if not _split([output, input]):
            return self._host("all_gather_into_tensor")._allgather_base(
                output, input, opts or dist.AllgatherOptions())
        _check_same(output, input, "all_gather_into_tensor")
        n = self.size()
        if output.numel() != n * input.numel():
            raise ValueError(f"lazyrt: all_gather_into_tensor output has {output.numel()} "
                             f"elements, expected {n} x {input.numel()}")
        with _rt.locked():
            (g,) = _engine.run(self, "all_gather", (("n", n),), [input], "all_gather_into_tensor")
            _rt.write(output, _reshape(g, tuple(output.shape)))
        return _done([output])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        if not _split(inputs):
            return self._host("all_gather_into_tensor_coalesced").allgather_into_tensor_coalesced(
                outputs, inputs, opts or dist.AllgatherOptions())
        for o, i in zip(outputs, inputs):
            self.all_gather_single(o, i, opts)
        return _done(outputs)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    # ---- reduce_scatter -----------------------------------------------------

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        if not _split(output_tensors):
            return self._host("reduce_scatter").reduce_scatter(
                output_tensors, input_tensors, opts or dist.ReduceScatterOptions())
        name, factor = reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        n = self.size()
        for out, ins in zip(output_tensors, input_tensors):
            if len(ins) != n:
                raise ValueError(f"lazyrt: reduce_scatter needs {n} input tensors, got {len(ins)}")
            for i in ins:
                _check_same(out, i, "reduce_scatter")
            with _rt.locked():
                stacked = premul(_stack(ins), factor)
                (v,) = _engine.run(self, "reduce_scatter", (("op", name), ("n", n)), [stacked])
                _rt.write(out, _reshape(v, tuple(out.shape)))
        return _done(output_tensors)

    def _reduce_scatter_base(self, output, input, opts=None):
        return self.reduce_scatter_single(output, input, opts)

    def reduce_scatter_single(self, output, input, opts=None):
        if not _split([output, input]):
            return self._host("reduce_scatter_tensor")._reduce_scatter_base(
                output, input, opts or dist.ReduceScatterOptions())
        _check_same(output, input, "reduce_scatter_tensor")
        n = self.size()
        if input.numel() != n * output.numel():
            raise ValueError(f"lazyrt: reduce_scatter_tensor input has {input.numel()} elements, "
                             f"expected {n} x {output.numel()}")
        name, factor = reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        flat = input if input.dim() >= 1 and input.shape[0] == n * (output.shape[0] if output.dim() else 1) \
            else input.reshape(n * output.numel())
        with _rt.locked():
            (v,) = _engine.run(self, "reduce_scatter", (("op", name), ("n", n)),
                               [premul(flat, factor)], "reduce_scatter_tensor")
            _rt.write(output, _reshape(v, tuple(output.shape)))
        return _done([output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        if not _split(inputs):
            return self._host("reduce_scatter_tensor_coalesced").reduce_scatter_tensor_coalesced(
                outputs, inputs, opts or dist.ReduceScatterOptions())
        for o, i in zip(outputs, inputs):
            self.reduce_scatter_single(o, i, opts)
        return _done(outputs)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    # ---- all_to_all ---------------------------------------------------------

    def alltoall(self, output_tensors, input_tensors, opts=None):
        if not _split(input_tensors):
            return self._host("all_to_all").alltoall(output_tensors, input_tensors,
                                                     opts or dist.AllToAllOptions())
        n = self.size()
        if len(input_tensors) != n or len(output_tensors) != n:
            raise ValueError(f"lazyrt: all_to_all needs {n} input and {n} output tensors")
        shapes = {tuple(t.shape) for t in list(input_tensors) + list(output_tensors)}
        if len(shapes) != 1:
            return self._alltoall_uneven(output_tensors, input_tensors)
        for i, o in enumerate(output_tensors):
            _check_same(o, input_tensors[i], "all_to_all")
        with _rt.locked():
            stacked = _stack(input_tensors)
            (v,) = _engine.run(self, "all_to_all", (("n", n),), [stacked])
            for i, o in enumerate(output_tensors):
                _rt.write(o, _index(v, i))
        return _done(output_tensors)

    def _alltoall_uneven(self, output_tensors, input_tensors):
        with _engine.rank_dependent():
            return self._alltoall_uneven_(output_tensors, input_tensors)

    def _alltoall_uneven_(self, output_tensors, input_tensors):
        # Chunks of different sizes: pad every chunk to the largest size any rank sends
        # (agreed over the host group), exchange, then cut each chunk back.
        n = self.size()
        flat_in = [t.reshape(-1) for t in input_tensors]
        local_max = max([t.numel() for t in flat_in] + [o.numel() for o in output_tensors])
        m = torch.tensor([local_max], dtype=torch.int64)
        self._gloo().allreduce([m], _max_opts()).wait()
        m = int(m.item())
        padded = [torch.nn.functional.pad(t, (0, m - t.numel())) for t in flat_in]
        with _rt.locked():
            stacked = _stack(padded)
            (v,) = _engine.run(self, "all_to_all", (("n", n),), [stacked])
            for i, o in enumerate(output_tensors):
                chunk = _index(v, i)
                _rt.write(o, _reshape(_rt_slice(chunk, o.numel()), tuple(o.shape)))
        return _done(output_tensors)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self.all_to_all_single(output, input, output_split_sizes, input_split_sizes, opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        if not _split([output, input]):
            return self._host("all_to_all_single").alltoall_base(
                output, input, list(output_split_sizes), list(input_split_sizes),
                opts or dist.AllToAllOptions())
        _check_same(output, input, "all_to_all_single")
        n = self.size()
        outs = list(output_split_sizes)
        ins = list(input_split_sizes)
        if not outs and not ins:
            if input.shape[0] % n:
                raise ValueError(f"lazyrt: all_to_all_single: dim 0 ({input.shape[0]}) is not "
                                 f"divisible by the group size {n}")
            with _rt.locked():
                (v,) = _engine.run(self, "all_to_all", (("n", n),), [input], "all_to_all_single")
                _rt.write(output, v)
            return _done([output])
        ins = ins or [input.shape[0] // n] * n
        outs = outs or [output.shape[0] // n] * n
        with _engine.rank_dependent():
            in_chunks = list(torch.split(input, ins, dim=0))
            out_chunks = list(torch.split(output, outs, dim=0))
            self.alltoall(out_chunks, in_chunks)
        return _done([output])

    # ---- rooted -------------------------------------------------------------

    def scatter(self, output_tensors, input_tensors, opts=None):
        if not _split(output_tensors):
            return self._host("scatter").scatter(output_tensors, input_tensors,
                                                 opts or dist.ScatterOptions())
        with _engine.rank_dependent():
            return self._scatter(output_tensors, input_tensors, opts)

    def _scatter(self, output_tensors, input_tensors, opts):
        src = self._root(opts.rootRank if opts is not None else 0)
        n = self.size()
        out = output_tensors[0]
        if self.rank() == src:
            ins = input_tensors[0]
            if len(ins) != n:
                raise ValueError(f"lazyrt: scatter needs {n} input tensors, got {len(ins)}")
            stacked = _stack(ins)
        else:
            # NOTE: the other ranks take part with a buffer of the same shape (its values
            # are not used), so every rank runs the same program.
            stacked = torch.zeros((n,) + tuple(out.shape), dtype=out.dtype, device="tpu")
        with _rt.locked():
            (v,) = _engine.run(self, "scatter", (("src", src), ("n", n)), [stacked])
            _rt.write(out, v)
        return _done(output_tensors)

    def gather(self, output_tensors, input_tensors, opts=None):
        if not _split(input_tensors):
            return self._host("gather").gather(output_tensors, input_tensors,
                                               opts or dist.GatherOptions())
        dst = self._root(opts.rootRank if opts is not None else 0)
        inp = input_tensors[0]
        with _engine.rank_dependent(), _rt.locked():
            (g,) = _engine.run(self, "all_gather", (("n", self.size()),), [inp], "gather")
            if self.rank() == dst:
                outs = output_tensors[0]
                for i, o in enumerate(outs):
                    _check_same(o, inp, "gather")
                    _rt.write(o, _index(g, i))
        return _done(output_tensors)

    def reduce(self, tensors, opts=None):
        if not _split(tensors):
            return self._host("reduce").reduce(list(tensors), opts or dist.ReduceOptions())
        dst = self._root(opts.rootRank if opts is not None else 0)
        name, factor = reduce_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        with _rt.locked():
            for t in tensors:
                (v,) = _engine.run(self, "reduce",
                                   (("op", name), ("dst", dst), ("n", self.size())),
                                   [premul(t, factor)])
                _rt.write(t, v)
        return _done(list(tensors))

    # ---- point to point -----------------------------------------------------

    def _pair(self, peer: int):
        """The two-rank process group (this rank and ``peer``) send/recv run over."""
        a, b = sorted((self.rank(), self._root(peer)))
        if a == b:
            raise ValueError("lazyrt: send/recv to oneself")
        key = (a, b)
        pairs = self.__dict__.setdefault("_pairs", {})
        pg = pairs.get(key)
        if pg is None:
            pg = ProcessGroupTpu(dist.PrefixStore(f"lazyrt_p2p/{a}_{b}/", self._store),
                                 0 if self.rank() == a else 1, 2, self._timeout,
                                 [self._global_ranks[a], self._global_ranks[b]],
                                 f"{self._name}:p2p{a}_{b}")
            pairs[key] = pg
        return pg, a

    def send(self, tensors, dst_rank: int, tag: int = 0):
        if not _split(tensors):
            return self._host("send").send(list(tensors), dst_rank, tag)
        pg, a = self._pair(dst_rank)
        me, peer = (0, 1) if self.rank() == a else (1, 0)
        with _engine.rank_dependent():
            for t in tensors:
                _p2p_check(pg, me, peer, t, "send")
                _engine.run(pg, "send_recv", (("src", me), ("dst", peer), ("n", 2)), [t], "send")
        return _done(list(tensors))

    def recv(self, tensors, src_rank: int, tag: int = 0):
        if not _split(tensors):
            return self._host("recv").recv(list(tensors), src_rank, tag)
        pg, a = self._pair(src_rank)
        me, peer = (0, 1) if self.rank() == a else (1, 0)
        with _engine.rank_dependent():
            for t in tensors:
                _p2p_check(pg, peer, me, t, "recv")
                with _rt.locked():
                    (v,) = _engine.run(pg, "send_recv", (("src", peer), ("dst", me), ("n", 2)),
                                       [t], "recv")
                    _rt.write(t, v)
        return _done(list(tensors))

    def recv_anysource(self, tensors, tag: int = 0):
        raise NotImplementedError("lazyrt: recv from any source is not supported on tpu "
                                  "tensors (XLA programs need both ends known)")

    # ---- host-side ------------------------------------------------------------

    def barrier(self, opts=None):
        _engine.flush_for_c10d("barrier")
        _rt.sync_device()
        return self._gloo().barrier(opts or dist.BarrierOptions())

    def monitored_barrier(self, timeout=None, wait_all_ranks: bool = False):
        _engine.flush_for_c10d("monitored_barrier")
        return self._gloo().monitored_barrier(timeout or self._timeout, wait_all_ranks)

    def _start_coalescing(self, device):
        return None

    def _end_coalescing(self, device):
        return _done([])

    def shutdown(self) -> None:
        if self._gloo_pg is not None:
            self._gloo_pg = None

    def abort(self) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"ProcessGroupTpu(rank={self.rank()}, size={self.size()}, name={self._name!r})"


# ---------------------------------------------------------------------------
# the factory c10d calls
# ---------------------------------------------------------------------------


def create(dist_backend_opts, backend_options=None) -> ProcessGroupTpu:
    store = dist_backend_opts.store
    rank = dist_backend_opts.group_rank
    size = dist_backend_opts.group_size
    timeout = dist_backend_opts.timeout
    ranks = list(dist_backend_opts.global_ranks_in_group) or list(range(size))
    if not dist.is_initialized():
        # The default group: start jax.distributed from the rendezvous first.
        _startup.ensure_started(store, rank, size, timeout)
    return ProcessGroupTpu(store, rank, size, timeout, ranks, str(dist_backend_opts.group_id))


"""SPMD with a single controller: shard tensors over a mesh of devices, let GSPMD do the rest.

torch_xla's API (``torch_xla.distributed.spmd``)::

    mesh = lazyrt.distributed.Mesh(device_ids, mesh_shape, axis_names)
    lazyrt.distributed.mark_sharding(tensor, mesh, partition_spec)

A tpu tensor's value is a ``jax.Array``, so marking it applies a ``NamedSharding``
(``jax.device_put`` of a materialized value; a ``with_sharding_constraint`` node on a
pending one, in defer mode). Every op after that is compiled by XLA's SPMD partitioner
(GSPMD) for its inputs' shardings, in strict mode (one executable per input-sharding
tuple) and in defer mode (the flush's cache key includes every input's sharding once a
Mesh exists). Tensors that were never marked are uncommitted single-device arrays, and
JAX places them replicated next to sharded ones.

Uneven shardings (a dimension the mesh axes do not divide, e.g. 2 rows over 4 devices)
are accepted, as torch_xla accepts them. A ``jax.Array`` cannot be sharded unevenly (JAX
requires the tiling to divide the shape), so lazyrt keeps such a dimension whole on every
device: the stored sharding is the requested one with each uneven entry dropped to its
longest prefix of axes that divides the dimension (often none: replicated). Values are
exact, nothing is added to any op's path; the cost is memory (that dimension is not
divided). ``get_sharding`` returns the stored sharding; ``sharding_info`` says what was
asked for, which dimensions were kept whole and the bytes one device holds.

Devices: ``device_ids`` index ``jax.devices()`` (all devices of all processes, in JAX's
global order). One process with several CPU devices needs
``jax.config.update("jax_num_cpu_devices", N)`` before JAX's backend starts (importing
lazyrt does not start it). Across processes (multi-host) every process runs the same
program and holds the same full value of a tensor it marks; a value that spans devices of
other processes cannot be read with ``.cpu()`` (JAX's error says so) unless it is fully
replicated.
"""
from __future__ import annotations

import dataclasses
import math
import weakref
from collections import OrderedDict

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from . import _rt

_global_mesh = [None]


class Mesh:
    """A logical mesh of devices: ``Mesh(device_ids, mesh_shape, axis_names)``."""

    def __init__(self, device_ids, mesh_shape, axis_names=None):
        ids = [int(i) for i in np.asarray(device_ids).reshape(-1)]
        shape = tuple(int(s) for s in mesh_shape)
        if math.prod(shape) != len(ids):
            raise ValueError(f"lazyrt: mesh shape {shape} needs {math.prod(shape)} devices, "
                             f"got {len(ids)} device ids")
        if len(set(ids)) != len(ids):
            raise ValueError(f"lazyrt: device ids {ids} repeat")
        devs = jax.devices()
        bad = [i for i in ids if not 0 <= i < len(devs)]
        if bad:
            raise ValueError(f"lazyrt: device ids {bad} do not exist; there are {len(devs)} "
                             f"devices (jax.devices()); for several CPU devices in one process "
                             f"set jax.config.update('jax_num_cpu_devices', N) before any tpu "
                             f"work")
        if axis_names is None:
            axis_names = tuple(f"dim{i}" for i in range(len(shape)))
        axis_names = tuple(axis_names)
        if len(axis_names) != len(shape) or len(set(axis_names)) != len(axis_names):
            raise ValueError(f"lazyrt: axis names {axis_names} must be {len(shape)} distinct "
                             f"names")
        self.device_ids = np.array(ids).reshape(shape)
        self.mesh_shape = shape
        self.axis_names = axis_names
        self.jax_mesh = jax.sharding.Mesh(
            np.array([devs[i] for i in ids], dtype=object).reshape(shape), axis_names)
        _rt.set_sharding_keys(True)

    def size(self) -> int:
        return len(self.device_ids.reshape(-1))

    def shape(self) -> OrderedDict:
        return OrderedDict(zip(self.axis_names, self.mesh_shape))

    def get_logical_mesh(self) -> np.ndarray:
        return self.device_ids.copy()

    def get_axis_name_idx(self, name: str) -> int:
        return self.axis_names.index(name)

    def sharding(self, partition_spec) -> NamedSharding:
        return NamedSharding(self.jax_mesh, _spec(partition_spec, self))

    def __repr__(self) -> str:
        return f"lazyrt.distributed.Mesh(shape={dict(self.shape())}, devices={self.device_ids.tolist()})"


def set_global_mesh(mesh: Mesh) -> None:
    _global_mesh[0] = mesh


def get_global_mesh() -> Mesh | None:
    return _global_mesh[0]


def _spec(partition_spec, mesh: Mesh) -> P:
    """torch_xla's partition spec (axis names or indices, None, or tuples of them; or a
    ``PartitionSpec``) -> P, every axis checked against the mesh."""

    def one(a):
        if a is None:
            return None
        if isinstance(a, (tuple, list)):
            return tuple(one(x) for x in a)
        if isinstance(a, int):
            if not -len(mesh.axis_names) <= a < len(mesh.axis_names):
                raise ValueError(f"lazyrt: mesh axis index {a} is out of range for the mesh "
                                 f"{mesh.axis_names}")
            return mesh.axis_names[a]
        if a not in mesh.axis_names:
            raise ValueError(f"lazyrt: {a!r} is not an axis of the mesh {mesh.axis_names}")
        return a

    return P(*[one(a) for a in partition_spec])


_constraint_progs: dict = {}


def _constraint_prog(sharding, aval):
    key = (sharding, aval)
    prog = _constraint_progs.get(key)
    if prog is None:
        prog = _rt.Prog("mark_sharding", lambda x: (jax.lax.with_sharding_constraint(x, sharding),),
                        (), (aval,), str(sharding.spec))
        _constraint_progs[key] = prog
    return prog


def _place(arr, sharding):
    if arr.sharding == sharding:
        return arr
    if sharding.is_fully_addressable:
        return jax.device_put(arr, sharding)
    # Multi-process: this process supplies the shards on its own devices from its (full)
    # local value.
    host = np.asarray(arr)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def _axes(entry) -> tuple:
    return () if entry is None else (entry if isinstance(entry, tuple) else (entry,))


def _stored_spec(spec: P, shape, mesh: Mesh) -> tuple[P, tuple]:
    """The sharding a value of ``shape`` can hold for ``spec``, and the dimensions kept
    (partly) whole: each entry keeps its longest prefix of axes that divides its dimension."""
    sizes = mesh.shape()
    out, whole = [], []
    for d, entry in enumerate(spec):
        axes = _axes(entry)
        keep = len(axes)
        while keep and shape[d] % math.prod(sizes[n] for n in axes[:keep]):
            keep -= 1
        if keep == len(axes):
            out.append(entry)
            continue
        whole.append(d)
        kept = axes[:keep]
        out.append(None if not kept else kept[0] if len(kept) == 1 else kept)
    return P(*out), tuple(whole)


# Storage -> (the NamedSharding mark_sharding stored, the spec it was asked for, the
# dimensions kept whole). Read by sharding_info only while the value keeps that sharding.
_requested: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def mark_sharding(t, mesh: Mesh, partition_spec):
    """Shard the tpu tensor ``t`` over ``mesh`` as ``partition_spec`` says (one entry per
    dimension: a mesh axis name or index, a tuple of them, or None for replicated), in place;
    returns ``t``. A pending value (defer mode) gets a sharding constraint node. A dimension
    the axes do not divide is kept whole (see the module docstring)."""
    if not _rt.is_tpu(t):
        raise TypeError(f"lazyrt: mark_sharding needs a tpu tensor, got one on {t.device}")
    spec = _spec(partition_spec, mesh)
    if len(spec) != t.dim():
        raise ValueError(f"lazyrt: partition spec {tuple(partition_spec)} has {len(spec)} "
                         f"entries for a {t.dim()}-d tensor")
    used = [n for entry in spec for n in _axes(entry)]
    if len(set(used)) != len(used):
        raise ValueError(f"lazyrt: partition spec {tuple(partition_spec)} uses a mesh axis "
                         f"more than once")
    stored, whole = _stored_spec(spec, tuple(t.shape), mesh)
    sharding = NamedSharding(mesh.jax_mesh, stored)
    # NOTE: the pending trace's lock from recording (a constraint node, or the write
    # through a view) to the write-back: another thread's flush must not split them.
    with _rt.locked():
        v = _rt.value_of(t)
        if isinstance(v, _rt.Pending):
            aval = (tuple(v.shape), np.dtype(v.dtype))
            new = _rt.run(_constraint_prog(sharding, aval), [v])[0]
        else:
            new = _place(v, sharding)
        _rt.write(t, new)
    st = _rt.base_storage(t)
    if st is not None:
        _requested[st] = (sharding, spec, whole)
    return t


def clear_sharding(t):
    """Make ``t`` replicated over the mesh it is sharded on (torch_xla's clear_sharding)."""
    arr = _rt.array_of(t)
    sh = arr.sharding
    if isinstance(sh, NamedSharding):
        with _rt.locked():
            _rt.write(t, _place(arr, NamedSharding(sh.mesh, P())))
    return t


def get_sharding(t):
    """The ``jax.sharding.Sharding`` of ``t``'s value (flushes a pending value)."""
    return _rt.array_of(t).sharding


def _trim(spec) -> tuple:
    """A PartitionSpec as a tuple without trailing Nones (P('x') == P('x', None))."""
    t = list(spec)
    while t and t[-1] is None:
        t.pop()
    return tuple(t)


@dataclasses.dataclass(frozen=True)
class ShardingInfo:
    """Where ``t``'s value lives. ``spec``: the PartitionSpec it is stored with;
    ``requested``: the spec ``mark_sharding`` was given (None if the value no longer holds
    what mark_sharding stored, e.g. an op wrote a new one); ``whole_dims``: requested
    dimensions kept (partly) whole because the axes do not divide them; ``shard_shape``:
    the block one device holds; ``bytes_per_device``: its size in bytes."""

    spec: P
    requested: P | None
    whole_dims: tuple
    shard_shape: tuple
    bytes_per_device: int


def sharding_info(t) -> ShardingInfo:
    """What ``get_sharding`` says, plus what was asked for and each device's share
    (flushes a pending value)."""
    arr = _rt.array_of(t)
    sh = arr.sharding
    spec = sh.spec if isinstance(sh, NamedSharding) else P()
    st = _rt.base_storage(t)
    rec = _requested.get(st) if st is not None else None
    same = rec is not None and isinstance(sh, NamedSharding) and sh.mesh == rec[0].mesh \
        and _trim(sh.spec) == _trim(rec[0].spec)
    requested, whole = (rec[1], rec[2]) if same else (None, ())
    shard = tuple(sh.shard_shape(arr.shape))
    return ShardingInfo(spec, requested, whole, shard,
                        math.prod(shard) * np.dtype(arr.dtype).itemsize)

"""Runtime scalars on the device: how a Python float or int reaches an executable.

A Python scalar handed to a compiled XLA program is an implicit host-to-device transfer
at every call (on a GPU a synchronous copy each; ``jax.transfer_guard`` reports it).
lazyrt passes none: strict passes each scalar as a device array (``Store.put``), a flush
passes its scalar vector as one (``put_vector``). The programs are unchanged: they are
still compiled for the scalars' Python types (a float: a weak-typed float64, an int: a
weak-typed int64; a device array of the same dtype is taken in its place), so results are
the same bit for bit.

* Scalars that repeat stay on the device: a ``Store`` (one per sharding the scalars are
  compiled for) keeps one device array per value, bit for bit (``-0.0`` is not ``0.0``)
  and per dtype (``1`` is not ``1.0``). A value enters it the second time it is met, so
  values that never repeat (an RNG seed per random op) do not push out those that do
  (a learning rate); it is bounded (``MAX_VALUES``; full, it starts over).
* Scalars that change travel explicitly (``jax.device_put``): all of one op's new
  values in one call, each distinct value once; a flush's whole vector in one transfer,
  kept on the device while the next flush of that executable passes the same values.
"""
from __future__ import annotations

import math

import jax
import numpy as np

from .._base.metrics import COUNTERS

_X64 = jax.enable_x64
# values kept per Store and per kind (float, int); values seen once are remembered up to
# the same bound
MAX_VALUES = 4096


def _zero_key(s: float):
    # NOTE: 0.0 == -0.0 (same hash): zeros are kept under keys no float equals, and a
    # lookup of either zero misses the float keys and comes here
    return "-0" if math.copysign(1.0, s) < 0 else "+0"


class Store:
    """The device-resident scalars of one sharding (a device, or a mesh replicated)."""

    __slots__ = ("sharding", "f", "i", "seen")

    def __init__(self, sharding):
        self.sharding = sharding
        self.f: dict = {}  # float value (or _zero_key) -> float64 array
        self.i: dict = {}  # int value -> int64 array
        self.seen: set = set()  # (kind, key) of values met once

    def put(self, scalars) -> list | None:
        """``scalars`` (Python floats and ints) as device arrays of this sharding; None if
        one is neither (or an int out of int64's range)."""
        f, i = self.f, self.i
        out = []
        miss = None
        for s in scalars:
            tp = type(s)
            if tp is float:
                a = f.get(s)
            elif tp is int:
                a = i.get(s)
            elif isinstance(s, int) and tp is not bool:  # an int subclass (RuntimeInt)
                a = i.get(s)
            else:  # not a Python float or int: the caller passes the scalars as they are
                return None
            if a is None:
                if miss is None:
                    miss = []
                miss.append(len(out))
            out.append(a)
        if miss is not None and not self._fill(scalars, out, miss):
            return None
        return out

    def _fill(self, scalars, out: list, miss: list) -> bool:
        """Look the missed scalars up again (zeros), transfer the new values in one
        explicit ``device_put`` (each distinct value once), keep those met before."""
        new: dict = {}  # (is float, key) -> [positions]
        for k in miss:
            s = scalars[k]
            fl = type(s) is float
            key = _zero_key(s) if fl and s == 0.0 else s
            if fl and key is not s:
                a = self.f.get(key)
                if a is not None:
                    out[k] = a
                    continue
            new.setdefault((fl, key), []).append(k)
        if not new:
            return True
        keys = list(new)
        try:
            host = [np.float64(scalars[new[k][0]]) if k[0] else np.int64(scalars[new[k][0]])
                    for k in keys]
        except OverflowError:  # JAX's own call raises its error for it
            return False
        with _X64(True):
            arrays = jax.device_put(host, self.sharding)
        COUNTERS["scalar_transfers"] += 1
        seen = self.seen
        if len(seen) > MAX_VALUES:
            seen.clear()
        for k, a in zip(keys, arrays):
            for pos in new[k]:
                out[pos] = a
            if k in seen:
                d = self.f if k[0] else self.i
                if len(d) >= MAX_VALUES:
                    d.clear()
                d[k[1]] = a
            else:
                seen.add(k)
        return True


_stores: dict = {}


def store(sharding) -> Store:
    """The ``Store`` of ``sharding`` (made on first use)."""
    st = _stores.get(sharding)
    if st is None:
        st = _stores[sharding] = Store(sharding)
    return st


def input_shardings(exe) -> tuple | None:
    """The flat input shardings ``exe`` (a ``jax.stages.Compiled``, or lazyrt's wrapper of
    one) was compiled for, or None when it does not say."""
    exe = getattr(exe, "exe", exe)  # ``_xla.FirstTier``
    try:
        return tuple(jax.tree_util.tree_leaves(exe.input_shardings[0]))
    except Exception:
        return None


def store_for(exe, n_arrays: int, n_scalars: int) -> Store | None:
    """The store of ``exe``'s scalar inputs (its last ``n_scalars`` of ``n_arrays +
    n_scalars``), or None where they do not share one sharding (they are passed as
    Python scalars then)."""
    sh = input_shardings(exe)
    if sh is None or len(sh) != n_arrays + n_scalars:
        return None
    sc = set(sh[n_arrays:])
    if len(sc) != 1:
        return None
    try:
        return store(sc.pop())
    except TypeError:  # an unhashable sharding
        return None


class Vector:
    """A flush executable's scalar vector on the device: the last one passed, kept while
    the next flush passes the same values (bit for bit)."""

    __slots__ = ("sharding", "host", "dev")

    def __init__(self, sharding):
        self.sharding = sharding
        self.host = None
        self.dev = None

    def put(self, vec: np.ndarray):
        h = self.host
        if h is not None and h.shape == vec.shape and h.tobytes() == vec.tobytes():
            return self.dev
        with _X64(True):
            dev = jax.device_put(vec, self.sharding)
        COUNTERS["scalar_transfers"] += 1
        self.host, self.dev = vec.copy(), dev
        return dev


def vector_for(exe, position: int) -> Vector | None:
    """A ``Vector`` for the input of ``exe`` at flat ``position`` (its last: a flush's
    scalar vector), or None when ``exe`` does not say its sharding."""
    sh = input_shardings(exe)
    if sh is None or not sh:
        return None
    return Vector(sh[position])


def clear() -> None:
    _stores.clear()

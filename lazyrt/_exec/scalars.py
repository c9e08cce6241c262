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
* Scalars that change travel explicitly (``_put``, what ``jax.device_put`` does): all of
  one op's new values in one call, each distinct value once; a flush's whole vector in
  one transfer, kept on the device while the next flush of that executable passes the
  same values.
"""
from __future__ import annotations

import math

import jax
import numpy as np

from .._base.metrics import COUNTERS

try:  # JAX's own transfer, below jax.device_put (``_put``)
    from jax._src import core as _jcore
    from jax._src.lib import _jax as _xc
    from jax._src.lib import guard_lib as _guard
except ImportError:  # pragma: no cover - another JAX
    _xc = None

_X64 = jax.enable_x64
# values kept per Store and per kind (float, int); values seen once are remembered up to
# the same bound
MAX_VALUES = 4096


# Whether ``_put``'s transfer gave what ``jax.device_put`` gives (None: not tried yet).
_FAST_OK: list = [None if _xc is not None else False]
_AVALS: dict = {}


def _aval(h):
    """The aval of host value ``h`` (a Python float: float64, an int: int64, an array)."""
    key = (h.shape, h.dtype) if type(h) is np.ndarray else type(h) is float
    a = _AVALS.get(key)
    if a is None:
        if type(h) is np.ndarray:
            a = _jcore.ShapedArray(h.shape, h.dtype)
        else:
            a = _jcore.ShapedArray((), np.float64 if key else np.int64)
        a = _AVALS[key] = a
    return a


def _host(h):
    """``h`` as numpy (a Python float as float64, an int as int64), for jax.device_put."""
    if type(h) is np.ndarray:
        return h
    return np.float64(h) if type(h) is float else np.int64(h)


def _same(a, b) -> bool:
    return (a.shape == b.shape and a.dtype == b.dtype and a.sharding == b.sharding
            and np.asarray(a).tobytes() == np.asarray(b).tobytes())


def _devices(sharding) -> list | None:
    """The devices ``_put`` copies a value to for ``sharding`` (one, or all of a replicated
    sharding); None where it leaves the transfer to ``jax.device_put``."""
    try:
        devs = list(sharding._addressable_device_assignment)
        return devs if len(devs) == 1 or sharding.is_fully_replicated else None
    except Exception:
        return None


def _put(hosts: list, sharding, devs: list | None) -> list:
    """Explicit transfers of the host values ``hosts`` (Python floats, as float64; ints, as
    int64; numpy arrays) to ``sharding`` (``devs``: its ``_devices``): one device array each.

    ``jax.device_put`` costs 65-130 us a call on this project's CPU host (its pytree,
    sharding and dispatch handling), several times the implicit transfer it replaces
    (~5 us). JAX's own ``batched_device_put`` (what ``jax.device_put`` ends in), marked
    explicit for the transfer guard as ``jax.device_put`` marks it, costs ~3.5 us for a
    Python scalar. It is used where the sharding is one device or replicated, after its
    first result was checked equal to ``jax.device_put``'s (a JAX whose internals changed
    falls back to ``jax.device_put``)."""
    if devs is not None and _FAST_OK[0] is not False:
        try:
            n = len(devs)
            state = _guard.thread_local_state()
            prev = state.explicit_device_put
            state.explicit_device_put = True
            try:
                out = [_xc.batched_device_put(_aval(h), sharding, [h] * n, devs, True,
                                              enable_x64=True) for h in hosts]
            finally:
                state.explicit_device_put = prev
            if _FAST_OK[0] is None:
                with _X64(True):
                    ref = jax.device_put([_host(h) for h in hosts], sharding)
                _FAST_OK[0] = all(_same(a, b) for a, b in zip(out, ref))
                if not _FAST_OK[0]:
                    return ref
            return out
        except Exception:
            _FAST_OK[0] = False
    with _X64(True):
        return jax.device_put([_host(h) for h in hosts], sharding)


def _zero_key(s: float):
    # NOTE: 0.0 == -0.0 (same hash): zeros are kept under keys no float equals, and a
    # lookup of either zero misses the float keys and comes here
    return "-0" if math.copysign(1.0, s) < 0 else "+0"


class Store:
    """The device-resident scalars of one sharding (a device, or a mesh replicated)."""

    __slots__ = ("sharding", "devs", "f", "i", "seen")

    def __init__(self, sharding):
        self.sharding = sharding
        self.devs = _devices(sharding)
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
        if len(miss) == 1:  # the common case (a seed, a step size), without the loops
            k = miss[0]
            s = scalars[k]
            if type(s) is float:
                if s != 0.0:
                    a = _put([s], self.sharding, self.devs)[0]
                    COUNTERS["scalar_transfers"] += 1
                    out[k] = a
                    self._keep((True, s), a)
                    return True
            elif type(s) is int and -2**63 <= s < 2**63:
                a = _put([s], self.sharding, self.devs)[0]
                COUNTERS["scalar_transfers"] += 1
                out[k] = a
                self._keep((False, s), a)
                return True
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
        host = []
        for k in keys:
            h = scalars[new[k][0]]
            if not k[0]:
                if not -2**63 <= h < 2**63:  # JAX's own call raises its error
                    return False
                if type(h) is not int:
                    h = int(h)  # an int subclass (RuntimeInt) as a plain int
            host.append(h)
        arrays = _put(host, self.sharding, self.devs)
        COUNTERS["scalar_transfers"] += 1
        for k, a in zip(keys, arrays):
            for pos in new[k]:
                out[pos] = a
            self._keep(k, a)
        return True

    def _keep(self, k: tuple, a) -> None:
        """Keep ``a`` for value ``k`` (is float, key) if it was met before; else note it."""
        seen = self.seen
        if k in seen:
            d = self.f if k[0] else self.i
            if len(d) >= MAX_VALUES:
                d.clear()
            d[k[1]] = a
        else:
            if len(seen) >= MAX_VALUES:
                seen.clear()
            seen.add(k)


_stores: dict = {}


def store(sharding) -> Store:
    """The ``Store`` of ``sharding`` (made on first use)."""
    st = _stores.get(sharding)
    if st is None:
        st = _stores[sharding] = Store(sharding)
    return st


def input_shardings(exe) -> tuple | None:
    """The flat input shardings ``exe`` (a ``jax.stages.Compiled``, or lazyrt's wrapper of
    one) was compiled for (None at an argument the program does not read: JAX drops it,
    it is never transferred), or None when ``exe`` does not say."""
    exe = getattr(exe, "exe", exe)  # ``_xla.FirstTier``
    try:
        return tuple(jax.tree_util.tree_leaves(exe.input_shardings[0],
                                               is_leaf=lambda x: x is None))
    except Exception:
        return None


def store_for(exe, n_arrays: int, n_scalars: int) -> Store | None:
    """The store of ``exe``'s scalar inputs (its last ``n_scalars`` of ``n_arrays +
    n_scalars``), or None where those it reads do not share one sharding on one device or
    replicated (they are passed as Python scalars then)."""
    sh = input_shardings(exe)
    if sh is None or len(sh) != n_arrays + n_scalars:
        return None
    sc = {s for s in sh[n_arrays:] if s is not None}
    if len(sc) != 1:
        return None
    try:
        st = store(sc.pop())
    except TypeError:  # an unhashable sharding
        return None
    return st if st.devs is not None else None


class Vector:
    """A flush executable's scalar vector on the device: the last one passed, kept while
    the next flush passes the same values (bit for bit)."""

    __slots__ = ("sharding", "devs", "host", "dev")

    def __init__(self, sharding):
        self.sharding = sharding
        self.devs = _devices(sharding)
        self.host = None
        self.dev = None

    def put(self, vec: np.ndarray):
        h = self.host
        if h is not None and h.shape == vec.shape and h.tobytes() == vec.tobytes():
            return self.dev
        host = vec.copy()
        dev = _put([host], self.sharding, self.devs)[0]
        COUNTERS["scalar_transfers"] += 1
        self.host, self.dev = host, dev
        return dev


def vector_for(exe, n_inputs: int) -> Vector | None:
    """A ``Vector`` for the last of the ``n_inputs`` flat inputs of ``exe`` (a flush's
    scalar vector), or None where ``exe`` does not say its sharding, does not read it, or
    takes it otherwise than on one device or replicated."""
    sh = input_shardings(exe)
    if sh is None or len(sh) != n_inputs or sh[-1] is None:
        return None
    v = Vector(sh[-1])
    return v if v.devs is not None else None


def clear() -> None:
    _stores.clear()

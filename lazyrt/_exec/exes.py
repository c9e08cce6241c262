"""The cache of compiled defer flushes: an LRU of executables keyed by a trace's structural
hash, each checked against the trace itself before it runs (``Exe.matches``) and against
the scalar layout it was compiled for (``Exe.fits``)."""
from __future__ import annotations

import collections
import hashlib

import numpy as np

from .._base.config import config
from .._base.ir import aval_nbytes
from .._base.metrics import COUNTERS
from .trace import Trace, describe

# key -> [Exe, ...] (executables whose traces' keys collide), least recently used first
_cache: collections.OrderedDict = collections.OrderedDict()


class Exe:
    """A compiled flush, with the trace structure it was compiled for."""

    __slots__ = ("compiled", "mem", "desc", "src", "hits", "out_nbytes", "largest", "nodes",
                 "refs", "leaf_avals", "sc_first", "sc_slots", "sc_gather", "trace_hash",
                 "sc_dev")

    def __init__(self, compiled, mem, tr: Trace, src, out_avals, sc_first=None, sc_slots=None,
                 trace_hash: str = ""):
        self.compiled = compiled
        # the scalar layout compiled for (``scalar_layout``; None: one slot per scalar)
        self.sc_first = sc_first
        self.sc_slots = sc_slots
        # per scalar, the position of the first scalar of its slot (``fits``)
        self.sc_gather = None if sc_slots is None else np.asarray(sc_first)[sc_slots]
        # the scalar vector on the device (``_defer``: a ``_scalars.Vector``; None: not
        # made yet, False: passed as a host array)
        self.sc_dev = None
        self.trace_hash = trace_hash
        self.mem = mem
        self.desc = describe(tr)
        self.src = src
        self.hits = 0
        self.nodes = list(tr.nodes)
        self.refs = list(tr.refs)
        self.leaf_avals = list(tr.leaf_avals)
        # Per-output bytes and the five largest outputs: the same on every run, so worked
        # out once here rather than from the result arrays on each flush (every flush's
        # log record shares ``largest``: read-only).
        sizes = [(aval_nbytes(s, d), tuple(s), str(np.dtype(d))) for s, d in out_avals]
        self.out_nbytes = tuple(b for b, _, _ in sizes)
        self.largest = [{"bytes": b, "shape": list(s), "dtype": d}
                        for b, s, d in sorted(sizes, reverse=True)[:5]]

    def install_from(self, first):
        """The compile worker's swap (``_xla.Upgrade``): this flush runs the optimized
        executable from its next call on; the flush reads ``compiled`` once per call."""

        def install(compiled, mem) -> None:
            if self.compiled is first:
                self.compiled, self.mem = compiled, mem

        return install

    def matches(self, tr: Trace) -> bool:
        """Whether this executable computes ``tr``: the same progs (by identity), the
        same input wiring and the same leaf avals. (Live outputs and donation are in the
        cache key itself.) C-level list compares: microseconds for a 1,000-op trace."""
        return (self.nodes == tr.nodes and self.refs == tr.refs
                and self.leaf_avals == tr.leaf_avals)

    def fits(self, scal: np.ndarray) -> bool:
        """Whether the scalars that shared a slot at compile time still hold one value."""
        g = self.sc_gather
        if g is None:
            return True
        bits = scal.view(np.int64)
        return bool((bits[g] == bits).all())

    def scalar_input(self, scal: np.ndarray) -> np.ndarray:
        """The program's scalar vector: one value per slot."""
        return scal if self.sc_first is None else scal[self.sc_first]


def flush_signature(tr: Trace, out_refs, donate_mask, slots) -> str | None:
    """A flush's program in lazyrt's own terms (``Prog.sig`` of each node, the input
    wiring, the leaf avals, the live outputs, the donation, the scalar slots), naming its
    executable in the persistent cache without tracing it; None if a node has none."""
    h = hashlib.sha256(b"flush-1\0")
    for p in tr.nodes:
        if p.sig is None:
            return None
        h.update(p.sig.encode())
        h.update(b";")
    rest = (tuple(tr.refs), tuple(tr.leaf_avals), tuple(out_refs), tuple(donate_mask),
            None if slots is None else tuple(int(x) for x in slots))
    h.update(repr(rest).encode())
    return h.hexdigest()


def scalar_layout(scal: np.ndarray, tr: Trace | None = None):
    """``(first, slots)``: where each distinct value (bit for bit) is first used, in order
    of first use, and each scalar's slot in that list; ``(None, None)`` if all differ.
    Only floats share slots (``tr``'s nodes say which scalars are ints): ints are positions,
    value ints and seeds, small numbers equal by chance (a position 1 and a multiplier 1),
    and a layout that shared them would not fit the next call's values."""
    n = len(scal)
    if n < 2:
        return None, None
    bits = scal.view(np.int64)
    if tr is not None:
        kinds = [k for p in tr.nodes for k in p.scalar_kinds]
        if "i" in kinds:
            tag = np.where(np.array([k == "i" for k in kinds]), np.arange(1, n + 1), 0)
            bits = np.stack([bits, tag], 1)
    u, first, inv = np.unique(bits, return_index=True, return_inverse=True, axis=0)
    if len(u) == n:
        return None, None
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(u), dtype=np.intp)
    rank[order] = np.arange(len(u))
    return first[order], rank[inv.reshape(-1)]


def compiled_before(key, tr: Trace) -> bool:
    """Whether a program of ``tr``'s ops is cached whose scalar layout did not fit (values
    that shared a slot then differ now): its next one takes a slot per scalar, which fits
    every value, so equal values by chance (a position equal to a multiplier) cost one
    program more, never one per value."""
    return any(exe.matches(tr) for exe in _cache.get(key, ()))


def lookup(key, tr: Trace, scal: np.ndarray) -> Exe | None:
    bucket = _cache.get(key)
    if bucket is None:
        return None
    _cache.move_to_end(key)
    found = False
    for exe in bucket:
        if exe.matches(tr):
            found = True
            if exe.fits(scal):
                return exe
    if not found:
        COUNTERS["hash_collisions"] += 1
    return None


def insert(key, exe: Exe) -> None:
    bucket = _cache.get(key)
    if bucket is None:
        _cache[key] = [exe]
        while len(_cache) > config.cache_size:
            _cache.popitem(last=False)
    else:
        bucket.append(exe)


def count() -> int:
    return sum(len(b) for b in _cache.values())


def recent(n: int) -> list:
    """The executables of the ``n`` most recently used keys."""
    return [exe for bucket in list(_cache.values())[-n:] for exe in bucket]


def all_exes() -> list:
    return [exe for bucket in _cache.values() for exe in bucket]


def cache_info() -> dict:
    return {"entries": count(), "maxsize": config.cache_size}


def clear() -> None:
    _cache.clear()

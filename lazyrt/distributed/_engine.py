"""Where a collective on tpu tensors runs: isolated (its own program, now) or fused (a
node of the pending trace).

The anti-deadlock rule (``_fused`` enforces its second half):

1. Every c10d call (a device collective, a CPU/gloo one, an object collective, a
   barrier) first flushes the pending trace of this rank. c10d calls happen in the same
   order on every rank of a group, so a pending fused collective is flushed there by all
   of its ranks, and never left pending on one rank while that rank blocks in a host-side
   collective that waits for the others (the deadlock of notes/distributed.md).
2. A flush that holds fused collectives (at any sync point, including rank-local ones:
   ``.item()``, ``.cpu()``, ``print``, data-dependent shapes, the op budget) runs only
   after every rank of the group has reached a flush of the same program (same
   fingerprint), checked through the group's store within ``LAZYRT_DIST_SYNC_TIMEOUT``.
   A rank whose peers flush a different program, or none in time, raises a
   ``RuntimeError`` naming both sync points instead of hanging; its tensors stay pending.
"""
from __future__ import annotations

import numpy as np

from . import _collectives, _fused, _rt
from ._collectives import STATS
from ._config import dist_config


def fused_active() -> bool:
    return dist_config.fused and _rt.deferring()


def flush_for_c10d(what: str) -> None:
    """Rule 1: a c10d call flushes this rank's pending trace first."""
    if _rt.deferring() and _rt.pending_count():
        _rt.flush(reason=f"c10d {what}")


_forced_isolated = [0]


class rank_dependent:
    """Context for a collective whose local work differs between ranks (gather writes
    outputs on the root only, send/recv on one end, uneven all_to_all slices rank-sized
    chunks). Fused programs must be the same on every rank, so inside this block the
    collective runs isolated, and in fused mode the rank-dependent ops recorded around it
    are flushed on the way out (a rank-local program with no collective in it)."""

    def __enter__(self):
        self.fused = fused_active()
        if self.fused:
            flush_for_c10d("rank-dependent collective")
        _forced_isolated[0] += 1
        return self

    def __exit__(self, *exc):
        _forced_isolated[0] -= 1
        if self.fused and exc[0] is None and _rt.pending_count():
            _rt.flush(reason="after a rank-dependent collective")
        return False


def _values(tensors) -> list:
    return [_rt.value_of(t) for t in tensors]


def run(pg, kind: str, params: tuple, tensors, what: str | None = None) -> list:
    """Run collective ``kind`` of ``pg``'s group on this rank's tpu ``tensors``.

    Returns the new values (one per output: ``jax.Array`` when isolated, ``Pending``
    when fused); the caller writes them into its output tensors."""
    comm = pg.comm
    what = what or kind
    if fused_active() and not _forced_isolated[0]:
        return _fused.record(pg, kind, params, tensors)
    flush_for_c10d(what)
    arrays = [_rt.array_of(t) for t in tensors]
    if dist_config.check == "on":
        _fused.check_isolated(pg, kind, params, arrays)
    STATS["isolated"] += 1
    return comm.run(kind, params, arrays)


def local_avals(tensors) -> tuple:
    return tuple((tuple(t.shape), np.dtype(_rt.to_jax_dtype(t.dtype))) for t in tensors)


__all__ = ["run", "flush_for_c10d", "fused_active", "local_avals", "_collectives"]

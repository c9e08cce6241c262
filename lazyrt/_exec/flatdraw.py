"""A cold random draw of a new shape, made by a flat draw of a bucketed length.

A random plan whose draw is made element by element (``_ops.flat_draws``) gets
``prog.flat``: N -> the same draw over N elements, flat, one Prog for every shape. On the
CPU platform its first ``consts.COLD_CALLS`` calls (within ``consts.COLD_SECONDS`` of
their own time: the host runs' bounds) run the flat draw of the next power of two at or
above its size (at least ``MIN_LENGTH``), take the first elements and reshape them: bit
for bit the draw of that shape, with one compile per length instead of one per shape.
Its 5th call compiles the plan's own program, so a loop's draws run one executable, with
no copy, and a warmed-up loop compiles nothing more. (A bound of 64 calls saved more on
PyTorch's ``test_view_ops``, which draws each random shape 4-20 times: 347 s -> 244 s
against 407 s -> 363 s, but a loop then compiled its draws after its warm-up.)

Why: a draw compiles for 0.2-0.5 s on the 2-core machine (threefry, and ``erfinv`` for
``randn``), and tests draw inputs of many shapes (PyTorch's ``test_view_ops``, random
shapes: ``test_atleast``; ``make_tensor``: ``uniform_``). ``python -m perf.flat_draws``
compares both ways.
"""
from __future__ import annotations

import math
import time

import jax
import numpy as np

from .._base.metrics import COUNTERS
from . import consts as _consts

# the shortest flat draw (short draws share one program)
MIN_LENGTH = 64
# off: every draw compiles its own program (``perf.flat_draws``'s comparison)
ENABLED = True


def length(n: int) -> int:
    """The flat draw's length for a draw of ``n`` elements."""
    return max(MIN_LENGTH, 1 << (n - 1).bit_length())


def run(prog, arrays: list, scalars: list, run_prog):
    """``prog``'s outputs from its flat draw (``run_prog``: strict's ``run``), or None
    where it is to run its own program: not a flat draw, not the CPU platform, or past
    its cold calls."""
    make = prog.flat
    if make is None or not ENABLED or not _consts.COLD_ENABLED or not _consts.on_cpu() \
            or _consts.cold_spent(prog):
        return None
    (shape, _), = prog.out_avals
    n = math.prod(shape)
    if not 0 < n <= _consts.COLD_ELEMENTS:
        return None
    dev = None
    if arrays:
        devs = arrays[0].devices()
        if len(devs) != 1:  # sharded: its placement is GSPMD's choice
            return None
        dev = next(iter(devs))
    flat = make(length(n))
    if flat is None:
        return None
    t0, c0 = time.perf_counter(), COUNTERS["compile_seconds"]
    out, = run_prog(flat, [], scalars)
    with jax.enable_x64(True):
        res = jax.device_put(np.asarray(out)[:n].reshape(shape), dev)
    prog.host_calls += 1
    # the flat draw's compile is not this program's cost: only its runs count
    prog.host_seconds += time.perf_counter() - t0 - (COUNTERS["compile_seconds"] - c0)
    COUNTERS["flat_draws"] += 1
    return [res]

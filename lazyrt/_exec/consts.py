"""Constants made on the host: factories run without compiling a program for each shape.

Start-up is full of programs that make a constant: every parameter moved with ``.to("tpu")``
starts as an ``empty_strided`` of its shape, an optimizer's state is a ``zeros_like`` per
parameter shape, a static cache is ``zeros`` per layer. In strict mode each would be a
program compiled once and run once (a third of a small CNN's first-step compiles). A Prog
whose outputs read no input's value (``Prog.const``) is evaluated here instead, with
numpy, from its jaxpr, and the result is transferred: no compile at all.

Only primitives whose numpy result is exactly XLA's are evaluated (broadcasts, iotas,
reshapes, selects, integer arithmetic, comparisons, exact conversions); a program with any
other (float arithmetic, a float-to-int conversion) is compiled as before. On the CPU
platform the transfer is free, so a constant is always made here; elsewhere a program
that keeps being called (``DEVICE_CALLS``) is compiled, since filling on the device beats
a transfer. A program whose inputs lie on several devices (a mesh) is compiled: where its
outputs go is GSPMD's choice.
"""
from __future__ import annotations

import os
import time

import jax
import jax.extend.core as jcore
import numpy as np

from .._base.platform import on_cpu
from .hosteval import DATA, evaluate_jaxpr

DEVICE_CALLS = 8
# On the CPU platform, a program that reads its inputs is evaluated here on its first
# ``COLD_CALLS`` calls, until its runs here have taken ``COLD_SECONDS``, if its inputs hold
# at most ``COLD_ELEMENTS`` elements; then it is compiled. A small program's lowering and
# compile take 40-80 ms on the 2-core machine (cProfile of PyTorch's test_view_ops on tpu:
# 3,894 programs, 18 ms lowering and 59 ms XLA compile each), so a program run once or a
# few times, as a new shape's or a test's, never pays it. The call bound keeps a training
# step's programs compiled from its 5th step on (``python -m perf`` warms up 8 steps);
# with no call bound, tests that loop would save more compiles (PyTorch's TestOldViewOps
# on tpu, one side-by-side run: 139 s with no call bound against 212 s with 4).
# ``LAZYRT_HOST_EVAL=0`` turns this off (constants are still made here).
COLD_SECONDS = 0.03
COLD_CALLS = 4
COLD_ELEMENTS = 1 << 20
COLD_ENABLED = os.environ.get("LAZYRT_HOST_EVAL", "1") != "0"
# (name, static arguments, input dtypes, output dtypes) of programs hosteval refused: not
# traced again
_REFUSED: set = set()
# ``LAZYRT_HOST_CONSTANTS=0`` turns it off (every constant is compiled, as any program).
ENABLED = os.environ.get("LAZYRT_HOST_CONSTANTS", "1") != "0"


def evaluate(prog, arrays: list, scalars: list):
    """``prog``'s outputs made on the host and transferred (jax.Arrays), or None when it
    is to be compiled instead: not supported (``hosteval``), a constant called often on an
    accelerator, or a program that reads its inputs anywhere but on the CPU platform, or
    once its host runs have taken ``COLD_SECONDS``."""
    host = prog.host
    if host is False or not ENABLED:
        return None
    dev = None
    if arrays:
        devs = set().union(*(a.devices() for a in arrays))
        if len(devs) != 1:  # a program over a mesh: its outputs' placement is GSPMD's choice
            return None
        dev = next(iter(devs))
    cpu = on_cpu()
    if not prog.const and (not cpu or not COLD_ENABLED or cold_spent(prog)
                           or sum(a.size for a in arrays) > COLD_ELEMENTS):
        return None
    t0 = time.perf_counter()
    if prog.host_calls >= DEVICE_CALLS and not cpu:
        return None
    # (the static arguments too: one view program refused is not every view's verdict)
    key = (prog.name, prog.desc, tuple(a.dtype for a in arrays),
           tuple(d for _, d in prog.out_avals))
    if host is None:
        if key in _REFUSED:
            prog.host = False
            return None
        try:
            with jax.enable_x64(True):
                host = jax.make_jaxpr(prog.fn)(
                    *[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays], *scalars)
        except Exception:  # not traceable on its own: compile it as any program
            host = False
        if (host is not False and prog.const
                and _used(host.jaxpr) & set(host.jaxpr.invars[:len(arrays)])):
            host = False  # reads an input's value after all
        prog.host = host
        if host is False:
            _REFUSED.add(key)
            return None
    try:
        ins = [None] * len(arrays) if prog.const else [np.asarray(a) for a in arrays]
    except Exception:  # a deleted (donated) array: the compiled call raises what JAX raises
        return None
    ins += [np.asarray(s, dtype=v.aval.dtype)
            for s, v in zip(scalars, host.jaxpr.invars[len(arrays):])]
    outs = evaluate_jaxpr(host.jaxpr, host.consts, ins)
    if outs is None:
        prog.host = False
        _REFUSED.add(key)
        return None
    if outs is DATA:  # this call's values (a denormal, an empty reduction): compile
        return None
    with jax.enable_x64(True):
        outs = [jax.device_put(np.array(o, order="C"), dev) for o in outs]
    # (a call made here; a refused program's calls are counted where they run:
    # ``flatdraw``)
    prog.host_calls += 1
    prog.host_seconds += time.perf_counter() - t0
    return outs


def cold_spent(prog) -> bool:
    """Whether a program that reads its inputs has had its runs on the host."""
    return prog.host_calls >= COLD_CALLS or prog.host_seconds >= COLD_SECONDS


def _used(jaxpr) -> set:
    used = {v for e in jaxpr.eqns for v in e.invars if type(v) is not jcore.Literal}
    used.update(v for v in jaxpr.outvars if type(v) is not jcore.Literal)
    return used

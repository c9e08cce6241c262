"""The two value kinds lazyrt computes with, and the unit of computation.

* a materialized value is a ``jax.Array``;
* a pending value (defer mode) is a ``Pending``: output ``idx`` of node ``node``
  of a ``Trace`` not yet run.

A ``Prog`` is a pure JAX function over flat arrays and scalars with known
output avals: one ATen op with its static arguments bound (a plan), or a
runtime helper (deriving a view, writing through a view). Strict mode runs a
Prog compiled on its own; defer mode records it as a node and later traces it
into the flush's single computation.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

_uids = itertools.count(1)


def aval_nbytes(shape, dtype) -> int:
    """Bytes of an array of ``shape`` and ``dtype`` (no ``jax.Array.nbytes`` call)."""
    return math.prod(shape) * np.dtype(dtype).itemsize


class Prog:
    __slots__ = ("uid", "name", "fn", "scalar_kinds", "out_avals", "exe", "mem", "desc", "op",
                 "out_nbytes", "const", "graph", "flush_misses", "host", "host_calls",
                 "host_seconds",
                 "direct", "donate", "sig", "flat")

    def __init__(self, name: str, fn, scalar_kinds: tuple, out_avals: tuple, desc: str = "", op=None,
                 const: bool = False):
        self.uid = next(_uids)
        self.name = name
        # fn(*arrays, *scalars) -> tuple of arrays
        self.fn = fn
        # one of "f" (float) / "i" (int, an RNG seed) per scalar input
        self.scalar_kinds = scalar_kinds
        # ((shape, jnp dtype), ...) of the outputs
        self.out_avals = out_avals
        self.out_nbytes = tuple(aval_nbytes(sh, dt) for sh, dt in out_avals)
        # strict mode: the compiled executable and its memory analysis
        self.exe = None
        self.mem = None
        # how strict calls ``exe`` (``_strict._direct``: remade when ``exe`` is rebound)
        self.direct = None
        self.desc = desc
        self.op = op
        # its outputs read no input array's value (a factory: zeros_like, full, ...)
        self.const = const
        # a torch.compile graph (``_compile``), and how many defer flushes holding it
        # compiled (``_defer``: a graph whose surroundings keep changing is isolated)
        self.graph = False
        self.flush_misses = 0
        # a prog made on the host (``_exec.consts``): its jaxpr (None: not traced yet,
        # False: compiled instead) and how often it was made there
        self.host = None
        self.host_calls = 0
        # time its runs on the host took (a program that reads inputs: ``_exec.consts``)
        self.host_seconds = 0.0
        # positions of array inputs the executable may reuse (``jax_op``'s ``donate``)
        self.donate = ()
        # what the program is, in lazyrt's own terms (op, static arguments, avals: a plan's
        # ``args.signature``), to find its executable in the persistent cache without
        # tracing it; None: found by its traced text only
        self.sig = None
        # a random draw made elementwise over threefry's counters: N -> the Prog of the same
        # draw over N elements, flat (``_ops.plan``, ``_exec.flatdraw``); None otherwise
        self.flat = None

    def __repr__(self) -> str:
        return f"Prog({self.name})"


class Pending:
    """Output ``idx`` of node ``node`` in ``trace``; ``result`` once run."""

    __slots__ = ("trace", "node", "idx", "aval", "result")

    def __init__(self, trace, node: int, idx: int, aval):
        self.trace = trace
        self.node = node
        self.idx = idx
        self.aval = aval
        self.result = None

    @property
    def shape(self):
        return self.aval[0]

    @property
    def dtype(self):
        return self.aval[1]

    def __repr__(self) -> str:
        return f"Pending(%{self.node}.{self.idx}, {self.aval[0]}, {self.aval[1]})"

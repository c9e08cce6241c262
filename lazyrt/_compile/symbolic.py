"""Symbolic ints in a compiled graph: runtime scalars or, where they set shapes, constants.

Dynamo turns a Python int that changed between calls into a ``SymInt`` graph input
(automatic dynamic; tpu tensors keep static shapes). In AOTAutograd's graphs such an input
is a placeholder whose value is a ``SymInt`` with a symbol (``s0``), and node values are
expressions over the symbols. Per symbol:

* a symbol that appears in no tensor's shape or stride (a diffusion timestep, a position) is a
  runtime input: every op argument that depends on it is a ``RuntimeInt`` in the node's
  plan, fed to the graph's one program at each call (``i`` scalars);
* a symbol that sets a shape (``torch.arange(n)``), or one an op's lowering cannot take
  as a traced value (``Specialize``), is a constant of the plan: the graph gets one plan
  (one program) per value, keyed by it, with every shape made concrete. Dynamo does not
  recompile for it.
"""
from __future__ import annotations

import torch

from .._ops.args import RuntimeInt, walk


class Specialize(Exception):
    """A node cannot take these symbols as runtime values: make them constants."""

    def __init__(self, symbols):
        super().__init__(f"symbols {sorted(map(str, symbols))} set static arguments")
        self.symbols = frozenset(symbols)


def _sym_expr(v):
    return v.node.expr if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool) else None


def free_symbols(v, offsets: bool = True) -> set:
    """The symbols ``v`` (a node value: tensor, SymInt, list of them) depends on (a
    tensor's storage offset left out unless ``offsets``)."""
    out: set = set()
    if isinstance(v, torch.Tensor):
        for s in (*v.shape, *v.stride(), *((v.storage_offset(),) if offsets else ())):
            e = _sym_expr(s)
            if e is not None:
                out |= e.free_symbols
    elif isinstance(v, (list, tuple)):
        for x in v:
            out |= free_symbols(x)
    else:
        e = _sym_expr(v)
        if e is not None:
            out |= e.free_symbols
    return out


class GraphSymbols:
    """The symbols of one graph: which placeholders hold them, which set shapes."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.by_input: dict = {}  # placeholder index -> its symbol
        self.shape: set = set()  # symbols that appear in a tensor's shape/stride/offset
        for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
            e = _sym_expr(n.meta.get("val"))
            if isinstance(n.meta.get("val"), torch.SymInt) and e is not None and e.is_symbol:
                self.by_input[i] = e
        for n in gm.graph.nodes:
            v = n.meta.get("val")
            flat = v if isinstance(v, (list, tuple)) else [v]
            for x in flat:
                if isinstance(x, torch.Tensor):
                    # NOTE: a storage offset is no shape: ``x[i]``'s moves with ``i``, a
                    # position the view's lowering takes as a runtime value
                    # (``lowering.views.select``); the graph's values are contiguous.
                    self.shape |= free_symbols(x, offsets=False)
        self.static = set(self.shape)
        self.runtime_inputs = self._runtime_inputs()

    def _runtime_inputs(self) -> tuple:
        return tuple(i for i, s in self.by_input.items() if s not in self.static)

    def make_static(self, symbols) -> None:
        self.static |= set(symbols)
        self.runtime_inputs = self._runtime_inputs()

    def values(self, args) -> dict:
        """symbol -> its value in this call."""
        return {s: args[i] for i, s in self.by_input.items()}


def concretize(v, subs: dict):
    """``v`` with every symbolic int made concrete by ``subs`` (symbol -> int)."""
    if isinstance(v, torch.SymInt):
        return int(v.node.expr.xreplace(subs))
    if isinstance(v, torch.SymFloat):
        return float(v.node.expr.xreplace(subs))
    if isinstance(v, torch.SymBool):
        return bool(v.node.expr.xreplace(subs))
    if isinstance(v, (list, tuple)):
        return type(v)(concretize(x, subs) for x in v)
    return v


class Slot:
    """A node plan's runtime int, in the graph's step list: where its value comes from."""

    __slots__ = ("ref",)

    def __init__(self, ref):
        self.ref = ref


def walk_node_arg(entry, a, vals: list, scal: list, dyn: bool):
    """``walk`` for a graph node's argument, with ``RuntimeInt``s as runtime scalars (eager
    ops never have them, so the hot ``walk`` does not look for them)."""
    if type(a) is RuntimeInt:
        scal.append(a)
        return int
    if type(a) is list or type(a) is tuple:
        return tuple([walk_node_arg(entry, x, vals, scal, dyn) for x in a])
    return walk(entry, a, vals, scal, dyn)

"""The nodes of an AOT graph, as ``graph`` reads them: which a program can hold, their
values' specs, and a node plan's outputs in the shape of the op's returns."""
from __future__ import annotations

import operator

import torch
from torch._ops import OpOverload

from .._ops.args import spec_of_meta
from . import flex as _flex
from .checks import is_check

_SYM = (torch.SymInt, torch.SymFloat, torch.SymBool)


def meta_val(node):
    return node.meta.get("val")


def is_tpu_meta(v) -> bool:
    return isinstance(v, torch.Tensor) and v.device.type == "tpu"


def is_scalar_node(node) -> bool:
    """A Python-level node on scalars (``operator.add`` of two ``SymInt``s, ``sym_float``):
    no tensor argument, a scalar value."""
    if not isinstance(meta_val(node), (*_SYM, int, float, bool)):
        return False
    ins = [a for a in torch.utils._pytree.tree_leaves((node.args, node.kwargs))
           if isinstance(a, torch.fx.Node)]
    return not any(isinstance(meta_val(a), torch.Tensor) for a in ins)


class Unsupported(Exception):
    """The graph cannot run as one lazyrt program; it runs eagerly."""


def check_graph(gm) -> str | None:
    """Why ``gm`` must run eagerly, or None."""
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if node.op != "call_function":
            return f"{node.op} node {node.name}"
        t = node.target
        if t is operator.getitem:
            continue
        if is_check(node) or t in _flex.HOPS:
            continue
        if not isinstance(t, OpOverload):
            if is_scalar_node(node):  # arithmetic on symbolic ints: on the host
                continue
            return f"{t} ({node.name}) is not an ATen op"
        vals = meta_val(node)
        flat = vals if isinstance(vals, (list, tuple)) else [vals]
        if any(isinstance(v, torch.Tensor) and v.device.type not in ("tpu", "cpu")
               for v in flat):
            return f"{node.name} makes a tensor on another device"
    return None


def out_spec(v) -> tuple:
    shape, stride, dtype, _ = spec_of_meta(v)
    return (shape, stride, dtype, 0)


def structure(plan, flat):
    """A node plan's flat outputs in the shape of the op's returns."""
    layout = plan.layout
    if layout is None:  # a step that returns its structure itself (``flex``)
        return flat
    if layout.single is not None:
        return flat[0]
    res, i = [], 0
    for s, k in zip(layout.fresh, layout.kinds):
        if k == "TL":
            res.append(list(flat[i:i + len(s)]))
            i += len(s)
        elif k == "T":
            if s is None:
                res.append(None)
            else:
                res.append(flat[i])
                i += 1
        else:
            res.append(s)
    return res[0] if layout.n_returns == 1 else tuple(res)

"""An ATen op as a JAX function: its lowering, or its PyTorch decomposition run on lowerings.

``jax_fn(op)`` gives a pure JAX function with the op's lowering calling convention
(``_registry``): the op's own lowering when the table has one; otherwise PyTorch's
decomposition of the op (CompositeImplicitAutograd or ``torch._decomp``), traced with
``make_fx`` on fake tensors of the arguments' shapes and dtypes down to ops that have
lowerings, and run node by node through those lowerings (each node's output cast to
the dtype PyTorch's meta kernel gives it, as the dispatcher does). The trace is cached
per (op, argument shapes/dtypes, static arguments).

A traced decomposition bakes its Python scalars in: floats are compile-time constants
for it, so a lowering built on one registers with ``static_floats=True``
(``needs_static_floats``).
"""
from __future__ import annotations

import operator
import threading

import jax
import jax.numpy as jnp
import torch
from torch._ops import OpOverload

from .._base import dtypes as _dtypes
from ._registry import LOWERINGS

__all__ = ["jax_fn", "needs_static_floats", "trace_decomposition"]

_CACHE: dict = {}
_CACHE_MAX = 512
_LOCK = threading.Lock()


def needs_static_floats(op: OpOverload) -> bool:
    low = LOWERINGS.get(op)
    return low is None or low.static_floats


def jax_fn(op: OpOverload):
    """The JAX function computing ``op`` (see the module docstring)."""
    low = LOWERINGS.get(op)
    if low is not None:
        if low.random or low.mutates is not None:
            raise NotImplementedError(f"lazyrt: {op} is random or mutates: no pure JAX function")
        return low.fn

    def traced(*args, **kwargs):
        return run_decomposition(op, args, kwargs)

    name = op.name().split("::")[-1] + ("" if op._overloadname == "default" else
                                        "_" + op._overloadname)
    traced.__name__ = traced.__qualname__ = f"{name}_decomposed"
    traced.__doc__ = f"{op} through PyTorch's decomposition, run on lazyrt's lowerings."
    return traced


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, jax.core.Tracer)) or (
        hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, torch.Tensor))


def _decomp_table():
    from torch._decomp import decomposition_table

    # Ops with a lowering stay in the graph; everything else is decomposed further.
    return {k: v for k, v in decomposition_table.items() if k not in LOWERINGS}


def trace_decomposition(op: OpOverload, args, kwargs):
    """``make_fx`` graph of ``op`` for these arguments (arrays stand for tensors)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    leaves, tree = jax.tree_util.tree_flatten((list(args), dict(kwargs)),
                                              is_leaf=lambda x: x is None)
    arr_pos = [i for i, x in enumerate(leaves) if _is_array(x)]
    statics = [None if i in arr_pos else x for i, x in enumerate(leaves)]
    key = (op, tree, tuple((tuple(leaves[i].shape), str(jnp.dtype(leaves[i].dtype))) for i in arr_pos),
           repr(statics))
    hit = _CACHE.get(key)
    if hit is not None:
        return hit

    def call(*tensors):
        lv = list(statics)
        for i, t in zip(arr_pos, tensors):
            lv[i] = t
        a, kw = jax.tree_util.tree_unflatten(tree, lv)
        return op(*a, **kw)

    with _LOCK, FakeTensorMode():
        fakes = [torch.empty(tuple(leaves[i].shape), dtype=_dtypes.to_torch(jnp.dtype(leaves[i].dtype)))
                 for i in arr_pos]
        gm = make_fx(call, decomposition_table=_decomp_table(), tracing_mode="real")(*fakes)
    entry = (gm, arr_pos)
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = entry
    return entry


def _node_fn(target):
    low = LOWERINGS.get(target)
    if low is None:
        raise NotImplementedError(
            f"lazyrt: the decomposition uses {target}, which has no lowering")
    if low.random or low.mutates is not None or low.data_dependent:
        raise NotImplementedError(
            f"lazyrt: the decomposition uses {target}, which is random, mutates or is "
            f"data-dependent: it cannot run inside one JAX function")
    return low.fn


def _cast_like(r, val):
    """Cast a lowering's result to the dtype/shape PyTorch's meta kernel gave the node."""
    if isinstance(val, torch.Tensor):
        r = jnp.asarray(r)
        dt = _dtypes.to_jax(val.dtype)
        if r.dtype != dt:
            r = r.astype(dt)
        shape = tuple(val.shape)
        if r.shape != shape:
            r = jnp.broadcast_to(r, shape)
        return r
    if isinstance(val, (list, tuple)) and isinstance(r, (list, tuple)):
        return type(r)(_cast_like(x, v) for x, v in zip(r, val))
    return r


def run_graph(gm, arrays, node_fn=_node_fn):
    """``gm`` (ATen ops) on JAX values; ``node_fn(op)`` gives each node's JAX function
    (default: its lowering, for a decomposition traced down to lowered ops)."""
    env: dict = {}
    it = iter(arrays)

    def load(a):
        return torch.fx.node.map_arg(a, lambda n: env[n])

    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(it)
        elif node.op == "get_attr":
            c = getattr(gm, node.target)
            env[node] = jnp.asarray(c.detach().cpu().numpy()) if isinstance(c, torch.Tensor) else c
        elif node.op == "call_function":
            a, kw = load(node.args), load(node.kwargs)
            if node.target is operator.getitem:
                env[node] = a[0][a[1]]
                continue
            if not isinstance(node.target, OpOverload):
                raise NotImplementedError(f"lazyrt: decomposition calls {node.target}")
            r = node_fn(node.target)(*a, **kw)
            env[node] = _cast_like(r, node.meta.get("val"))
        elif node.op == "output":
            return load(node.args[0])
        else:
            raise NotImplementedError(f"lazyrt: decomposition graph node {node.op}")
    raise RuntimeError("lazyrt: decomposition graph has no output")


def run_decomposition(op: OpOverload, args, kwargs):
    gm, arr_pos = trace_decomposition(op, args, kwargs)
    leaves = jax.tree_util.tree_flatten((list(args), dict(kwargs)), is_leaf=lambda x: x is None)[0]
    out = run_graph(gm, [leaves[i] for i in arr_pos])
    return tuple(out) if isinstance(out, list) else out

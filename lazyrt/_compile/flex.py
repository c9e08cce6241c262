"""FlexAttention's higher-order ops in a compiled graph, as steps of its one program.

``torch.compile(flex_attention)`` (and a model calling it) hands lazyrt's backend AOT
graphs holding ``flex_attention`` (forward) and ``flex_attention_backward`` nodes, whose
score and mask mods are ATen subgraphs (``get_attr`` GraphModules) and whose captured
tensors (``score_mod_other_buffers``, ``mask_mod_other_buffers``: a document-id tensor,
a bias table) are graph values. ``step`` turns such a node into a step of the graph's
program: PyTorch's dense math in JAX with the mods traced in (``lowering.flex``). Block
masks only reach it through their mask mod, so a block mask built on tpu, eagerly or
compiled, works as one built anywhere else.
"""
from __future__ import annotations

import importlib

import jax
import torch

from .._base import dtypes as _dtypes
from ..lowering import flex as _math

_hop = importlib.import_module("torch._higher_order_ops.flex_attention")
FORWARD = _hop.flex_attention
BACKWARD = _hop.flex_attention_backward
HOPS = (FORWARD, BACKWARD)
_X64 = jax.enable_x64


class _Prog:
    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn


class FlexPlan:
    """A graph step's plan: ``prog.fn(*arrays)`` returns the HOP's outputs in the HOP's
    structure (``layout`` None: ``graph._structure`` keeps them as they are)."""

    layout = None

    def __init__(self, fn):
        self.prog = _Prog(fn)


def _aval(v):
    return jax.ShapeDtypeStruct(tuple(v.shape), _dtypes.to_jax(v.dtype))


def step(node, env, plan):
    """``(plan, input refs, floats, random)`` for a flex HOP node of ``plan`` (a
    ``graph._GraphPlan``; ``env``: node -> ``refs.Ref``, a subgraph's a ``Kind.PY`` one).
    Raises (the graph then runs eagerly) if a mod cannot be traced."""

    def gm_of(a):
        return env[a].at

    def ref_of(a):
        return plan.device_ref(a, env)

    if node.target is FORWARD:
        q, k, v, score_gm, block_mask, scale, _opts, score_bufs, mask_bufs = node.args
        dense = [q, k, v]
    else:
        (q, k, v, out, lse, g_out, g_lse, score_gm, _joint, block_mask, scale, _opts,
         score_bufs, mask_bufs) = node.args
        dense = [q, k, v, out, lse, g_out, g_lse]
    score = gm_of(score_gm)
    mask = gm_of(block_mask[-1])
    score_fn, mask_fn = _math.subgraph_fn(score), _math.subgraph_fn(mask)
    idx = [_dtypes.to_jax(d) if d is not None else None for d in _math.index_dtypes(mask)[:4]]
    # tensors enter the program; anything else (an int buffer) is a constant of the step
    args = [*dense, *score_bufs, *mask_bufs]
    is_t = [isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor)
            for a in args]
    refs = tuple(ref_of(a) for a, t in zip(args, is_t) if t)
    avals = [_aval(a.meta["val"]) for a, t in zip(args, is_t) if t]
    n_dense, n_score = len(dense), len(score_bufs)

    def unpack(arrays):
        it = iter(arrays)
        vals = [next(it) if t else a for a, t in zip(args, is_t)]
        return vals[:n_dense], vals[n_dense:n_dense + n_score], vals[n_dense + n_score:]

    if node.target is FORWARD:
        def fn(*arrays):
            (qa, ka, va), sb, mb = unpack(arrays)
            return _math.forward(qa, ka, va, score_fn, mask_fn, scale, sb, mb, idx)
    else:
        grads = node.meta["val"][3]
        want = [isinstance(g, torch.Tensor) for g in grads]

        def fn(*arrays):
            (qa, ka, va, oa, la, go, gl), sb, mb = unpack(arrays)
            dq, dk, dv, dbufs = _math.backward(qa, ka, va, oa, la, go, gl, score_fn, mask_fn,
                                               scale, sb, mb, idx, want)
            return dq, dk, dv, tuple(dbufs)

    with _X64(True):  # as the program is traced: fails here, not at its first call
        jax.eval_shape(fn, *avals)
    return FlexPlan(fn), refs, (), False

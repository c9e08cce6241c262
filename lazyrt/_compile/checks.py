"""The checks of an AOT graph: nodes whose input is read after the graph's program ran.

* ``with_effects(token, aten._linalg_check_errors, info, ...)``, PyTorch's linalg error
  check (an effect in AOT graphs): ``info`` is a program output, read on the host right
  after the program (a sync, as in eager), raising PyTorch's LinAlgError.
* ``aten._assert_async`` (``torch._assert_async``): the condition is a program output,
  handed to the eager op after the program, which checks it at the next sync point
  (``_exec.asserts``), as in eager.
* index bounds (``_ops.bounds``): ``insert_bounds_checks`` gives each indexing node of a
  graph (``index_select``, ``x[idx]``, ``embedding``, ...) an ``index_bounds`` node (the
  first out-of-range value of its index, computed in the graph's program) and an
  ``index_assert`` check of it, which after the program reads it as an asynchronous assert
  with PyTorch's error, as eager does.
* integer division by zero (``_ops.int_checks``): ``insert_division_checks`` gives each
  integer ``floor_divide``/``remainder``/``fmod``/``div(rounding_mode=)`` node whose
  divisor is a tpu tensor a ``nonzero_divisor`` node (computed in the graph's program)
  and an ``_assert_async`` of it: ``RuntimeError: ZeroDivisionError`` by the next sync,
  as eager.
"""
from __future__ import annotations

import jax.numpy as jnp
import torch

from .._base import source as _source
from .._base.config import config
from .._exec import asserts as _asserts
from .._exec.values import concrete
from .._ops import bounds as _bounds
from .._ops.int_checks import ZERO_DIV as _ZERO_DIV
from .._ops.jax_op import jax_op
from .._ops.resolve import resolve

_ASSERTS = (torch.ops.aten._assert_async.msg, torch.ops.aten._assert_async.default)


def _index_bounds(index, n: int = 0, neg: bool = False, ignore: int | None = None):
    return _bounds._bad_row(index, n, neg, ignore)


index_bounds = jax_op("lazyrt::index_bounds", _index_bounds, static=("n", "neg", "ignore"))
_INDEX_BOUNDS = torch.ops.lazyrt.index_bounds.default


def _nonzero_divisor(divisor, dtype: str = "int64"):
    return jnp.all(divisor.astype(dtype) != 0)


# one bool: no element of the divisor is 0 in the division's (integer) dtype (256 is 0 in uint8)
nonzero_divisor = jax_op("lazyrt::nonzero_divisor", _nonzero_divisor, static=("dtype",))
_NONZERO_DIVISOR = torch.ops.lazyrt.nonzero_divisor.default
_aten = torch.ops.aten
# divisions whose second argument (the divisor) may be a tensor
_DIVISIONS = frozenset((_aten.floor_divide.default, _aten.remainder.Tensor,
                        _aten.remainder.Scalar_Tensor, _aten.fmod.Tensor, _aten.div.Tensor_mode))
_EXC = {"IndexError": IndexError, "RuntimeError": RuntimeError}


def index_assert(info, exc: str, fmt: str, dim: int, n: int, op: str) -> None:
    """The graph node of a bounds check: nothing when the graph runs eagerly (each indexing
    op checks its index there); the program's check is ``_index_assert``."""


def _index_assert(info, exc: str, fmt: str, dim: int, n: int, op: str) -> None:
    """The check of an ``index_bounds`` row ``info`` (``[bad, value]``) after the graph's
    program: at the next sync point (debug mode, ``LAZYRT_INDEX_CHECKS=sync``: at once)."""
    c = _bounds.Check(None, n, False, _EXC[exc], fmt, dim)
    judge = _bounds._judge([c])
    where = f"{op} (compiled) at {_source.user_line(2)}"
    if config.mode == "debug" or config.index_checks == "sync":
        _asserts.check_now(concrete(info), judge, where)
    else:
        _asserts.add(info._st, judge, where)


def insert_bounds_checks(gm) -> None:
    """Give every indexing node of ``gm`` whose index is a tpu tensor its bounds check."""
    if config.index_checks == "off":
        return
    g = gm.graph
    changed = False
    for node in list(g.nodes):
        if node.op != "call_function":
            continue
        rule = _bounds.rule_for(node.target)
        if rule is None:
            continue
        by_id: dict = {}

        def val(a, by_id=by_id):
            if isinstance(a, torch.fx.Node):
                v = a.meta.get("val")
                by_id[id(v)] = a
                return v
            if isinstance(a, (list, tuple)):
                return type(a)(val(x) for x in a)
            return a

        try:
            checks = rule(val(node.args), {k: val(v) for k, v in node.kwargs.items()})
        except Exception:  # eager raises PyTorch's error for this node
            continue
        after = node
        for c in checks:
            idx = by_id.get(id(c.index))
            if idx is None or c.index.device.type != "tpu" or not c.index.numel():
                continue
            with g.inserting_after(after):
                info = g.call_function(_INDEX_BOUNDS, (idx, c.n, c.neg, c.ignore))
            info.meta["val"] = c.index.new_empty((2,), dtype=torch.int64)
            with g.inserting_after(info):
                after = g.call_function(index_assert, (info, c.exc.__name__, c.fmt, c.dim, c.n,
                                                       str(node.target)))
            after.meta["val"] = None
            changed = True
    if changed:
        gm.recompile()


def insert_division_checks(gm) -> None:
    """Give every integer division node of ``gm`` whose divisor is a tpu tensor its check."""
    g = gm.graph
    changed = False
    for node in list(g.nodes):
        if (node.op != "call_function" or node.target not in _DIVISIONS or len(node.args) < 2
                or not isinstance(node.args[1], torch.fx.Node)):
            continue
        if node.target is _aten.div.Tensor_mode and node.kwargs.get("rounding_mode") is None:
            continue
        divisor = node.args[1]
        dv = divisor.meta.get("val")
        a = node.args[0]
        av = a.meta.get("val") if isinstance(a, torch.fx.Node) else a
        if not isinstance(dv, torch.Tensor) or dv.device.type != "tpu" or not dv.numel():
            continue
        if isinstance(av, torch.Tensor) and not av.numel():
            continue
        common = torch.result_type(av, dv)
        if common.is_floating_point or common.is_complex or common == torch.bool:
            continue
        with g.inserting_after(node):
            ok = g.call_function(_NONZERO_DIVISOR, (divisor, str(common).split(".")[-1]))
        ok.meta["val"] = dv.new_empty((), dtype=torch.bool)
        with g.inserting_after(ok):
            check = g.call_function(_ASSERTS[0], (ok, _ZERO_DIV))
        check.meta["val"] = None
        changed = True
    if changed:
        gm.recompile()


def is_check(node) -> bool:
    """A linalg check, an assert or an index bounds check."""
    return node.target in _ASSERTS or node.target is index_assert or (
        node.target is torch.ops.higher_order.with_effects
        and node.args[1] is torch.ops.aten._linalg_check_errors.default)


def entry(node, env) -> tuple:
    """``(call, info ref, info node, args, kwargs)`` of check node ``node``:
    ``call(info tensor, *args, **kwargs)`` after the program."""
    if node.target in _ASSERTS or node.target is index_assert:
        info, *rest = node.args
        call = _index_assert if node.target is index_assert else node.target
        return call, env[info], info, rest, dict(node.kwargs)
    _, op, info, *rest = node.args  # NOTE: its effect token is None at run time
    fn = resolve(op).fn

    def call(t, *args, **kwargs):
        return fn(concrete(t), *args, **kwargs)

    return call, env[info], info, rest, dict(node.kwargs)


def result(node):
    """What check node ``node`` returns to the graph: ``with_effects``' (token, output) as
    Nones, an assert's None."""
    return None if node.target in _ASSERTS or node.target is index_assert else (None, None)

"""The checks of an AOT graph: nodes whose input is read after the graph's program ran.

* ``with_effects(token, aten._linalg_check_errors, info, ...)``, PyTorch's linalg error
  check (an effect in AOT graphs): ``info`` is a program output, read on the host right
  after the program (a sync, as in eager), raising PyTorch's LinAlgError.
* ``aten._assert_async`` (``torch._assert_async``): the condition is a program output,
  handed to the eager op after the program, which checks it at the next sync point
  (``_exec.asserts``), as in eager.
"""
from __future__ import annotations

import torch

from .._exec.values import concrete
from .._ops.resolve import resolve

_ASSERTS = (torch.ops.aten._assert_async.msg, torch.ops.aten._assert_async.default)


def is_check(node) -> bool:
    """A linalg check or an assert."""
    return node.target in _ASSERTS or (
        node.target is torch.ops.higher_order.with_effects
        and node.args[1] is torch.ops.aten._linalg_check_errors.default)


def entry(node, env) -> tuple:
    """``(call, info ref, info node, args, kwargs)`` of check node ``node``:
    ``call(info tensor, *args, **kwargs)`` after the program."""
    if node.target in _ASSERTS:
        info, *rest = node.args
        return node.target, env[info], info, rest, dict(node.kwargs)
    _, op, info, *rest = node.args  # NOTE: its effect token is None at run time
    fn = resolve(op).fn

    def call(t, *args, **kwargs):
        return fn(concrete(t), *args, **kwargs)

    return call, env[info], info, rest, dict(node.kwargs)


def result(node):
    """What check node ``node`` returns to the graph: ``with_effects``' (token, output) as
    Nones, an assert's None."""
    return None if node.target in _ASSERTS else (None, None)

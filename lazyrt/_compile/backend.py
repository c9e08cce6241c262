"""The ``"tpu"`` Dynamo backend (see the package docstring). Importing this module sets
Dynamo up for tpu tensors.
"""
from __future__ import annotations

import functools

import torch

from .._base.metrics import COUNTERS
from . import dynamo
from .graph import GraphProgram

__all__ = ["tpu_backend"]

dynamo.setup()


def tpu_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The ``"tpu"`` Dynamo backend. Symbolic ints in the graph (Python scalars Dynamo made
    dynamic) are runtime inputs or per-value constants of its program (``symbolic``)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    COUNTERS["compiled_modules"] += 1
    return aot_autograd(
        fw_compiler=_forward, bw_compiler=_backward, inference_compiler=_inference,
        decompositions=_decompositions(), partition_fn=min_cut_rematerialization_partition,
        keep_inference_input_mutations=True,
    )(gm, example_inputs)


def _boxed(gp: GraphProgram):
    """AOTAutograd's boxed calling convention: one list of arguments."""

    def run(args):
        return gp(*args)

    run._boxed_call = True
    run.graph_program = gp
    return run


def _forward(gm, example_inputs):
    return _boxed(GraphProgram(gm, "forward"))


def _backward(gm, example_inputs):
    return _boxed(GraphProgram(gm, "backward"))


def _inference(gm, example_inputs):
    return _boxed(GraphProgram(gm, "inference"))


@functools.cache
def _decompositions() -> dict:
    """``torch._decomp`` entries for the ops lazyrt itself runs through them (eager's
    lookup: ``_resolve``); every other op reaches the graph as itself."""
    from torch._decomp import decomposition_table

    from .._ops.resolve import lookup

    out = {}
    for op, fn in decomposition_table.items():
        try:
            if lookup(op).how == "decomposed":
                out[op] = fn
        except Exception:
            continue
    return out

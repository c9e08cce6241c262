"""A stand-in for torchtitan 0.3.0's triton kernel module (tests and docs/torchtitan.md).

torchtitan imports ``torchtitan.distributed.minimal_async_ep.kernels`` (triton kernels for
expert parallelism) when ``torchtitan.train`` is imported; a CPU-only torch has no triton.
Stubbing triton itself breaks Dynamo (it reads ``triton.language.dtype``), so the kernel
module is put in ``sys.modules`` instead, with functions that raise if anything calls them.
The llama3 recipe never does. Put this directory on PYTHONPATH to use it.
"""
import sys
import types

_NAME = "torchtitan.distributed.minimal_async_ep.kernels"


def _unavailable(*args, **kwargs):
    raise RuntimeError("triton kernels are not available on this machine")


if _NAME not in sys.modules:
    _m = types.ModuleType(_NAME)
    for _n in ("copy_full_counts_to_peers_kernel", "copy_rows_to_peers_kernel",
               "expand_topk_grad_kernel", "fill_combine_metadata_kernel",
               "fill_dispatch_metadata_kernel", "invert_flat_indices_kernel",
               "reduce_topk_slots_kernel", "topk_scores_grad_kernel"):
        setattr(_m, _n, _unavailable)
    sys.modules[_NAME] = _m

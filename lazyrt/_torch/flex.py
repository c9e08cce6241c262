"""FlexAttention's higher-order ops on tpu tensors, eagerly.

``flex_attention`` and ``flex_attention_backward`` are higher-order operators: PyTorch
runs them through a table of rules per dispatch key and per tensor subclass, and has none
for ``TpuTensor`` ("There was no rule registered for HOP flex_attention and subclass
TpuTensor"). Eagerly they run PyTorch's own dense reference, the math CPU eager runs
(``sdpa_dense`` and ``sdpa_dense_backward``: the score and mask mods vmapped over
batch, head, query and key indices, a full softmax), op by op on tpu tensors: in defer
mode one program with the code around it. Every position is computed; the block mask's
sparsity saves nothing. Under ``torch.compile`` the graph's HOP nodes are lowered instead
(``lazyrt._compile.flex``).
"""
from __future__ import annotations

import importlib

from .._base.tensor import TpuTensor

_registered: list = []


def register() -> None:
    """Give both HOPs their ``TpuTensor`` rule (once)."""
    if _registered:
        return
    hop = importlib.import_module("torch._higher_order_ops.flex_attention")
    hop.flex_attention.py_impl(TpuTensor)(hop.sdpa_dense)
    hop.flex_attention_backward.py_impl(TpuTensor)(hop.sdpa_dense_backward)
    _registered.append(True)

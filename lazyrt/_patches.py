"""Every change lazyrt makes to PyTorch's own Python objects, in one place.

Checked against torch 2.13.0 (the pinned release). Each patch says what it changes,
why lazyrt needs it, and what to look at when torch moves. ``tests/test_patches.py``
fails loudly if a patched attribute disappears. (Kernels registered through the public
``torch.library`` API are not patches: see ``_registration``.)
"""
from __future__ import annotations

import functools

import torch

from . import _backward_hold, _control
from ._tensor import TpuTensor

_installed = []


def _backward_error_hold() -> None:
    """``torch.autograd.graph._engine_run_backward`` (and its re-export in
    ``torch.autograd``): torch 2.13 aborts the process when a Python exception leaves a
    PrivateUse1 kernel called from a C++ autograd node, so lazyrt holds such errors and
    raises them when the engine returns (``_backward_hold``)."""
    import torch.autograd
    import torch.autograd.graph

    wrapped = _backward_hold.run_backward(torch.autograd.graph._engine_run_backward)
    torch.autograd.graph._engine_run_backward = wrapped
    torch.autograd._engine_run_backward = wrapped


def _fast_dispatch_rule_lookup() -> None:
    """``torch._library.simple_registry.find_torch_dispatch_rule``: PyTorch asks it for a
    torch_dispatch rule on every op of a tensor subclass (~3 us per op); lazyrt registers
    none for TpuTensor, so answer None at once for it."""
    import torch._library.simple_registry as sr

    orig = sr.find_torch_dispatch_rule

    def find_torch_dispatch_rule(op, torch_dispatch_class):
        if torch_dispatch_class is TpuTensor:
            return None
        return orig(op, torch_dispatch_class)

    sr.find_torch_dispatch_rule = find_torch_dispatch_rule


def _matmul_precision() -> None:
    """``torch.set_float32_matmul_precision``: lowerings read the precision when they are
    traced and compiled plans bake it in, so a change flushes pending work first (it was
    recorded under the old precision) and drops the compiled plans (``_control``)."""
    orig = torch.set_float32_matmul_precision

    def set_float32_matmul_precision(precision: str) -> None:
        _control.set_matmul_precision(orig, precision)

    set_float32_matmul_precision.__doc__ = orig.__doc__
    torch.set_float32_matmul_precision = set_float32_matmul_precision


def _keep_tied_parameters() -> None:
    """``torch.nn.Module._apply``: ``model.to("tpu")`` keeps tied parameters tied (GPT-2's
    lm_head/embedding). For CUDA, ``Module._apply`` swaps ``param.data`` in place, so a
    parameter shared by two modules stays one object; for a wrapper subclass PyTorch makes
    a new Parameter per module instead, silently untying them. Re-tie afterwards."""
    orig = torch.nn.Module._apply
    depth = [0]

    def _apply(self, fn, recurse=True):
        if depth[0]:
            return orig(self, fn, recurse)
        owners: dict = {}
        for mod in self.modules():
            for name, p in mod._parameters.items():
                if p is not None:
                    owners.setdefault(id(p), []).append((mod, name))
        depth[0] += 1
        try:
            out = orig(self, fn, recurse)
        finally:
            depth[0] -= 1
        for group in owners.values():
            if len(group) > 1:
                first_mod, first_name = group[0]
                keep = first_mod._parameters[first_name]
                for mod, name in group[1:]:
                    mod._parameters[name] = keep
        return out

    torch.nn.Module._apply = _apply


def _foreach_for_tpu_parameters() -> None:
    """``torch.optim.optimizer._foreach_supported_types``: torch.optim picks its foreach
    and fused paths only for tensors whose type is exactly Tensor or Parameter; a tpu
    parameter is a TpuTensor (flagged ``_is_param``)."""
    import torch.optim.optimizer as optim_mod

    if TpuTensor not in optim_mod._foreach_supported_types:
        optim_mod._foreach_supported_types.append(TpuTensor)


def _compile_picks_tpu() -> None:
    """``torch.compile``: TorchTPU's rule, tpu inputs pick the ``"tpu"`` backend and static
    shapes; ``backend="inductor"`` with tpu inputs is a clear error (``_compile.api``).
    Only the wrapper is installed here: nothing of Dynamo is imported until a compile."""
    from ._compile import api

    orig = torch.compile

    @functools.wraps(orig)
    def compile(model=None, **kwargs):
        return api.compile(orig, model, **kwargs)

    torch.compile = compile


PATCHES = (_backward_error_hold, _fast_dispatch_rule_lookup, _matmul_precision,
           _keep_tied_parameters, _foreach_for_tpu_parameters, _compile_picks_tpu)


def install_dynamo() -> None:
    """At the first compile: Dynamo treats a ``TpuTensor`` as a tensor (it wraps only plain
    tensors and traceable wrapper subclasses by default, so every tpu op graph-broke with
    "Dynamo does not know how to trace builtin operator `matmul` with argument types
    ['TpuTensor', ...]"). ``VariableBuilder._type_dispatch()`` is Dynamo's cached map from
    exact type to wrapper (torch/_dynamo/variables/builder.py, torch 2.13)."""
    import torch._dynamo
    import torch._dynamo.variables.builder as builder
    from torch._dynamo.variables.builder import VariableBuilder

    VariableBuilder._type_dispatch()[TpuTensor] = VariableBuilder.wrap_tensor
    # ... and as a plain tensor, not a __torch_function__ subclass: otherwise Dynamo re-wraps
    # graph outputs with `to_subclass`, through a global its resume functions (after a
    # graph break) do not have: "NameError: name '__subclass_Tensor_..._c23' is not
    # defined". (``builder.infer_subclass_type``, torch 2.13.)
    infer = builder.infer_subclass_type

    def infer_subclass_type(value):
        return None if type(value) is TpuTensor else infer(value)

    builder.infer_subclass_type = infer_subclass_type
    # LSTM/GRU are traced into the graph rather than graph-broken, as TorchTPU does
    # (process-wide Dynamo config, set at the first tpu compile).
    torch._dynamo.config.allow_rnn = True


def install() -> None:
    if _installed:
        return
    for patch in PATCHES:
        patch()
    _installed.append(True)

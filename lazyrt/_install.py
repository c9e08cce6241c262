"""What lazyrt registers with PyTorch through its public APIs, done once by ``install``:
PrivateUse1 kernels for factory ops and ``_copy_from``, ``pin_memory`` for tpu on the CPU,
the SDPA routing kernel on AutogradPrivateUse1, autocast's policy, the optimizer-step sync
point, the ``torch.tpu`` module's API, tpu tensors' pickling (``_serialization``), the
monkeypatches of ``_patches`` and of client libraries (``_clients``, applied when each is
imported). Around an optimizer step that creates state, constant ops run at once in defer
mode (``_defer.set_eager_consts``).
"""
from __future__ import annotations

import torch

from ._base.config import config
from ._exec import defer as _defer
from ._ops.dispatch import dispatch
from ._ops.resolve import resolve
from ._ops.special import copy_
from ._torch import autocast as _autocast
from ._torch import clients as _clients
from ._torch import flex as _flex
from ._torch import patches as _patches
from ._torch import patchset as _patchset
from ._torch import serialization as _serialization
from ._torch import tpu_module as _tpu_module
from .lowering import pallas_router as _pallas

aten = torch.ops.aten

# Factory ops with no tensor input reach lazyrt through PrivateUse1 kernels.
FACTORIES = [
    "empty.memory_format", "empty_strided", "zeros", "ones", "full", "scalar_tensor",
    "arange", "arange.start", "arange.start_step", "linspace", "logspace", "eye", "eye.m",
    "rand", "randn", "randint", "randint.low", "randperm", "tril_indices", "triu_indices",
    "_efficientzerotensor", "empty.names", "zeros.names", "ones.names", "full.names",
    "rand.names", "randn.names", "rand.generator", "randn.generator", "randint.generator",
    "randint.low_generator", "randperm.generator",
]

_LIBS: list = []


def _factory_kernel(op):
    def kernel(*args, **kwargs):
        return dispatch(op, args, kwargs)

    kernel.__name__ = kernel.__qualname__ = f"tpu_{op._schema.name.split('::')[-1]}"
    return kernel


def _copy_from(self, dst, non_blocking=False):
    # torch.tensor(data, device="tpu") copies with the Python key excluded: the copy
    # reaches the backend's _copy_from.
    copy_(resolve(aten.copy_.default), (dst, self), {})
    return dst


_PIN_DEFAULT = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)


def _pin_memory_cpu(self, device=None):
    # ``pin_memory()`` (``DataLoader(pin_memory=True)``) pins for the current accelerator,
    # tpu, whose Python hooks cannot hand PyTorch a pinned allocator: pinned memory means
    # nothing to a transfer into JAX (``device_put`` copies from any host buffer), so a
    # tpu "pinned" tensor is a plain contiguous CPU copy, as pin_memory returns a copy.
    if device is None or torch.device(device).type == "tpu":
        return self.clone(memory_format=torch.contiguous_format)
    return aten._pin_memory.default.redispatch(_PIN_DEFAULT, self, device)


def _creates_state(optimizer) -> bool:
    """Whether this step will create optimizer state (a parameter with a gradient and no
    state yet): true of a training loop's first step."""
    state = optimizer.state
    groups = optimizer.param_groups
    if len(state) >= sum(len(g["params"]) for g in groups):
        return False
    return any(p.grad is not None and p not in state for g in groups for p in g["params"])


def _before_optimizer_step(optimizer, args, kwargs) -> None:
    # NOTE: the first step creates the optimizer state (``zeros_like(p)``). Made on the
    # spot rather than recorded, it enters the step's program as the same inputs the state
    # is on every later step: one program for steps 1, 2, 3, ... instead of two.
    if config.mode == "defer":
        _defer.set_eager_consts(_creates_state(optimizer))


def _after_optimizer_step(optimizer, args, kwargs) -> None:
    _defer.set_eager_consts(False)
    if config.mode == "defer" and _defer.pending_count():
        _defer.flush(reason="optimizer.step")


def install() -> None:
    if _LIBS:
        return
    lib = torch.library.Library("aten", "IMPL")
    for name in FACTORIES:
        packet, _, ov = name.partition(".")
        op = getattr(getattr(aten, packet), ov or "default", None)
        if op is None:
            continue
        try:
            lib.impl(name, _factory_kernel(op), "PrivateUse1")
        except RuntimeError:
            pass
    lib.impl("_copy_from", _copy_from, "PrivateUse1")
    # torch.tensor([t0, t1, ...]) of 0-d tpu tensors reads each with ``item()`` with the
    # Python key excluded: the read reaches the backend's _local_scalar_dense.
    lib.impl("_local_scalar_dense", _factory_kernel(aten._local_scalar_dense.default), "PrivateUse1")
    lib.impl("_pin_memory", _pin_memory_cpu, "CPU")
    lib.impl("scaled_dot_product_attention", _pallas.sdpa_autograd_kernel, "AutogradPrivateUse1")
    _LIBS.append(lib)
    import torch.optim.optimizer as optim_mod

    optim_mod.register_optimizer_step_pre_hook(_before_optimizer_step)
    optim_mod.register_optimizer_step_post_hook(_after_optimizer_step)
    _autocast.register()
    _tpu_module.populate()
    _patchset.check(_patches.NAMES + _clients.NAMES + (_serialization.PATCH,))
    _serialization.install()
    from ._compile import api as compile_api
    from ._ops import kernels as _kernels  # noqa: F401 - registers torch.ops.lazyrt.* (jax_op)

    _patches.install(compile_api.compile)
    _flex.register()
    _clients.install()
    # The c10d backends "tpu"/"tpu_dist" (~30 us; the backend itself, torch.distributed's
    # process groups and jax.distributed load at init_process_group).
    from .distributed import register_backends

    register_backends()

"""What lazyrt registers with PyTorch through its public APIs, done once by ``install``:
PrivateUse1 kernels for factory ops and ``_copy_from``, the SDPA routing kernel on
AutogradPrivateUse1, autocast's policy, the optimizer-step sync point, the ``torch.tpu``
module's API, and the monkeypatches of ``_patches``.
"""
from __future__ import annotations

import torch

from . import _autocast, _defer, _pallas, _patches, _tpu_module
from ._config import config
from ._dispatch import dispatch
from ._resolve import resolve
from ._special import copy_

aten = torch.ops.aten

# Factory ops with no tensor input reach lazyrt through PrivateUse1 kernels.
FACTORIES = [
    "empty.memory_format", "empty_strided", "zeros", "ones", "full", "scalar_tensor",
    "arange", "arange.start", "arange.start_step", "linspace", "logspace", "eye", "eye.m",
    "rand", "randn", "randint", "randint.low", "randperm", "tril_indices", "triu_indices",
    "_efficientzerotensor", "empty.names", "zeros.names", "ones.names", "full.names",
    "rand.names", "randn.names",
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


def _after_optimizer_step(optimizer, args, kwargs) -> None:
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
    lib.impl("scaled_dot_product_attention", _pallas.sdpa_autograd_kernel, "AutogradPrivateUse1")
    _LIBS.append(lib)
    import torch.optim.optimizer as optim_mod

    optim_mod.register_optimizer_step_post_hook(_after_optimizer_step)
    _autocast.register()
    _tpu_module.populate()
    _patches.install()

"""The ``tpu`` device itself: PrivateUse1 renamed and set up as a Python backend.

Importing this module registers the device (once), so any module that needs
``torch.device("tpu")`` imports it first and import order never matters. The
``torch.tpu`` module object is created here, empty; ``_tpu_module.populate`` fills in
its API (it needs the executors, which sit above this module).
"""
from __future__ import annotations

import sys
import types

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

NAME = "tpu"


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def _register() -> types.ModuleType:
    mod = sys.modules.get("torch.tpu")
    if mod is not None and torch._C._get_privateuse1_backend_name() == NAME:
        return mod
    mod = types.ModuleType("torch.tpu", "lazyrt's tpu device module (XLA via JAX).")
    _setup_privateuseone_for_python_backend(NAME, backend_module=mod, hook=_Hooks(),
                                            device_guard=_Guard())
    sys.modules["torch.tpu"] = mod
    return mod


TPU_MODULE = _register()
DEVICE = torch.device(NAME, 0)

"""The ``torch.tpu`` module: CUDA-style device API plus TorchTPU's eager-mode switches.

The module object is created (empty) with the device in ``_device``; ``populate`` fills
it in, once, when ``import lazyrt`` runs.
"""
from __future__ import annotations

import jax
import torch

from .._base import memory
from .._base import rng as _rng
from .._base.device import TPU_MODULE
from .._ops.control import EagerMode, eager_mode, set_eager_mode, sync
from .._ops.jax_op import pallas_module
from . import streams as _streams


class _DeviceProperties:
    def __init__(self):
        dev = jax.devices()[0]
        self.name = get_device_name()
        self.platform = dev.platform
        self.device_kind = getattr(dev, "device_kind", dev.platform)
        stats = memory.device_stats() or {}
        self.total_memory = int(stats.get("bytes_limit", 0))
        self.jax_version = jax.__version__

    def __repr__(self):
        return (f"_TpuDeviceProperties(name='{self.name}', platform='{self.platform}', "
                f"device_kind='{self.device_kind}', total_memory={self.total_memory // 2**20}MB)")


def get_device_name(device=None) -> str:
    dev = jax.devices()[0]
    return f"XLA {dev.platform} via JAX"


def set_device(device) -> None:
    idx = torch.device(device).index if not isinstance(device, int) else device
    if idx not in (None, 0):
        raise RuntimeError(f"lazyrt: invalid device ordinal {idx}; there is 1 tpu device")


def _getattr(name):
    if name == "eager_mode":
        return eager_mode()
    raise AttributeError(f"module 'torch.tpu' has no attribute '{name}'")


def populate() -> None:
    m = TPU_MODULE
    if getattr(m, "EagerMode", None) is EagerMode:
        return
    m.EagerMode = EagerMode
    m.set_eager_mode = set_eager_mode
    m.is_available = lambda: True
    m.is_initialized = lambda: True
    m._is_in_bad_fork = lambda: False
    m._lazy_init = lambda: None
    m.device_count = lambda: 1
    m.current_device = lambda: 0
    m.set_device = set_device
    m.synchronize = lambda device=None: sync()
    m.manual_seed = lambda seed: _rng.manual_seed(seed)
    m.manual_seed_all = lambda seed: _rng.manual_seed(seed)
    m.seed = lambda: _rng.manual_seed(torch.initial_seed())
    m.seed_all = m.seed
    m.initial_seed = _rng.initial_seed
    m.get_rng_state = lambda device="tpu": _rng.get_state()
    m.set_rng_state = lambda state, device="tpu": _rng.set_state(state)
    m.get_rng_state_all = lambda: [_rng.get_state()]
    m.set_rng_state_all = lambda states: _rng.set_state(states[0])
    m.get_device_name = get_device_name
    m.get_device_properties = lambda device=None: _DeviceProperties()
    m.get_amp_supported_dtype = lambda: [torch.bfloat16, torch.float16]
    m.is_bf16_supported = lambda: True
    m.memory_allocated = lambda device=None: memory.live_bytes()
    m.max_memory_allocated = lambda device=None: memory.max_memory_allocated()
    m.reset_peak_memory_stats = lambda device=None: memory.reset_peak_memory_stats()
    m.memory_stats = lambda device=None: memory.memory_stats()
    m.memory_summary = lambda device=None, abbreviated=False: memory.memory_summary()
    m.empty_cache = lambda: None
    for name in ("Stream", "Event", "current_stream", "default_stream", "set_stream", "stream"):
        setattr(m, name, getattr(_streams, name))
    m.pallas = pallas_module()
    m.__getattr__ = _getattr

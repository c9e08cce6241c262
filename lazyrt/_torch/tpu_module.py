"""The ``torch.tpu`` module: CUDA-style device API plus TorchTPU's eager-mode switches.

The module object is created (empty) with the device in ``_device``; ``populate`` fills
it in, once, when ``import lazyrt`` runs.
"""
from __future__ import annotations

import jax
import torch

from .._base import hostmem, memory
from .._base import rng as _rng
from .._base.config import config
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
        self.total_memory = mem_get_info()[1]
        self.jax_version = jax.__version__

    def __repr__(self):
        return (f"_TpuDeviceProperties(name='{self.name}', platform='{self.platform}', "
                f"device_kind='{self.device_kind}', total_memory={self.total_memory // 2**20}MB)")


def budget() -> int:
    """The device memory on the CPU platform, where XLA sets no limit: ``config.device_memory``
    (``LAZYRT_DEVICE_MEMORY``) in bytes, or that share of the host's memory (default half of
    it, cgroup limits applied): the host also holds CPU tensors, host copies and staging."""
    want = config.device_memory
    if isinstance(want, float):
        return int(want * hostmem.total())
    return int(want)


def mem_get_info(device=None) -> tuple[int, int]:
    """``(free, total)`` bytes, as ``torch.cuda.mem_get_info``. Where the runtime reports the
    device's limit (GPU/TPU) these are its numbers; on the CPU platform total is ``budget()``
    and free is what lazyrt's live arrays leave of it, at most what the host has available."""
    info = memory.device_memory_info()
    if info is not None:
        return info
    total = budget()
    return max(0, min(total - memory.live_bytes(), hostmem.available())), total


def get_device_name(device=None) -> str:
    dev = jax.devices()[0]
    return f"XLA {dev.platform} via JAX"


def set_device(device) -> None:
    idx = torch.device(device).index if not isinstance(device, int) else device
    if idx not in (None, 0):
        raise RuntimeError(f"lazyrt: invalid device ordinal {idx}; there is 1 tpu device")


class device:
    """``torch.tpu.device(d)``: the device context manager of ``torch.cuda.device``; there
    is one tpu device, so entering it changes nothing (PyTorch's storage moves enter it)."""

    def __init__(self, device):
        set_device(device if device is not None else 0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


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
    m.device = device
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
    # no caching allocator in front of XLA's: what is reserved is what is allocated
    m.memory_reserved = m.memory_allocated
    m.max_memory_reserved = m.max_memory_allocated
    m.mem_get_info = mem_get_info
    m.memory_stats = lambda device=None: memory.memory_stats()
    m.memory_summary = lambda device=None, abbreviated=False: memory.memory_summary()
    m.empty_cache = lambda: None
    for name in ("Stream", "Event", "current_stream", "default_stream", "set_stream", "stream"):
        setattr(m, name, getattr(_streams, name))
    m.pallas = pallas_module()
    m.__getattr__ = _getattr

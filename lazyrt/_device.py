"""The ``tpu`` device: PrivateUse1 as a Python backend, and the ``torch.tpu`` module."""
from __future__ import annotations

import enum
import sys
import types

import jax
import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from . import _defer, _rng, memory
from ._config import MODES, config

aten = torch.ops.aten


# ---------------------------------------------------------------------------
# modes
# ---------------------------------------------------------------------------


class EagerMode(enum.Enum):
    """TorchTPU's eager modes, mapped to lazyrt's."""

    DEFER_AND_FUSE = "defer"
    DEFER_NEVER = "strict"
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "debug"


class _ModeContext:
    """Sets a mode at once; as a context manager, restores the previous one on exit."""

    def __init__(self, mode: str):
        self.prev = config.mode
        _switch(mode)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _switch(self.prev)
        return False

    def __repr__(self):
        return f"<lazyrt mode {config.mode!r}>"


def _switch(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"lazyrt: unknown mode {mode!r}; valid modes are "
                         + ", ".join(repr(m) for m in MODES))
    if config.mode == "defer" and mode != "defer":
        _defer.flush(reason="mode switch")
    config.mode = mode


def set_mode(mode: str) -> _ModeContext:
    """Set the execution mode ('strict', 'debug' or 'defer'); usable as a context manager."""
    if isinstance(mode, EagerMode):
        mode = mode.value
    return _ModeContext(mode)


def get_mode() -> str:
    return config.mode


def set_eager_mode(mode: EagerMode) -> _ModeContext:
    """TorchTPU's API: ``torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)``."""
    if not isinstance(mode, EagerMode):
        raise TypeError(f"set_eager_mode expects a torch.tpu.EagerMode, got {mode!r}")
    return _ModeContext(mode.value)


def sync() -> None:
    """The sync point: flush the pending trace (defer) and wait for all dispatched work."""
    _defer.flush(reason="lazyrt.sync")
    (jax.device_put(0) + 0).block_until_ready()
    jax.effects_barrier()


# ---------------------------------------------------------------------------
# torch.tpu
# ---------------------------------------------------------------------------


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


def _make_module() -> types.ModuleType:
    m = types.ModuleType("torch.tpu", "lazyrt's tpu device module (XLA via JAX).")
    m.EagerMode = EagerMode
    m.set_eager_mode = set_eager_mode
    m.is_available = lambda: True
    m.is_initialized = lambda: True
    m._is_in_bad_fork = lambda: False
    m._lazy_init = lambda: None
    m.device_count = lambda: 1
    m.current_device = lambda: 0

    def set_device(device) -> None:
        idx = torch.device(device).index if not isinstance(device, int) else device
        if idx not in (None, 0):
            raise RuntimeError(f"lazyrt: invalid device ordinal {idx}; there is 1 tpu device")

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

    def __getattr__(name):
        if name == "eager_mode":
            return {v.value: v for v in EagerMode}[config.mode]
        raise AttributeError(f"module 'torch.tpu' has no attribute '{name}'")

    m.__getattr__ = __getattr__
    return m


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


_LIB = None

# Factory ops with no tensor input reach lazyrt through PrivateUse1 kernels.
FACTORIES = [
    "empty.memory_format", "empty_strided", "zeros", "ones", "full", "scalar_tensor",
    "arange", "arange.start", "arange.start_step", "linspace", "logspace", "eye", "eye.m",
    "rand", "randn", "randint", "randint.low", "randperm", "tril_indices", "triu_indices",
    "_efficientzerotensor", "empty.names", "zeros.names", "ones.names", "full.names", "rand.names", "randn.names",
]


def register() -> None:
    global _LIB
    if _LIB is not None:
        return
    mod = _make_module()
    _setup_privateuseone_for_python_backend("tpu", backend_module=mod, hook=_Hooks(),
                                            device_guard=_Guard())
    sys.modules["torch.tpu"] = mod
    from ._dispatch import dispatch

    _LIB = torch.library.Library("aten", "IMPL")
    for name in FACTORIES:
        packet, _, ov = name.partition(".")
        op = getattr(getattr(aten, packet), ov or "default", None)
        if op is None:
            continue

        def kernel(*args, _op=op, **kwargs):
            return dispatch(_op, args, kwargs)

        try:
            _LIB.impl(name, kernel, "PrivateUse1")
        except RuntimeError:
            pass

    # torch.tensor(data, device="tpu") copies with the Python key excluded: the copy
    # reaches the backend's _copy_from.
    def _copy_from(self, dst, non_blocking=False):
        from ._dispatch import _h_copy_, resolve

        _h_copy_(resolve(aten.copy_.default), (dst, self), {})
        return dst

    _LIB.impl("_copy_from", _copy_from, "PrivateUse1")
    import torch.optim.optimizer as optim_mod

    optim_mod.register_optimizer_step_post_hook(_after_optimizer_step)
    # torch.optim picks foreach/fused only for tensors whose type is exactly Tensor or
    # Parameter; a tpu parameter is a TpuTensor (flagged _is_param).
    from ._tensor import TpuTensor

    if TpuTensor not in optim_mod._foreach_supported_types:
        optim_mod._foreach_supported_types.append(TpuTensor)
    _keep_tied_parameters()


def _keep_tied_parameters() -> None:
    """``model.to("tpu")`` keeps tied parameters tied (GPT-2's lm_head/embedding).

    For CUDA, ``Module._apply`` swaps ``param.data`` in place, so a parameter shared by
    two modules stays one object. A tpu tensor is a wrapper subclass, so PyTorch makes
    a new Parameter per module instead, silently untying them; re-tie afterwards.
    """
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


def _after_optimizer_step(optimizer, args, kwargs) -> None:
    if config.mode == "defer" and _defer.pending_count():
        _defer.flush(reason="optimizer.step")


# ---------------------------------------------------------------------------
# printing
# ---------------------------------------------------------------------------


def tensor_repr(t) -> str:
    from torch import _tensor_str as ts

    from ._dispatch import to_cpu

    prefix = "tensor("
    indent = len(prefix)
    suffixes = [f"device='{t.device}'"]
    c = to_cpu(t)
    if c.numel() == 0:
        if c.dim() != 1:
            suffixes.append("size=" + str(tuple(c.shape)))
        body = "[]"
    else:
        body = ts._tensor_str(c, indent)
    default_complex = torch.cdouble if torch.get_default_dtype() == torch.double else torch.cfloat
    if t.dtype not in (torch.get_default_dtype(), default_complex, torch.int64, torch.bool):
        suffixes.append("dtype=" + str(t.dtype))
    if t.grad_fn is not None:
        name = type(t.grad_fn).__name__
        if name == "CppFunction":
            name = t.grad_fn.name().rsplit("::", 1)[-1]
        suffixes.append(f"grad_fn=<{name}>")
    elif t.requires_grad:
        suffixes.append("requires_grad=True")
    return ts._add_suffixes(prefix + body, suffixes, indent, force_newline=False)


"""What DDP and FSDP2 ask of the ``tpu`` device beyond tensors, and the PyTorch private
functions lazyrt.distributed replaces (all of them are listed here).

* ``torch.tpu.Stream`` / ``Event`` / ``current_stream`` / ``stream`` / ``default_stream`` /
  ``set_stream``: lazyrt runs device work in program order on one stream, so streams are
  markers and waiting on them is free (FSDP2 builds its all-gather and reduce-scatter
  streams from these).
* FSDP2's ``alloc_storage`` / ``free_storage`` (``torch.distributed.fsdp._fully_shard.
  _fsdp_param`` and ``_fsdp_param_group``) resize the storage of the unsharded
  parameters; a tpu tensor has no byte storage (its value is a JAX array rebound by every
  write), so for tpu tensors both are no-ops: the unsharded value is replaced by the
  next all-gather's copy-out.
"""
from __future__ import annotations

import contextlib
import sys

import torch

_installed = [False]


class Stream:
    """A ``tpu`` stream. lazyrt runs device work in program order: every stream is the
    same queue, so ordering calls are no-ops."""

    def __init__(self, device=None, priority: int = 0, **kwargs):
        self.device = torch.device("tpu", 0)
        self.priority = priority

    def wait_stream(self, stream) -> None:
        return None

    def wait_event(self, event) -> None:
        return None

    def record_event(self, event=None):
        event = event if event is not None else Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __repr__(self) -> str:
        return f"<torch.tpu.Stream device=tpu:0 priority={self.priority}>"


class Event:
    """A ``tpu`` event (program order makes it complete as soon as it is recorded)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False):
        self.enable_timing = enable_timing
        self._recorded = False

    def record(self, stream=None) -> None:
        self._recorded = True

    def wait(self, stream=None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end_event) -> float:
        return 0.0


_DEFAULT = Stream()
_current = [_DEFAULT]


def current_stream(device=None) -> Stream:
    return _current[0]


def default_stream(device=None) -> Stream:
    return _DEFAULT


def set_stream(stream) -> None:
    _current[0] = stream


@contextlib.contextmanager
def stream(s):
    prev = _current[0]
    _current[0] = s if s is not None else prev
    try:
        yield s
    finally:
        _current[0] = prev


def install_streams() -> None:
    mod = sys.modules.get("torch.tpu")
    if mod is None:
        return
    for name, obj in (("Stream", Stream), ("Event", Event), ("current_stream", current_stream),
                      ("default_stream", default_stream), ("set_stream", set_stream),
                      ("stream", stream)):
        if not hasattr(mod, name) or getattr(mod, name) is None:
            setattr(mod, name, obj)


def _patch_fsdp_storage() -> None:
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    from . import _rt

    orig_alloc, orig_free = _fsdp_param.alloc_storage, _fsdp_param.free_storage
    if getattr(orig_alloc, "_lazyrt", False):
        return

    def alloc_storage(tensor):
        if _rt.is_tpu(tensor):
            return None
        return orig_alloc(tensor)

    def free_storage(tensor):
        if _rt.is_tpu(tensor):
            return None
        return orig_free(tensor)

    alloc_storage._lazyrt = True
    free_storage._lazyrt = True
    _fsdp_param.alloc_storage = alloc_storage
    _fsdp_param.free_storage = free_storage
    _fsdp_param_group.alloc_storage = alloc_storage


def install() -> None:
    if _installed[0]:
        return
    _installed[0] = True
    install_streams()
    _patch_fsdp_storage()

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
* DTensor's ``Shard._select_split_tensor`` (Replicate -> Shard, a local chunk ``rank``)
  runs as a rank-dependent step in fused mode (see ``_engine.rank_dependent``).
* ``FSDPParamGroup.__init__`` and ``FSDPState._lazy_init`` flush the pending trace when
  they return (defer mode): FSDP2's sharding copies are rank-dependent and must not join
  a fused training step.
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


def _patch_fsdp_init() -> None:
    """FSDP2 shards each parameter at ``fully_shard`` time by copying chunk ``rank`` of it:
    rank-dependent slices. Flush them there (a rank-local program), so they do not end up
    in the first training step's program, which in fused mode must be the same on every
    rank."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group, _fsdp_state

    from . import _engine

    def after(cls, name, when=lambda self: True):
        orig = getattr(cls, name)
        if getattr(orig, "_lazyrt", False):
            return

        def wrapped(self, *args, **kwargs):
            first = when(self)
            out = orig(self, *args, **kwargs)
            if first:
                _engine.flush_for_c10d(f"FSDP2 {name.strip('_')}")
            return out

        wrapped._lazyrt = True
        setattr(cls, name, wrapped)

    after(_fsdp_param_group.FSDPParamGroup, "__init__")
    # NOTE: _lazy_init runs at every root forward; it does work only the first time.
    after(_fsdp_state.FSDPState, "_lazy_init", lambda self: self._is_root is None)


def _patch_dtensor_local_chunks() -> None:
    """DTensor's Replicate -> Shard (and ``distribute_tensor`` without a scatter) keeps
    chunk ``rank`` of the local tensor: a rank-dependent slice. In fused mode it runs as a
    rank-dependent step (``_engine.rank_dependent``: pending collectives flushed before,
    the slice flushed after), so fused programs stay the same on every rank."""
    from torch.distributed.tensor import placement_types as pt

    from . import _engine, _rt

    for cls in (pt.Shard, getattr(pt, "_StridedShard", None)):
        if cls is None or "_select_split_tensor" not in cls.__dict__:
            continue
        orig = cls.__dict__["_select_split_tensor"]
        if getattr(orig, "_lazyrt", False):
            continue

        def wrapped(self, tensor, *args, _orig=orig, **kwargs):
            if not (_rt.is_tpu(tensor) and _engine.fused_active()):
                return _orig(self, tensor, *args, **kwargs)
            with _engine.rank_dependent():
                return _orig(self, tensor, *args, **kwargs)

        wrapped._lazyrt = True
        cls._select_split_tensor = wrapped


def install() -> None:
    if _installed[0]:
        return
    _installed[0] = True
    install_streams()
    _patch_fsdp_storage()
    _patch_fsdp_init()
    _patch_dtensor_local_chunks()

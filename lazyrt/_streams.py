"""``torch.tpu.Stream`` / ``Event`` / ``current_stream`` / ``stream`` / ``default_stream`` /
``set_stream``. lazyrt runs device work in program order on one queue, so streams are
markers and waiting on them is free (FSDP2 builds its all-gather and reduce-scatter
streams from these; DDP and user code ask for the current stream)."""
from __future__ import annotations

import contextlib

import torch


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

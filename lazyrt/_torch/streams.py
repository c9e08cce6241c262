"""``torch.tpu.Stream`` / ``Event`` / ``current_stream`` / ``stream`` / ``default_stream`` /
``set_stream``.

lazyrt has one device queue: XLA runs each computation once its inputs are ready (on
XLA:CPU, independent ones side by side), so every stream is that queue and ordering
calls (``wait_stream``, ``wait_event``) are no-ops. Waiting is real: ``synchronize``
returns when every value a tpu tensor holds is computed (``lazyrt.sync``), and ``query``
says whether it is. FSDP2 builds its all-gather and reduce-scatter streams from these;
DDP and user code ask for the current stream.

Timing events (``enable_timing=True``) have no device clock to read: ``record`` is a sync
point that waits for the work before it and then reads the host clock, so
``start.elapsed_time(end)`` is the wall time from the end of the work before ``start`` to
the end of the work before ``end``, in milliseconds.
"""
from __future__ import annotations

import contextlib
import time

import torch

from .._ops import control as _control


class Stream:
    """A ``tpu`` stream: the device's one queue."""

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
        return _control.all_ready()

    def synchronize(self) -> None:
        _control.sync()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __repr__(self) -> str:
        return f"<torch.tpu.Stream device=tpu:0 priority={self.priority}>"


class Event:
    """A ``tpu`` event. Without timing, ``record`` only marks it; ``synchronize`` and
    ``query`` look at all the work dispatched so far (a superset of the work before the
    record). With timing, ``record`` waits for the work before it and reads the clock."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False):
        self.enable_timing = enable_timing
        self._recorded = False
        self._time = None

    def record(self, stream=None) -> None:
        if self.enable_timing:
            _control.sync()
            self._time = time.perf_counter()
        self._recorded = True

    def wait(self, stream=None) -> None:
        return None

    def query(self) -> bool:
        return not self._recorded or _control.all_ready()

    def synchronize(self) -> None:
        if self._recorded:
            _control.sync()

    def elapsed_time(self, end_event) -> float:
        """Milliseconds from this event's record to ``end_event``'s (PyTorch's errors)."""
        if not (self.enable_timing and getattr(end_event, "enable_timing", False)):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if self._time is None or end_event._time is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        return (end_event._time - self._time) * 1e3


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

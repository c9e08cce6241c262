"""fft lowerings."""
from __future__ import annotations

from ._registry import aten, lower  # noqa: F401

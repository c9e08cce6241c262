"""Keep freed host memory for reuse when the "device" is the host CPU.

On XLA:CPU every buffer of a ``tpu`` tensor, and each executable's scratch (temp) buffer,
is host memory from glibc's malloc. glibc serves blocks above its mmap threshold (128 KiB,
rising to at most 32 MiB) with a fresh ``mmap`` and gives them back on free, and trims the
heap top above its trim threshold; either way the next computation takes a page fault for
every 4 KiB it touches. A defer training step of the GPT benchmark (54 MB of temps) took
about 14,000 minor faults per step and ran 20-25% slower for it (``perf/README.md``).

So, on the CPU platform under glibc, lazyrt raises both thresholds to 1 GiB when it first
lowers or compiles an op (``_xla.platform``; not at import, which must not start JAX):
freed blocks stay in the heap and are reused, as a device runtime's caching allocator
would. The price: the process's resident size stays near its peak. It applies to the whole
process (plain CPU tensors too). ``LAZYRT_HOST_MALLOC_CACHE=0`` leaves glibc's defaults.
"""
from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
THRESHOLD = 1 << 30

_applied: dict = {}


def applied() -> dict:
    """What ``enable`` set (empty if nothing): {'mmap_threshold': n, 'trim_threshold': n}."""
    return dict(_applied)


def enable() -> bool:
    """Raise glibc's mmap and trim thresholds; True if it did (glibc on Linux only)."""
    if _applied:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (glibc only; musl has no mallopt knobs)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    if mallopt(M_MMAP_THRESHOLD, THRESHOLD) != 1 or mallopt(M_TRIM_THRESHOLD, THRESHOLD) != 1:
        return False
    _applied.update(mmap_threshold=THRESHOLD, trim_threshold=THRESHOLD)
    return True

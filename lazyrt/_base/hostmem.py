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

It also answers how much host memory there is (``total``) and how much is free
(``available``), with the limits of the process's cgroup (v1 or v2) applied: on the CPU
platform that is what the device memory budget is taken from (``_torch.tpu_module``).
"""
from __future__ import annotations

import ctypes
import os
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


# ---- host memory: how much there is, how much is free (cgroup limits applied) ------------

_CGROUP = "/sys/fs/cgroup"


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            v = f.read().strip()
    except OSError:
        return None
    return int(v) if v.isdigit() else None  # "max" (v2: no limit) -> None


def _cgroup_dirs() -> list[str]:
    """The memory cgroup directories of this process, innermost first, up to the root (a
    limit anywhere on the path applies)."""
    rel = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                if ctrls == "":
                    rel["v2"] = path
                elif "memory" in ctrls.split(","):
                    rel["v1"] = path
    except (OSError, ValueError):
        pass
    out = []
    for version, base in (("v2", _CGROUP), ("v1", f"{_CGROUP}/memory")):
        path = rel.get(version, "/")
        while True:
            out.append((version, os.path.join(base, path.lstrip("/"))))
            if path in ("/", ""):
                break
            path = os.path.dirname(path)
    return out


def _cgroup_limit_and_usage() -> tuple[int | None, int | None]:
    """The tightest memory limit of this process's cgroups and the usage charged under it
    (None, None without a limit)."""
    best = (None, None)
    for version, d in _cgroup_dirs():
        if version == "v2":
            limit, usage = _read_int(f"{d}/memory.max"), _read_int(f"{d}/memory.current")
        else:
            limit = _read_int(f"{d}/memory.limit_in_bytes")
            usage = _read_int(f"{d}/memory.usage_in_bytes")
            if limit is not None and limit >= 1 << 60:  # v1's "no limit" is a huge number
                limit = None
        if limit is not None and (best[0] is None or limit < best[0]):
            best = (limit, usage)
    return best


def _meminfo(key: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def total() -> int:
    """The host memory this process may use: physical memory, or its cgroup's limit if lower."""
    phys = _meminfo("MemTotal")
    if phys is None:
        try:
            phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            phys = 0
    limit, _ = _cgroup_limit_and_usage()
    return min(phys, limit) if limit is not None and phys else (limit or phys)


def available() -> int:
    """Host memory free for new allocations now: the kernel's MemAvailable, or what the
    cgroup's limit leaves if that is less."""
    avail = _meminfo("MemAvailable")
    if avail is None:
        avail = total()
    limit, usage = _cgroup_limit_and_usage()
    if limit is not None and usage is not None:
        avail = min(avail, max(0, limit - usage))
    return avail

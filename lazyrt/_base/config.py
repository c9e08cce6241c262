"""Every switch lazyrt reads, named, typed and read in one place.

Environment variables are read once at import; code can change the fields of
``config`` afterwards (``lazyrt.set_mode`` and friends do).
"""
from __future__ import annotations

import dataclasses
import os
import re

MODES = ("strict", "debug", "defer")


def _env_bool(name: str, default: bool = False) -> bool:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    v = v.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"lazyrt: {name}={v!r} is not a boolean; use 1/0, true/false, yes/no or on/off")


def _env_number(name: str, default, cast, what: str, zero_ok: bool = False):
    """``cast`` of env var ``name`` (``default`` when unset or empty): positive, or with
    ``zero_ok`` 0 or more."""
    v = os.environ.get(name)
    if v is None or v.strip() == "":
        return default
    try:
        out = cast(v)
    except ValueError:
        raise ValueError(f"lazyrt: {name}={v!r} is not {what}") from None
    if out < 0 or (out == 0 and not zero_ok):
        raise ValueError(f"lazyrt: {name}={v!r} must be {'0 or more' if zero_ok else 'positive'}")
    return out


def _env_int(name: str, default: int) -> int:
    return _env_number(name, default, int, "an integer")


def _env_count(name: str, default: int) -> int:
    """A non-negative integer (0 allowed: "off")."""
    return _env_number(name, default, int, "an integer", zero_ok=True)


def _env_float(name: str, default: float) -> float:
    return _env_number(name, default, float, "a number")


_BYTE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 1024**2, "mb": 1000**2,
               "mib": 1024**2, "g": 1024**3, "gb": 1000**3, "gib": 1024**3, "t": 1024**4,
               "tb": 1000**4, "tib": 1024**4}


def parse_memory(name: str, v: str) -> int | float:
    """A memory size: bytes (``"4GiB"``, ``"512MB"``, ``"1073741824"``) as an int, or a share
    of the host's memory (``"50%"``) as a float in (0, 1]."""
    s = v.strip().lower().replace(" ", "")
    if s.endswith("%"):
        try:
            share = float(s[:-1]) / 100
        except ValueError:
            share = -1.0
        if not 0 < share <= 1:
            raise ValueError(f"lazyrt: {name}={v!r}: a share of host memory must be in (0%, 100%]")
        return share
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)([a-z]*)", s)
    if m is None or m.group(2) not in _BYTE_UNITS:
        raise ValueError(f"lazyrt: {name}={v!r} is not a memory size; use e.g. 8GiB, 512MB, "
                         "1073741824 (bytes) or 50% (of the host's memory)")
    n = int(float(m.group(1)) * _BYTE_UNITS[m.group(2)])
    if n <= 0:
        raise ValueError(f"lazyrt: {name}={v!r} must be positive")
    return n


def _env_memory(name: str, default: int | float) -> int | float:
    v = os.environ.get(name)
    if v is None or v.strip() == "":
        return default
    return parse_memory(name, v)


def _env_choice(name: str, choices: tuple, default: str) -> str:
    v = os.environ.get(name, default).strip().lower() or default
    if v not in choices:
        raise ValueError(f"lazyrt: {name}={v!r} must be one of "
                         + ", ".join(repr(c) for c in choices))
    return v


OFF = ("off", "0", "false", "no", "none")  # LAZYRT_CACHE_DIR values that turn it off


def _env_cache_dir() -> str | None:
    """``LAZYRT_CACHE_DIR``: unset, empty or ``user``: the user's cache directory
    (``$XDG_CACHE_HOME/lazyrt``, else ``~/.cache/lazyrt``); ``off``: no persistent cache;
    anything else: that directory."""
    v = os.environ.get("LAZYRT_CACHE_DIR", "").strip()
    if v.lower() in OFF:
        return None
    if not v or v.lower() == "user":
        base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join("~", ".cache")
        return os.path.join(os.path.abspath(os.path.expanduser(base)), "lazyrt")
    return os.path.abspath(os.path.expanduser(v))


def _env_names(name: str) -> frozenset:
    """A comma-separated list of names (``"a,b"``; spaces and empty items ignored)."""
    return frozenset(n.strip().lower() for n in os.environ.get(name, "").split(",") if n.strip())


def _env_mode() -> str:
    mode = os.environ.get("TORCH_TPU_MODE")
    if mode is not None and mode != "":
        mode = mode.strip().lower()
        if mode not in MODES:
            raise ValueError(
                f"lazyrt: TORCH_TPU_MODE={mode!r} is not a valid mode; valid modes are "
                + ", ".join(repr(m) for m in MODES)
            )
        return mode
    # TorchTPU's own switches.
    if _env_bool("TORCH_TPU_LAUNCH_BLOCKING"):
        return "debug"
    if _env_bool("TORCH_TPU_DEFER_AND_FUSE"):
        return "defer"
    return "strict"


@dataclasses.dataclass
class Config:
    mode: str = "strict"
    # defer: flush when this many ops are pending.
    max_pending_ops: int = 10_000
    # defer: cut the pending trace into segments of this many ops, each launched
    # (asynchronously) when it fills, while recording goes on; 0 = one flush per sync point.
    fusion_window: int = 0
    # defer: cut the pending trace where this many ops in a row repeat with a period of at
    # most 4 ops (a Python loop of small ops: one segment program, compiled once); 0 = off.
    loop_cut: int = 64
    # size of the LRU cache of compiled defer executables.
    cache_size: int = 1024
    # size of the LRU cache of compiled strict-mode executables (one per op signature).
    strict_cache_size: int = 4096
    # plans kept per ATen op (one per input signature) and view/write-through programs
    # kept; the oldest is dropped when a new one would pass the bound.
    plan_cache_size: int = 512
    # the persistent compile cache's directory (None: off); see ``_exec.diskcache``
    cache_dir: str | None = None
    # its bound, in MiB (least recently used entries go first)
    cache_max_mb: float = 2048.0
    # tiered: a program first compiles at a low optimization level, the optimized build
    # replaces it from a background thread; full: every program compiled fully at once
    compile: str = "full"
    explain_recompile: bool = False
    debug_compare: bool = False
    cpu_fallback: bool = False
    # auto | on | off
    pallas: str = "auto"
    # capture the user's source line for every recorded op (costs time).
    record_source: bool = False
    # on XLA:CPU, keep freed host memory in malloc's heap for reuse (see _hostmem.py).
    host_malloc_cache: bool = True
    # The device memory lazyrt reports on the CPU platform (where XLA has no memory limit of
    # its own): bytes, or a float in (0, 1] = that share of the host's memory (cgroup-aware).
    # Ignored where JAX reports the device's limit (GPU/TPU). See docs/huggingface.md.
    device_memory: int | float = 0.5
    # names of lazyrt's patches of torch and client libraries not to apply (to bisect a
    # problem); read when each patch is installed. See docs/architecture.md, "Patches".
    disabled_patches: frozenset = frozenset()
    # indices of indexing ops (gather, index_select, embedding, x[idx], ...) that are values
    # on the device: "async" checks them on the device beside the op and raises PyTorch's
    # error at the next sync point (as CUDA's device-side assert); "sync" reads the check at
    # the op (a sync point per such op: PyTorch's error at the op, as on the CPU); "off"
    # leaves them unchecked (XLA clamps or drops an out-of-range index). Indices known on
    # the host are always checked at the op. See lazyrt/_ops/bounds.py.
    index_checks: str = "async"

    @classmethod
    def from_env(cls) -> Config:
        return cls(
            mode=_env_mode(),
            max_pending_ops=_env_int("LAZYRT_MAX_PENDING_OPS", 10_000),
            fusion_window=_env_count("LAZYRT_FUSION_WINDOW", 0),
            loop_cut=_env_count("LAZYRT_LOOP_CUT", 64),
            cache_size=_env_int("LAZYRT_CACHE_SIZE", 1024),
            strict_cache_size=_env_int("LAZYRT_STRICT_CACHE_SIZE", 4096),
            plan_cache_size=_env_int("LAZYRT_PLAN_CACHE_SIZE", 512),
            cache_dir=_env_cache_dir(),
            cache_max_mb=_env_float("LAZYRT_CACHE_MAX_MB", 2048.0),
            compile=_env_choice("LAZYRT_COMPILE", ("tiered", "full"), "full"),
            explain_recompile=_env_bool("LAZYRT_EXPLAIN_RECOMPILE"),
            debug_compare=_env_bool("LAZYRT_DEBUG_COMPARE"),
            cpu_fallback=_env_bool("LAZYRT_CPU_FALLBACK"),
            pallas=_env_choice("LAZYRT_PALLAS", ("auto", "on", "off"), "auto"),
            record_source=_env_bool("LAZYRT_RECORD_SOURCE"),
            host_malloc_cache=_env_bool("LAZYRT_HOST_MALLOC_CACHE", True),
            device_memory=_env_memory("LAZYRT_DEVICE_MEMORY", 0.5),
            disabled_patches=_env_names("LAZYRT_DISABLE_PATCH"),
            index_checks=_env_choice("LAZYRT_INDEX_CHECKS", ("async", "sync", "off"), "async"),
        )


config = Config.from_env()

"""Every switch lazyrt reads, named, typed and read in one place.

Environment variables are read once at import; code can change the fields of
``config`` afterwards (``lazyrt.set_mode`` and friends do).
"""
from __future__ import annotations

import dataclasses
import os

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
    # size of the LRU cache of compiled defer executables.
    cache_size: int = 1024
    # size of the LRU cache of compiled strict-mode executables (one per op signature).
    strict_cache_size: int = 4096
    # plans kept per ATen op (one per input signature) and view/write-through programs
    # kept; the oldest is dropped when a new one would pass the bound.
    plan_cache_size: int = 512
    cache_dir: str | None = None
    explain_recompile: bool = False
    debug_compare: bool = False
    cpu_fallback: bool = False
    # auto | on | off
    pallas: str = "auto"
    # capture the user's source line for every recorded op (costs time).
    record_source: bool = False
    # on XLA:CPU, keep freed host memory in malloc's heap for reuse (see _hostmem.py).
    host_malloc_cache: bool = True

    @classmethod
    def from_env(cls) -> Config:
        pallas = os.environ.get("LAZYRT_PALLAS", "auto").strip().lower() or "auto"
        if pallas not in ("auto", "on", "off"):
            raise ValueError(f"lazyrt: LAZYRT_PALLAS={pallas!r} must be one of 'auto', 'on', 'off'")
        return cls(
            mode=_env_mode(),
            max_pending_ops=_env_int("LAZYRT_MAX_PENDING_OPS", 10_000),
            fusion_window=_env_count("LAZYRT_FUSION_WINDOW", 0),
            cache_size=_env_int("LAZYRT_CACHE_SIZE", 1024),
            strict_cache_size=_env_int("LAZYRT_STRICT_CACHE_SIZE", 4096),
            plan_cache_size=_env_int("LAZYRT_PLAN_CACHE_SIZE", 512),
            cache_dir=os.environ.get("LAZYRT_CACHE_DIR") or None,
            explain_recompile=_env_bool("LAZYRT_EXPLAIN_RECOMPILE"),
            debug_compare=_env_bool("LAZYRT_DEBUG_COMPARE"),
            cpu_fallback=_env_bool("LAZYRT_CPU_FALLBACK"),
            pallas=pallas,
            record_source=_env_bool("LAZYRT_RECORD_SOURCE"),
            host_malloc_cache=_env_bool("LAZYRT_HOST_MALLOC_CACHE", True),
        )


config = Config.from_env()

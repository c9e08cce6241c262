"""The switches of ``lazyrt.distributed``, read once from the environment.

``LAZYRT_DIST_FUSED``      1: in defer mode, collectives on tpu tensors are nodes of the
                           pending trace (a training step is one program); default 0:
                           each collective runs as its own program at its c10d call.
``LAZYRT_DIST_CHECK``      auto (default): before a fused program runs, the ranks compare
                           its fingerprint through the store (the anti-deadlock check);
                           on: also every isolated collective; off: no checks.
``LAZYRT_DIST_SYNC_TIMEOUT``  seconds a rank waits for the others at that check (300).
``LAZYRT_DIST_INIT_TIMEOUT``  at most this many seconds for all ranks to check in before
                           jax.distributed starts (300; the group's own timeout if shorter).
``LAZYRT_DIST_HEARTBEAT_TIMEOUT``  jax.distributed's heartbeat timeout in seconds (100).
``LAZYRT_DIST_SHUTDOWN_TIMEOUT``  seconds a process waits at exit for the others in
                           jax.distributed's shutdown barrier (60; JAX's default is 300):
                           how long a rank that failed lingers before it exits.
``LAZYRT_COORDINATOR_HOST`` / ``LAZYRT_COORDINATOR_PORT``  where rank 0 serves
                           jax.distributed (default: the interface that routes to MASTER_ADDR,
                           a free port); ``LAZYRT_LOCAL_DEVICE_IDS``: the devices a process
                           may use (``local_rank``, or a comma list); see ``_startup``.
``LAZYRT_DIST_DUMP``       a directory: every fused program's StableHLO is written there as
                           fused_<fingerprint>_rank<r>.mlir (to diff two ranks' programs).
"""
from __future__ import annotations

import dataclasses
import os

from .._base.config import _env_bool, _env_float


def _env_check() -> str:
    v = (os.environ.get("LAZYRT_DIST_CHECK") or "auto").strip().lower()
    v = {"1": "on", "true": "on", "yes": "on", "0": "off", "false": "off", "no": "off"}.get(v, v)
    if v not in ("auto", "on", "off"):
        raise ValueError(f"lazyrt: LAZYRT_DIST_CHECK={v!r} must be one of auto, on, off")
    return v


@dataclasses.dataclass
class DistConfig:
    fused: bool = False
    check: str = "auto"
    sync_timeout: float = 300.0
    init_timeout: float = 300.0
    heartbeat_timeout: int = 100
    shutdown_timeout: int = 60
    dump_dir: str | None = None

    @classmethod
    def from_env(cls) -> DistConfig:
        return cls(
            fused=_env_bool("LAZYRT_DIST_FUSED"),
            check=_env_check(),
            sync_timeout=_env_float("LAZYRT_DIST_SYNC_TIMEOUT", 300.0),
            init_timeout=_env_float("LAZYRT_DIST_INIT_TIMEOUT", 300.0),
            heartbeat_timeout=int(_env_float("LAZYRT_DIST_HEARTBEAT_TIMEOUT", 100)),
            shutdown_timeout=int(_env_float("LAZYRT_DIST_SHUTDOWN_TIMEOUT", 60)),
            dump_dir=os.environ.get("LAZYRT_DIST_DUMP") or None,
        )


dist_config = DistConfig.from_env()

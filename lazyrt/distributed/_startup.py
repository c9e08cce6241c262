"""Starting ``jax.distributed`` from torch's rendezvous.

One rank = one process = one JAX process. The first ``tpu`` process group a process
creates (the default group of ``init_process_group``) starts ``jax.distributed``: rank 0
picks a free port, publishes ``host:port`` through the group's store, every rank checks
in through the store (a missing peer is a Python error after the group's timeout, not
JAX's abort), then all call ``jax.distributed.initialize``.

It has to come before JAX's backend starts (JAX's rule); a tpu op run before
``init_process_group`` starts it, and that is reported as a clear error here.
"""
from __future__ import annotations

import datetime
import os
import socket

import jax

from ._config import dist_config

_KEY = "lazyrt/jax_coordinator"


def _backend_started() -> bool:
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def _my_address() -> str:
    """The address the other ranks can reach this host at: the interface that routes to
    the rendezvous store (``MASTER_ADDR``), loopback when that is local."""
    host = os.environ.get("LAZYRT_COORDINATOR_HOST")
    if host:
        return host
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master, int(os.environ.get("MASTER_PORT", "29500") or 29500)))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _free_port(host: str) -> int:
    port = os.environ.get("LAZYRT_COORDINATOR_PORT")
    if port:
        return int(port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host if host not in ("", "0.0.0.0") else "", 0))
        return s.getsockname()[1]


def _local_device_ids():
    """``LAZYRT_LOCAL_DEVICE_IDS``: the devices this process may use (a comma list, or
    ``local_rank`` for ``[LOCAL_RANK]``), for hosts where every process sees every chip
    (several GPUs per host, one rank per GPU). Unset: JAX's default (all visible)."""
    v = os.environ.get("LAZYRT_LOCAL_DEVICE_IDS", "").strip().lower()
    if not v:
        return None
    if v == "local_rank":
        return [int(os.environ.get("LOCAL_RANK", "0"))]
    return [int(x) for x in v.split(",") if x.strip()]


def _seconds(timeout) -> float:
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


def ensure_started(store, rank: int, world: int, timeout) -> None:
    """Start ``jax.distributed`` for ``world`` processes (this one is ``rank``), or check
    that the one already running matches."""
    import jax.distributed as jd

    if jd.is_initialized():
        if jax.process_count() != world or jax.process_index() != rank:
            raise RuntimeError(
                f"lazyrt: jax.distributed is already running with {jax.process_count()} "
                f"processes (this one is process {jax.process_index()}), but the tpu process "
                f"group has world size {world} and this process is rank {rank}; one rank "
                f"must be one JAX process with the same index")
        return
    if world == 1:
        return
    if _backend_started():
        raise RuntimeError(
            "lazyrt: JAX's backend was already started in this process (a tpu tensor was "
            "created, or some JAX computation ran, before dist.init_process_group('tpu')), so "
            "jax.distributed can no longer be started. Call dist.init_process_group('tpu') "
            "(or 'tpu_dist') first, before any tpu tensor or JAX work; importing lazyrt is "
            "fine.")
    secs = min(_seconds(timeout), dist_config.init_timeout)
    td = datetime.timedelta(seconds=secs)
    if rank == 0:
        host = _my_address()
        addr = f"{host}:{_free_port(host)}"
        store.set(_KEY, addr)
    # Every rank checks in; a rank that never comes is a Python error here, after the
    # timeout, rather than an abort inside JAX's client.
    store.set(f"{_KEY}/ready/{rank}", "1")
    keys = [_KEY] + [f"{_KEY}/ready/{r}" for r in range(world)]
    try:
        store.wait(keys, td)
    except Exception as e:  # torch.distributed.DistStoreError (a timeout)
        missing = [r for r in range(world) if not store.check([f"{_KEY}/ready/{r}"])]
        raise RuntimeError(
            f"lazyrt: rank(s) {missing} of {world} did not reach the start of jax.distributed "
            f"within {secs:g} s (rank {rank} waited); is every rank running and calling "
            f"init_process_group? ({type(e).__name__}: {e})") from e
    addr = store.get(_KEY).decode()
    jd.initialize(coordinator_address=addr, num_processes=world, process_id=rank,
                  local_device_ids=_local_device_ids(),
                  initialization_timeout=max(int(secs), 1),
                  heartbeat_timeout_seconds=dist_config.heartbeat_timeout,
                  shutdown_timeout_seconds=dist_config.shutdown_timeout)


def global_devices_by_rank() -> list:
    """The device of each global rank: the first local device of JAX process ``rank``."""
    import jax.distributed as jd

    if not jd.is_initialized():
        return [jax.local_devices()[0]]
    first: dict = {}
    for d in jax.devices():
        p = d.process_index
        if p not in first or d.id < first[p].id:
            first[p] = d
    return [first[p] for p in sorted(first)]

"""lazyrt.distributed: the ``tpu`` c10d backend on XLA collectives, and SPMD sharding.

Process groups (one rank = one process = one device)::

    import torch.distributed as dist, lazyrt
    dist.init_process_group("tpu")        # under torchrun; starts jax.distributed

SPMD, single controller (several devices in one process)::

    from lazyrt.distributed import Mesh, mark_sharding

Nothing here starts JAX's backend or imports torch.distributed machinery at
``import lazyrt``; the submodules load on first use.
"""
from __future__ import annotations

import importlib

_LAZY = {
    "Mesh": "_spmd", "mark_sharding": "_spmd", "clear_sharding": "_spmd",
    "get_sharding": "_spmd", "sharding_info": "_spmd", "get_global_mesh": "_spmd", "set_global_mesh": "_spmd",
    "FSDPv2": "_fsdpv2", "ProcessGroupTpu": "_backend", "dist_config": "_config",
    "set_fused": "_fused", "fused": "_fused", "sync": "_fused", "collective_log": "_fused",
}

__all__ = sorted(_LAZY) + ["register_backends"]


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'lazyrt.distributed' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{mod}"), name)


def _create(dist_backend_opts, backend_options=None):
    from . import _functional
    from ._backend import create

    pg = create(dist_backend_opts, backend_options)
    _functional.install()
    return pg


def register_backends() -> None:
    """Register the c10d backends ``tpu`` and ``tpu_dist`` (TorchTPU's name) for the
    ``tpu`` device. Cheap (no JAX, no
    process group): ``import lazyrt`` calls it."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    for name in ("tpu", "tpu_dist"):
        if name not in dist.Backend.backend_list:
            dist.Backend.register_backend(name, _create, extended_api=True, devices=["tpu"])

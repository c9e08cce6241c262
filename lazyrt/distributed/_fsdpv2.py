"""FSDPv2 (torch_xla's ``SpmdFullyShardedDataParallel``): FSDP as sharding annotations.

Every parameter is sharded over the mesh axis ``'fsdp'`` on its largest dimension that the
axis size divides; a parameter no dimension of which divides (a 2-class head's bias over
4 devices) is marked on its largest dimension, unevenly, as torch_xla marks it, and
``mark_sharding`` keeps that dimension whole (see ``_spmd``). Inputs are marked on their
batch dimension (kept whole when the axis does not divide it). GSPMD then inserts the
all-gathers of the forward and the reduce-scatters of the gradients; optimizer state
follows the parameters' sharding. With a single controller this is one program per op
(strict) or per step (defer), over all devices of the mesh.
"""
from __future__ import annotations

import torch

from ._spmd import Mesh, get_global_mesh, mark_sharding


def _param_spec(p: torch.Tensor, n: int, axis: str):
    if p.dim() == 0:
        return ()
    even = [d for d in range(p.dim()) if p.shape[d] % n == 0 and p.shape[d] >= n]
    dims = even or range(p.dim())
    best = max(dims, key=lambda d: (p.shape[d], -d))
    return tuple(axis if d == best else None for d in range(p.dim()))


class FSDPv2(torch.nn.Module):
    """``FSDPv2(module, mesh)``: shard ``module``'s parameters (in place) and its inputs'
    batch dimension over ``mesh``'s ``shard_axis`` (default ``'fsdp'``)."""

    def __init__(self, module: torch.nn.Module, mesh: Mesh | None = None,
                 shard_axis: str = "fsdp", shard_inputs: bool = True):
        super().__init__()
        mesh = mesh if mesh is not None else get_global_mesh()
        if mesh is None:
            raise ValueError("lazyrt: FSDPv2 needs a mesh (or set_global_mesh first)")
        if shard_axis not in mesh.axis_names:
            raise ValueError(f"lazyrt: the mesh has no axis {shard_axis!r} (its axes: "
                             f"{mesh.axis_names})")
        self.module = module
        self.mesh = mesh
        self.shard_axis = shard_axis
        self.shard_inputs = shard_inputs
        n = mesh.shape()[shard_axis]
        self.param_specs = {}
        with torch.no_grad():
            for name, p in module.named_parameters():
                spec = _param_spec(p, n, shard_axis)
                mark_sharding(p, mesh, spec)
                self.param_specs[name] = spec

    def _shard_input(self, x):
        if isinstance(x, torch.Tensor) and x.device.type == "tpu" and x.dim() >= 1:
            spec = (self.shard_axis,) + (None,) * (x.dim() - 1)
            with torch.no_grad():
                # NOTE: in place: the values stay, only their placement changes.
                mark_sharding(x, self.mesh, spec)
        return x

    def forward(self, *args, **kwargs):
        if self.shard_inputs:
            args = tuple(self._shard_input(a) for a in args)
            kwargs = {k: self._shard_input(v) for k, v in kwargs.items()}
        return self.module(*args, **kwargs)

"""``patches``' part for ``lazyrt.distributed``: FSDP2's and DTensor's Python objects,
patched when its collectives are first registered (``patches.install_distributed``; torch.
distributed.fsdp / .tensor load then, never at ``import lazyrt``)."""
from __future__ import annotations

from .._base.tensor import TpuTensor


def _patch_fsdp_storage() -> None:
    """FSDP2's ``alloc_storage`` / ``free_storage`` (``torch.distributed.fsdp._fully_shard.
    _fsdp_param`` and ``_fsdp_param_group``) resize the storage of the unsharded
    parameters; a tpu tensor has no byte storage (its value is a JAX array rebound by every
    write), so for tpu tensors both are no-ops: the unsharded value is replaced by the
    next all-gather's copy-out."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    orig_alloc, orig_free = _fsdp_param.alloc_storage, _fsdp_param.free_storage
    if getattr(orig_alloc, "_lazyrt", False):
        return

    def alloc_storage(tensor):
        if isinstance(tensor, TpuTensor):
            return None
        return orig_alloc(tensor)

    def free_storage(tensor):
        if isinstance(tensor, TpuTensor):
            return None
        return orig_free(tensor)

    alloc_storage._lazyrt = True
    free_storage._lazyrt = True
    _fsdp_param.alloc_storage = alloc_storage
    _fsdp_param.free_storage = free_storage
    _fsdp_param_group.alloc_storage = alloc_storage


def _patch_fsdp_init(hooks) -> None:
    """FSDP2 shards each parameter at ``fully_shard`` time by copying chunk ``rank`` of it:
    rank-dependent slices. Flush them there (a rank-local program), so they do not end up
    in the first training step's program, which in fused mode must be the same on every
    rank."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group, _fsdp_state

    def after(cls, name, when=lambda self: True):
        orig = getattr(cls, name)
        if getattr(orig, "_lazyrt", False):
            return

        def wrapped(self, *args, **kwargs):
            first = when(self)
            out = orig(self, *args, **kwargs)
            if first:
                hooks.flush_for_c10d(f"FSDP2 {name.strip('_')}")
            return out

        wrapped._lazyrt = True
        setattr(cls, name, wrapped)

    after(_fsdp_param_group.FSDPParamGroup, "__init__")
    # NOTE: _lazy_init runs at every root forward; it does work only the first time.
    after(_fsdp_state.FSDPState, "_lazy_init", lambda self: self._is_root is None)


def _patch_dtensor_local_chunks(hooks) -> None:
    """DTensor's Replicate -> Shard (and ``distribute_tensor`` without a scatter) keeps
    chunk ``rank`` of the local tensor: a rank-dependent slice. In fused mode it runs as a
    rank-dependent step (``_engine.rank_dependent``: pending collectives flushed before,
    the slice flushed after), so fused programs stay the same on every rank."""
    from torch.distributed.tensor import placement_types as pt

    for cls in (pt.Shard, getattr(pt, "_StridedShard", None)):
        if cls is None or "_select_split_tensor" not in cls.__dict__:
            continue
        orig = cls.__dict__["_select_split_tensor"]
        if getattr(orig, "_lazyrt", False):
            continue

        def wrapped(self, tensor, *args, _orig=orig, **kwargs):
            if not (isinstance(tensor, TpuTensor) and hooks.fused_active()):
                return _orig(self, tensor, *args, **kwargs)
            with hooks.rank_dependent():
                return _orig(self, tensor, *args, **kwargs)

        wrapped._lazyrt = True
        cls._select_split_tensor = wrapped


PATCHES = (_patch_fsdp_storage, _patch_fsdp_init, _patch_dtensor_local_chunks)

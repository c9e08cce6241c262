"""Every change lazyrt makes to a client library (not torch), in one place.

A client library hard-codes the devices it knows (``cuda``, ``xpu``, ``mps``); where that
leaves ``tpu`` sizing memory from the wrong device or recompiling every step, a patch here
gives tpu what those devices get. Each patch is installed when its library is imported
(an import hook: ``import lazyrt`` imports none of them), says what it changes, why, and
which version it was written against, and has a behaviour test (``tests/test_clients.py``).
A patch whose target has moved is skipped with a warning naming it, never half applied.

transformers 5.24, continuous batching (``model.generate_batch``, ``transformers serve``):

* ``cb_memory``: the paged cache is sized from ``get_device_and_memory_breakdown()``, which
  knows cuda/xpu/mps and otherwise reports the host's whole RAM. For a cache on tpu it
  reports ``torch.tpu.mem_get_info()`` (the device's limit, or lazyrt's budget on the CPU
  platform).
* ``cb_host_inputs``: each step's inputs (token ids, positions, cumulative lengths, cache
  read/write indices, attention masks) are built by slicing, filling and ``triu_``-ing
  device buffers with per-step bounds, which an XLA device compiles anew each step. For a
  tpu model they are built on the host (transformers' own code on CPU buffers, as its async
  host/device IO pair does for CUDA) and moved to tpu each step; the attention mask is
  built at the step's padded size only, never the whole [max_batch_tokens, cache] buffer.
* ``cb_padding``: batch shapes are padded (``ModelRunner.pad_inputs``) only for CUDA graphs
  or torch.compile; on tpu they always are, to powers of two (at least 8 query and 64 key
  tokens), so a run compiles one program per padded (query, key) size, not one per step.
  The warmup, which captures CUDA graphs at the largest sizes, is skipped on tpu.
* ``cb_paged_attention``: the decode fast path (every request one new token: attention
  through the cache's block table, no gather of the whole context) is only enabled for
  flash-attn on cuda/xpu. For a tpu model with ``sdpa`` or ``paged|eager`` attention it is
  enabled too: ``PagedAttentionCache.update`` writes the new keys/values at their slots
  (the allocator's own index write) and the attention function runs
  ``torch.ops.lazyrt.paged_attention`` over the page views (``kernels_pallas``' ragged paged
  kernel where Pallas is on, else its pure-JAX reference). Prefill steps run transformers'
  own attention. Off: ``ContinuousBatchingConfig(max_blocks_per_request=0)``. Counter:
  ``paged_attention_calls`` (one per attention layer call).

transformers 5.24, ``Trainer``:

* ``trainer_rng``: a checkpoint's RNG file holds cuda's and xla's generator states but not
  tpu's, so a resumed run would draw other dropout masks; tpu's state is saved and
  restored beside them.
"""
from __future__ import annotations

import importlib.abc
import os
import sys
import threading
import warnings

import torch

from .._base import rng as _rng
from .._base.metrics import COUNTERS
from .._ops.control import sync
from . import patchset as _patchset
from . import tpu_module as _tpu_module

_CB = "transformers.generation.continuous_batching"
_MIN_Q, _MIN_KV = 8, 64  # the smallest padded query and key lengths on tpu
applied: dict[str, str] = {}  # patch name -> what it patched (tests read it)
_local = threading.local()


# ---- transformers continuous batching ------------------------------------------------------

def _is_tpu(device) -> bool:
    return device is not None and torch.device(device).type == "tpu"


def _patch_cb_memory(cb) -> None:
    utils, cache = cb.utils, cb.cache
    orig = utils.get_device_and_memory_breakdown
    cache_init = cache.PagedAttentionCache.__init__

    def get_device_and_memory_breakdown():
        if not getattr(_local, "tpu_cache", False):
            return orig()
        sync()  # pending work counts once it is materialized
        free, total = _tpu_module.mem_get_info()
        used = total - free
        return torch.device("tpu"), total, used, used

    def __init__(self, config, continuous_batching_config, device, *args, **kwargs):
        prev = getattr(_local, "tpu_cache", False)
        _local.tpu_cache = _is_tpu(device)
        try:
            cache_init(self, config, continuous_batching_config, device, *args, **kwargs)
        finally:
            _local.tpu_cache = prev

    get_device_and_memory_breakdown.__wrapped__ = orig
    utils.get_device_and_memory_breakdown = get_device_and_memory_breakdown
    cache.get_device_and_memory_breakdown = get_device_and_memory_breakdown
    cache.PagedAttentionCache.__init__ = __init__
    applied["cb_memory"] = "utils/cache.get_device_and_memory_breakdown, PagedAttentionCache.__init__"


def _tpu_ios_class(io_mod):
    """``ContinuousBatchingIOs`` for a tpu model: every buffer on the host, the step's model
    kwargs moved to the device (``get_model_kwargs``)."""
    base = io_mod.ContinuousBatchingIOs
    build_attention_mask = io_mod.build_attention_mask

    class TpuContinuousBatchingIOs(base):
        def __init__(self, *, device, **kwargs):
            self.model_device = torch.device(device)
            super().__init__(device=torch.device("cpu"), **kwargs)

        def _setup_static_tensors(self, logit_processor) -> None:
            super()._setup_static_tensors(logit_processor)
            if self.attention_mask is not None:
                # NOTE: transformers' [1, 1, max_batch_tokens, cache + max_batch_tokens] buffers
                # (never touched yet) give way to empty ones its own code fills and resets
                # harmlessly; get_model_kwargs builds each step's mask at its padded size.
                self.attention_mask = {k: torch.empty((1, 1, 0, 0), dtype=self.model_dtype)
                                       for k in self.attention_mask}

        def _step_masks(self, use_padding: bool) -> dict:
            q_size = self.num_q_tokens
            n = self._get_num_sequences(use_padding=use_padding) + 1
            cu_q = self.cumulative_seqlens_q[:n].tolist()
            out = {}
            for layer_type, cu_k in self.cumulative_seqlens_k.items():
                k_len = (self.max_kv_read + q_size if use_padding
                         else self.total_seqlen_k[layer_type])
                mask = torch.full((1, 1, q_size, k_len), torch.finfo(self.model_dtype).min,
                                  dtype=self.model_dtype)
                window = (getattr(self.config, "sliding_window", None)
                          if layer_type == "sliding_attention" else 1)
                build_attention_mask(mask, cu_q, cu_k[:n].tolist(), sliding_window=window)
                out[layer_type] = mask
            return out

        def get_model_kwargs(self, use_padding: bool = False):
            kwargs = super().get_model_kwargs(use_padding=use_padding)
            if self.attention_mask is not None:
                masks = self._step_masks(use_padding)
                kwargs["attention_mask"] = (masks if isinstance(kwargs["attention_mask"], dict)
                                            else next(iter(masks.values())))
            dev = self.model_device
            for key, v in kwargs.items():
                if isinstance(v, torch.Tensor):
                    kwargs[key] = v.to(dev)
                elif isinstance(v, dict):
                    kwargs[key] = {k: t.to(dev) if isinstance(t, torch.Tensor) else t
                                   for k, t in v.items()}
                elif isinstance(v, list):
                    kwargs[key] = [t.to(dev) if isinstance(t, torch.Tensor) else t for t in v]
            return kwargs

    TpuContinuousBatchingIOs.__qualname__ = "TpuContinuousBatchingIOs"
    return TpuContinuousBatchingIOs


def _patch_cb_host_inputs(cb) -> None:
    api, io_mod = cb.continuous_api, cb.input_outputs
    base = io_mod.ContinuousBatchingIOs
    for name in ("_setup_static_tensors", "get_model_kwargs", "_get_num_sequences"):
        if not hasattr(base, name):
            raise AttributeError(f"ContinuousBatchingIOs.{name}")
    if api.ContinuousBatchingIOs is not base:
        raise AttributeError("continuous_api.ContinuousBatchingIOs is not input_outputs'")
    tpu_ios = _tpu_ios_class(io_mod)

    def make_ios(*, device, **kwargs):
        """``ContinuousBatchingIOs(...)`` as continuous_api calls it: the host-built
        variant for a tpu model."""
        cls = tpu_ios if _is_tpu(device) else base
        return cls(device=device, **kwargs)

    make_ios.tpu_class = tpu_ios
    api.ContinuousBatchingIOs = make_ios
    applied["cb_host_inputs"] = "continuous_api.ContinuousBatchingIOs"


def _patch_cb_padding(cb) -> None:
    mr = cb.model_runner
    runner = mr.ModelRunner
    orig_init, orig_pad, orig_warmup = runner.__init__, runner.maybe_pad_inputs, runner.warmup
    pad_to_pow2 = mr.pad_to_pow2
    tpu_ios = cb.continuous_api.ContinuousBatchingIOs.tpu_class

    def __init__(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        self._lazyrt_tpu = isinstance(self.inputs_and_outputs, tpu_ios)
        if self._lazyrt_tpu:
            self.pad_inputs = True

    def maybe_pad_inputs(self, num_q_tokens, max_kv_read, use_decode_fast_path):
        if not getattr(self, "_lazyrt_tpu", False):
            return orig_pad(self, num_q_tokens, max_kv_read, use_decode_fast_path)
        # NOTE: powers of two: a run compiles at most log2 sizes of each, and pads at most 2x
        # (CUDA graphs pad keys to 16384-token intervals, which a masked attention pays in full).
        q = pad_to_pow2(num_q_tokens, self.cache.max_batch_tokens, _MIN_Q)
        kv = pad_to_pow2(max_kv_read, self.cache.max_tokens_read, _MIN_KV) if max_kv_read else 0
        return q, kv

    def warmup(self, model):
        # NOTE: the warmup captures CUDA graphs at the largest sizes (a [max_batch_tokens,
        # whole cache] attention); on tpu each padded size compiles when first used.
        if getattr(self, "_lazyrt_tpu", False):
            return None
        return orig_warmup(self, model)

    for fn, orig in ((__init__, orig_init), (maybe_pad_inputs, orig_pad), (warmup, orig_warmup)):
        fn.__wrapped__ = orig
        setattr(runner, fn.__name__, fn)
    applied["cb_padding"] = "model_runner.ModelRunner.__init__, maybe_pad_inputs, warmup"


_PAGED_IMPLS = ("sdpa", "paged|eager")  # attention that gets the block-table path on tpu


def _paged_attention_forward(orig):
    """An attention function: the decode fast path's block-table call on tpu runs
    ``torch.ops.lazyrt.paged_attention``; anything else runs ``orig``."""

    def attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
        block_table = kwargs.get("block_table")
        if block_table is None or query.device.type != "tpu" or kwargs.get("k_cache") is None:
            return orig(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        cu_q = kwargs["cu_seq_lens_q"].to(torch.int32)
        cu_k = kwargs["cu_seq_lens_k"].to(torch.int32)
        n = block_table.shape[0]
        kv_lens = cu_k[1:n + 1] - cu_k[:n]  # the context including the new token
        q = query[0].transpose(0, 1)  # [T, Hq, D]
        COUNTERS["paged_attention_calls"] += 1
        out = torch.ops.lazyrt.paged_attention(q, kwargs["k_cache"], kwargs["v_cache"],
                                               block_table.to(torch.int32), cu_q[:n + 1],
                                               kv_lens, scale=scaling)
        return out.unsqueeze(0), None  # [1, T, Hq, D], as transformers' attention returns

    attention.__wrapped__ = orig
    attention._torchdynamo_inline = orig  # NOTE: Dynamo skips lazyrt's files: it traces orig
    return attention


def _decode_write_slots(block_table, cu_seq_lens_k, page_size: int, num_tokens: int, trash: int):
    """The cache slot of each decode token (sequence ``i``'s one new token is token ``i``,
    at position ``kv_len - 1``); padding tokens and sequences go to transformers' trash slot."""
    n = block_table.shape[0]
    pos = (cu_seq_lens_k[1:n + 1] - cu_seq_lens_k[:n]).long() - 1
    valid = pos >= 0
    pos = pos.clamp(min=0)
    page = block_table.long().gather(1, (pos // page_size).unsqueeze(1)).squeeze(1)
    slots = torch.where(valid, page * page_size + pos % page_size, trash)
    if num_tokens > n:
        slots = torch.cat([slots, slots.new_full((num_tokens - n,), trash)])
    return slots


def _patch_cb_paged_attention(cb) -> None:
    init, cache_mod = cb.initialization, cb.cache
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    orig_resolve = init.resolve_continuous_batching_config
    orig_ensure = init.ensure_decode_fast_path_is_available
    orig_update = cache_mod.PagedAttentionCache.update
    attn_types, allocators = init.group_layers_by_attn_type, init.ATTN_TYPE_TO_ALLOCATOR

    def resolve_continuous_batching_config(config, cb_config, *args, device=None, **kwargs):
        prev = getattr(_local, "tpu_cb", False)
        _local.tpu_cb = _is_tpu(device)
        try:
            return orig_resolve(config, cb_config, *args, device=device, **kwargs)
        finally:
            _local.tpu_cb = prev

    def ensure_decode_fast_path_is_available(config, cb_config, user_requested):
        if not (getattr(_local, "tpu_cb", False) and config._attn_implementation in _PAGED_IMPLS
                and all(allocators[t].supports_block_table for t in attn_types(config))):
            return orig_ensure(config, cb_config, user_requested)
        # NOTE: transformers sizes the block table from each call's workload (longest prompt
        # + max_new_tokens); a power of two (at least 4) keeps its shape, and so the decode
        # programs, the same across calls of other lengths. 0 turns the path off.
        mb = cb_config.max_blocks_per_request
        if mb > 0:
            cb_config.max_blocks_per_request = max(4, 1 << (mb - 1).bit_length())
        return None

    def update(self, key_states, value_states, layer_idx, kwargs):
        out = orig_update(self, key_states, value_states, layer_idx, kwargs)
        block_table = kwargs.get("block_table")
        if block_table is not None and key_states.device.type == "tpu":
            # NOTE: flash_attn_with_kvcache writes the new keys/values itself; here the
            # allocator's own index write puts them at their slots before the attention.
            allocator = self.layer_to_allocator[layer_idx]
            slots = _decode_write_slots(block_table, kwargs["cu_seq_lens_k"],
                                        kwargs["k_cache"].shape[1], key_states.shape[2],
                                        allocator.write_trash_index)
            k, v = (x.squeeze(0).transpose(0, 1) for x in (key_states, value_states))
            allocator.update(k, v, layer_idx, slots[:0], slots)
        return out

    for name in _PAGED_IMPLS:
        ALL_ATTENTION_FUNCTIONS[name] = _paged_attention_forward(ALL_ATTENTION_FUNCTIONS[name])
    for fn, orig in ((resolve_continuous_batching_config, orig_resolve),
                     (ensure_decode_fast_path_is_available, orig_ensure)):
        fn.__wrapped__ = orig
        setattr(init, fn.__name__, fn)
    cb.continuous_api.resolve_continuous_batching_config = resolve_continuous_batching_config
    update.__wrapped__ = orig_update
    cache_mod.PagedAttentionCache.update = update
    applied["cb_paged_attention"] = ("initialization.resolve_continuous_batching_config, "
                                     "ensure_decode_fast_path_is_available, "
                                     "PagedAttentionCache.update, attention 'sdpa'/'paged|eager'")


# Every patch of continuous batching (``generate_batch``) on tpu, in the order applied; each
# takes the ``continuous_batching`` package with its submodules loaded. A new one is added
# here, after those it builds on.
CB_PATCHES = [_patch_cb_memory, _patch_cb_host_inputs, _patch_cb_padding,
              _patch_cb_paged_attention]


def _patch_transformers_cb(api) -> None:
    """``generate_batch`` on tpu: run when ``continuous_api`` has loaded (it imports every
    module patched here), applies ``CB_PATCHES``."""
    import importlib

    pkg = sys.modules[_CB]
    for sub in ("utils", "cache", "input_outputs", "model_runner", "initialization"):
        setattr(pkg, sub, importlib.import_module(f"{_CB}.{sub}"))
    pkg.continuous_api = api
    for patch in CB_PATCHES:
        if not _patchset.enabled(_name(patch)):
            continue
        if patch is _patch_cb_padding and "cb_host_inputs" not in applied:
            continue  # it pads the host-built inputs' steps only
        try:
            patch(pkg)
        except AttributeError as e:
            warnings.warn(f"lazyrt: transformers' continuous batching moved ({e}); patch "
                          f"{_name(patch)} is not applied (written for transformers 5.24)",
                          stacklevel=2)
            return


# ---- transformers Trainer ------------------------------------------------------------------

def _trainer_rng(mod) -> None:
    if _patchset.enabled("trainer_rng"):
        _patch_trainer_rng(mod)


def _patch_trainer_rng(mod) -> None:
    """transformers ``Trainer._save_rng_state`` / ``_load_rng_state`` (5.24): a checkpoint's
    ``rng_state*.pth`` holds the RNG states of Python, NumPy, the CPU and of cuda, xla, npu,
    hpu, mlu and musa; not the tpu generator's. A run resumed from a checkpoint then draws
    other dropout masks than the uninterrupted run (on CUDA it draws the same). The tpu
    state is added to that file as ``"tpu"`` and restored from it, as ``"cuda"`` is.
    (Upstream: save ``torch.get_device_module(device).get_rng_state()`` for any device.)"""
    trainer = mod.Trainer
    save, load = trainer._save_rng_state, trainer._load_rng_state
    safe_globals = mod.safe_globals  # transformers' allowlist of NumPy's RNG state types
    if getattr(save, "_lazyrt", False):
        return

    def read(path):
        with safe_globals():
            return torch.load(path, weights_only=True)

    def _save_rng_state(self, output_dir):
        save(self, output_dir)
        path = _rng_file(self, output_dir)
        if os.path.isfile(path):
            states = read(path)
            states["tpu"] = _rng.get_state()
            torch.save(states, path)

    def _load_rng_state(self, checkpoint):
        load(self, checkpoint)
        path = _rng_file(self, checkpoint) if checkpoint is not None else None
        if path is not None and os.path.isfile(path):
            state = read(path).get("tpu")
            if state is not None:
                _rng.set_state(state)

    for f, orig in ((_save_rng_state, save), (_load_rng_state, load)):
        f.__doc__, f.__wrapped__, f._lazyrt = orig.__doc__, orig, True
    trainer._save_rng_state, trainer._load_rng_state = _save_rng_state, _load_rng_state
    applied["trainer_rng"] = "trainer.Trainer._save_rng_state, _load_rng_state"


def _rng_file(trainer, folder: str) -> str:
    """The RNG file of this process in a checkpoint folder (transformers' names)."""
    if trainer.args.world_size > 1:
        return os.path.join(folder, f"rng_state_{trainer.args.process_index}.pth")
    return os.path.join(folder, "rng_state.pth")


# ---- the import hook -----------------------------------------------------------------------

# module -> patch, run once the module has loaded (a module that imports the others it
# patches). A module still loading when lazyrt is imported (its import of torch ran
# torch's device autoload, which imports lazyrt) is patched when it has loaded
# (``_when_loaded``).
PATCHES = {f"{_CB}.continuous_api": _patch_transformers_cb,
           "transformers.trainer": _trainer_rng}
# the patches' names (LAZYRT_DISABLE_PATCH)
NAMES = (*(p.__name__[len("_patch_"):] for p in CB_PATCHES), "trainer_rng")


def _name(patch) -> str:
    return patch.__name__[len("_patch_"):]
_pending = dict(PATCHES)


def _run(patch, module) -> None:
    """``patch(module)``; a library version it does not fit keeps running as it is."""
    try:
        patch(module)
    except Exception as e:
        warnings.warn(f"lazyrt: could not patch {module.__name__} ({patch.__name__}: {e!r}); "
                      "it runs unpatched", stacklevel=2)


class _PatchingLoader(importlib.abc.Loader):
    """The module's own loader, then its patch."""

    def __init__(self, loader, patch):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _run(self._patch, module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module with a patch it asks the finders after it and
    wraps the loader they give."""

    def find_spec(self, name, path, target=None):
        patch = _pending.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            del _pending[name]
            spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


_finder = _Finder()


def _when_loaded(name: str, module, patch) -> None:
    """Run ``patch`` once ``module``, still executing, has finished loading: lazyrt was
    imported from inside it (``from transformers import Trainer`` as a script's first import
    reaches ``import torch``, whose device autoload imports lazyrt). The import system marks
    the end of a module's loading by setting ``_initializing = False`` on its spec
    (``importlib._bootstrap._load_unlocked``, Python 3.9-3.13): that one assignment, on that
    one spec object, is watched. (Its parent package's attribute is no hook: transformers
    replaces its package object while loading.)"""
    spec = module.__spec__
    cls = type(spec)

    class _Watched(cls):
        def __setattr__(self, attr, value):
            super().__setattr__(attr, value)
            if attr == "_initializing" and not value and type(self) is _Watched:
                self.__class__ = cls
                if sys.modules.get(name) is module:  # not a failed import
                    _run(patch, module)

    _Watched.__name__ = _Watched.__qualname__ = cls.__name__
    _Watched.__module__ = cls.__module__
    try:
        spec.__class__ = _Watched
    except TypeError:  # a spec class of another layout (importlib's finders make none)
        warnings.warn(f"lazyrt: {name} was loading when lazyrt was imported; its patch is "
                      "not applied (import lazyrt first)", stacklevel=3)


def install() -> None:
    """Patch the libraries already imported; hook the import of the others."""
    for name in list(_pending):
        mod = sys.modules.get(name)
        if mod is None:
            continue
        del _pending[name]
        if getattr(getattr(mod, "__spec__", None), "_initializing", False):
            _when_loaded(name, mod, PATCHES[name])
        else:
            _run(PATCHES[name], mod)
    if _pending and _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)

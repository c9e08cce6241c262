"""Patches of client libraries (transformers, ...) where they handle CUDA, XLA and named
accelerators but leave out a PrivateUse1 device, so a CUDA script moved to ``tpu`` would
silently behave differently.

Each patch is keyed by the module it changes and applied when that module is first
imported (``_PostImport``, a finder on ``sys.meta_path`` that wraps only those modules'
loaders), or at ``install`` if it already is: importing lazyrt imports no client library.
Each one names the version it was checked against and the upstream change that would make
it unnecessary. A patch that no longer fits its library warns and leaves it as it is.
"""
from __future__ import annotations

import importlib.abc
import os
import sys
import threading
import warnings

import torch

from .._base import rng as _rng


def _trainer_tpu_rng_state(mod) -> None:
    """transformers ``Trainer._save_rng_state`` / ``_load_rng_state`` (5.24): a checkpoint's
    ``rng_state*.pth`` holds the RNG states of Python, NumPy, the CPU and of cuda, xla, npu,
    hpu, mlu and musa; not the tpu generator's. A run resumed from a checkpoint then draws
    other dropout masks than the uninterrupted run (on CUDA it draws the same). The tpu
    state is added to that file as ``"tpu"`` and restored from it, as ``"cuda"`` is.
    (Upstream: save ``torch.get_device_module(device).get_rng_state()`` for any device.)"""
    trainer = mod.Trainer
    save, load = trainer._save_rng_state, trainer._load_rng_state
    safe_globals = mod.safe_globals  # transformers' allowlist of NumPy's RNG state types

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


def _rng_file(trainer, folder: str) -> str:
    """The RNG file of this process in a checkpoint folder (transformers' names)."""
    if trainer.args.world_size > 1:
        return os.path.join(folder, f"rng_state_{trainer.args.process_index}.pth")
    return os.path.join(folder, "rng_state.pth")


# module name -> patches, applied once when the module has been imported
_AFTER_IMPORT = {
    "transformers.trainer": (_trainer_tpu_rng_state,),
}
_lock = threading.Lock()
_pending: dict = {}


def _apply(name: str, module) -> None:
    with _lock:
        patches = _pending.pop(name, ())
    for patch in patches:
        try:
            patch(module)
        except Exception as e:  # a library version the patch does not fit
            warnings.warn(f"lazyrt: could not patch {name} ({patch.__name__}): {e!r}; "
                          "it runs as it is", stacklevel=2)


class _PostImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a patched module's name it asks the other finders and
    wraps the found loader's ``exec_module``, so the patches run right after the module."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            _apply(fullname, module)

        loader.exec_module = exec_then_patch
        return spec


_FINDER = _PostImport()


def install() -> None:
    with _lock:
        for name, patches in _AFTER_IMPORT.items():
            _pending.setdefault(name, patches)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    for name in list(_pending):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "__file__"):
            _apply(name, module)

"""``LAZYRT_DISABLE_PATCH=name[,name]``: the one switch over lazyrt's patches of torch and
of client libraries (``patches``, ``patches_io``, ``clients``, tpu tensors' pickling), to
bisect a problem. Each patch asks ``enabled(name)`` when its turn to be installed comes;
``config.disabled_patches`` is read then. The names are listed in docs/architecture.md
("Patches").
"""
from __future__ import annotations

import warnings

from .._base.config import config

skipped: list = []  # disabled patches whose turn came, in that order


def enabled(name: str) -> bool:
    """Whether patch ``name`` is to be applied; a disabled one is listed in ``skipped``."""
    if name not in config.disabled_patches:
        return True
    if name not in skipped:
        skipped.append(name)
    return False


def check(valid) -> None:
    """Once, at install: warn of the disabled patches, and of names that are no patch
    (with the valid names)."""
    asked = config.disabled_patches
    if not asked:
        return
    valid = set(valid)
    unknown = sorted(asked - valid)
    if unknown:
        warnings.warn(f"lazyrt: LAZYRT_DISABLE_PATCH names no patch {', '.join(unknown)}; "
                      f"valid names: {', '.join(sorted(valid))}", stacklevel=3)
    known = sorted(asked & valid)
    if known:
        warnings.warn(f"lazyrt: LAZYRT_DISABLE_PATCH: not applying {', '.join(known)}",
                      stacklevel=3)

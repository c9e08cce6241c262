"""The platform lazyrt's arrays live on, asked once and only when first needed."""
from __future__ import annotations

import functools

import jax

# lazyrt's version (``lazyrt.__version__``; part of the persistent compile cache's key)
VERSION = "0.1.0"


@functools.cache
def platform() -> str:
    """The platform lazyrt's arrays live on ('cpu', 'gpu', 'tpu').

    Asked when lazyrt first lowers or compiles something, never at import (that would
    start JAX's backend, and on a GPU reserve its memory, before the user's own setup).
    On the CPU platform that is also when the host malloc cache is turned on."""
    p = jax.default_backend()
    if p == "cpu":
        from . import hostmem as _hostmem
        from .config import config

        if config.host_malloc_cache:
            _hostmem.enable()
    return p


def on_cpu() -> bool:
    return platform() == "cpu"

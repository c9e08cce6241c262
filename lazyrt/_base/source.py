"""The user's source line: the innermost frame that is the user's code.

A frame is not the user's when its file lies in lazyrt, torch, JAX (wherever they are
installed, editable installs included), the stdlib, or any installed-packages folder
(``site-packages``/``dist-packages``: a venv's, the base Python's, the user site, Debian's).
"""
from __future__ import annotations

import os
import site
import sys
import sysconfig

import jax
import jaxlib
import torch

_LIBS = "site-packages", "dist-packages"


def _library_dirs() -> tuple[str, ...]:
    dirs = [
        # the lazyrt package (this file is lazyrt/_base/source.py)
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        *(os.path.dirname(os.path.abspath(m.__file__)) for m in (torch, jax, jaxlib)),
        os.path.dirname(os.path.abspath(os.__file__)),  # the stdlib
    ]
    for scheme_vars in ({}, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}):
        paths = sysconfig.get_paths(vars=scheme_vars or None)
        dirs += [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    if hasattr(site, "getsitepackages"):  # an old virtualenv's site module lacks it
        dirs += site.getsitepackages()
    if site.ENABLE_USER_SITE and site.USER_SITE:
        dirs.append(site.USER_SITE)
    out = set()
    for d in dirs:
        for p in (os.path.abspath(d), os.path.realpath(d)):
            out.add(os.path.join(p, ""))
    return tuple(sorted(out))


_SKIP = _library_dirs()
_SEGMENTS = tuple(f"{os.sep}{name}{os.sep}" for name in _LIBS)
_IS_LIB: dict[str, bool] = {}  # co_filename -> not the user's code


def is_library_file(fn: str) -> bool:
    """Whether a code object's file is lazyrt, torch, JAX, the stdlib or an installed package."""
    lib = _IS_LIB.get(fn)
    if lib is None:
        if fn.startswith("<"):  # "<frozen ...>" is the stdlib; "<string>", "<stdin>" the user
            lib = fn.startswith("<frozen")
        else:
            lib = any(p.startswith(_SKIP) or any(s in p for s in _SEGMENTS)
                      for p in (fn, os.path.realpath(fn)))
        _IS_LIB[fn] = lib
    return lib


def user_frame(depth: int = 1):
    f = sys._getframe(depth)
    while f is not None:
        if not is_library_file(f.f_code.co_filename):
            return f
        f = f.f_back
    return None


def user_line(depth: int = 2) -> str:
    f = user_frame(depth)
    if f is None:
        return "<unknown>"
    return f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}"

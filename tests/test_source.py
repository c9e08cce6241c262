"""The user's source line (``lazyrt._base.source``) skips installed libraries wherever they lie
(a venv's ``site-packages``, Debian's ``dist-packages``) and never a user's folder named lazyrt."""
from __future__ import annotations

import importlib.util
import sys

import pytest

from lazyrt._base import source

LIB = "from lazyrt._base import source\n\ndef where():\n    return source.user_line(2)\n"


def _load(path, name):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(LIB)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("libdir", ["venv/lib/python3.11/site-packages",
                                    "usr/lib/python3/dist-packages"])
def test_an_installed_library_is_not_the_users_line(tmp_path, libdir):
    lib = _load(tmp_path / libdir / "somelib" / "api.py", f"somelib_{libdir[:3]}")
    line = sys._getframe().f_lineno + 1
    got = lib.where()  # the line the source must name
    assert got.startswith(f"{__file__}:{line} in "), got


def test_a_folder_named_lazyrt_is_the_users_code(tmp_path):
    """A clone of lazyrt is a folder named lazyrt: its scripts are the user's code."""
    user = _load(tmp_path / "lazyrt" / "examples" / "script.py", "lazyrt_clone_script")
    assert user.where().startswith(f"{tmp_path / 'lazyrt' / 'examples' / 'script.py'}:4 in ")


def test_lazyrt_torch_jax_and_the_stdlib_are_libraries():
    import os

    import jax
    import torch

    import lazyrt
    for mod in (lazyrt, torch, jax, os):
        assert source.is_library_file(os.path.abspath(mod.__file__)), mod
    assert source.is_library_file("<frozen importlib._bootstrap>")
    assert not source.is_library_file("<string>")
    assert not source.is_library_file(__file__)

"""The user's source line: the innermost frame outside lazyrt, torch and the stdlib."""
from __future__ import annotations

import os
import sys

import torch

_SKIP = (
    # the lazyrt package (this file is lazyrt/_base/source.py)
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
    os.path.dirname(os.path.abspath(os.__file__)) + os.sep,
)


def user_frame(depth: int = 1):
    f = sys._getframe(depth)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_SKIP) and not fn.startswith("<frozen"):
            return f
        f = f.f_back
    return None


def user_line(depth: int = 2) -> str:
    f = user_frame(depth)
    if f is None:
        return "<unknown>"
    return f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}"

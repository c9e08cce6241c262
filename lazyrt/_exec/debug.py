"""Debug mode (``TORCH_TPU_MODE=debug``): every strict execution blocks and is checked.

``check`` runs after each computation in debug mode (``_strict.run`` calls it, so ops,
views derived on their own and writes through views are all checked): a NaN/Inf that
the computation introduced raises ``FloatingPointError`` naming the ATen op and the
user's source line. ``LAZYRT_DEBUG_COMPARE=1`` also reruns each op on the CPU
(``_fallback.compare_with_cpu``) and records the first divergence here.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .._base import source as _source

_divergences: list[str] = []


def _has_bad(a) -> tuple[bool, bool]:
    if not jnp.issubdtype(a.dtype, jnp.inexact):
        return False, False
    arr = np.asarray(a)
    return bool(np.isnan(arr).any()), bool(np.isinf(arr).any())


def _is_bad_scalar(s) -> bool:
    return isinstance(s, float) and (s != s or s in (float("inf"), float("-inf")))


def check(prog, arrays, scalars, outs) -> None:
    """Block on ``outs``; raise if one holds a NaN/Inf that no input had."""
    for o in outs:
        o.block_until_ready()
    in_nan = in_inf = False
    for a in arrays:
        n, i = _has_bad(a)
        in_nan |= n
        in_inf |= i
    inf_scalar = any(_is_bad_scalar(s) for s in scalars)
    for o in outs:
        n, i = _has_bad(o)
        if (n and not in_nan) or (i and not in_inf and not inf_scalar):
            what = "NaN" if n else "Inf"
            raise FloatingPointError(
                f"lazyrt debug: {prog.op if prog.op is not None else prog.name} produced {what} "
                f"(its inputs had none) at {_source.user_line(2)}")


def note_divergence(msg: str) -> bool:
    """Record a CPU divergence; only the first is kept. Returns whether it was the first."""
    if _divergences:
        return False
    _divergences.append(msg)
    return True


def divergences() -> list[str]:
    return list(_divergences)


def clear_divergences() -> None:
    _divergences.clear()

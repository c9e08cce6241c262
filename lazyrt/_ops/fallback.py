"""Running an ATen op on the CPU on copies of its tpu arguments.

Two uses: the CPU fallback for ops with no lowering (``LAZYRT_CPU_FALLBACK=1``, off by
default, warned once per op and counted), and debug mode's CPU comparison
(``LAZYRT_DEBUG_COMPARE=1``: rerun each op on the CPU, report the first divergence).
"""
from __future__ import annotations

import warnings

import torch

from .._base import source as _source
from .._base.metrics import COUNTERS, FALLBACK_OPS
from .._exec import debug as _debug
from .._exec.values import from_cpu, host_to_device, to_cpu_tree, write

_warned: set = set()


def cpu_fallback(e, args, kwargs):
    if e.name not in _warned:
        _warned.add(e.name)
        warnings.warn(f"lazyrt: running {e.name} on the CPU (no tpu lowering); this syncs and "
                      f"copies its inputs to the host", stacklevel=4)
    COUNTERS["cpu_fallbacks"] += 1
    FALLBACK_OPS[e.name] += 1
    originals: dict = {}
    cargs = to_cpu_tree(list(args), originals)
    ckw = {k: to_cpu_tree(v, originals) for k, v in kwargs.items()}
    res = e.op(*cargs, **ckw)
    # Write mutated arguments back.
    for name, pos, is_list in e.mut:
        c = cargs[pos] if pos < len(cargs) else ckw.get(name)
        for x in (c if is_list else [c]):
            if x is not None and id(x) in originals:
                write(originals[id(x)], host_to_device(x))

    def back(r):
        if isinstance(r, torch.Tensor):
            if id(r) in originals:
                return originals[id(r)]
            return from_cpu(r)
        if type(r) is list:
            return [back(x) for x in r]
        if type(r) is tuple:
            return tuple(back(x) for x in r)
        return r

    return back(res)


def compare_with_cpu(e, args, kwargs, result) -> None:
    """Rerun the op on CPU copies; warn at (and record) the first divergence."""
    if _debug.divergences():
        return
    try:
        ref = e.op(*to_cpu_tree(list(args)), **{k: to_cpu_tree(v) for k, v in kwargs.items()})
        got = to_cpu_tree(result)
    except Exception:
        return
    refs = ref if isinstance(ref, (list, tuple)) else [ref]
    gots = got if isinstance(got, (list, tuple)) else [got]
    for r, g in zip(refs, gots):
        if isinstance(r, torch.Tensor) and isinstance(g, torch.Tensor) and r.shape == g.shape:
            if r.dtype.is_floating_point or r.dtype.is_complex:
                ok = torch.allclose(g.to(r.dtype), r, rtol=1e-3, atol=1e-4, equal_nan=True)
            else:
                ok = torch.equal(g.to(r.dtype), r)
            if not ok:
                msg = (f"lazyrt debug compare: {e.name} diverges from CPU at "
                       f"{_source.user_line(3)}: max abs diff "
                       f"{(g.double() - r.double()).abs().max().item():.3g}")
                if _debug.note_divergence(msg):
                    warnings.warn(msg, stacklevel=3)
                return

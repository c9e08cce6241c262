"""What Dynamo needs to trace tpu tensors, set up once, at the first compile.

* Dynamo must see ``TpuTensor`` as a tensor (``_patches.install_dynamo``).
* Dynamo must never trace lazyrt's own Python (or JAX under it): every function of
  lazyrt's modules runs with Dynamo's frame callback off for it and everything it calls
  (a per-code-object flag, free at run time), and lazyrt's directory is in Dynamo's skip
  list, so user code calling into lazyrt graph-breaks there instead of inlining it.
* LSTM/GRU are traced (``allow_rnn``), as TorchTPU does; otherwise they graph-break.
* Tpu tensors keep static shapes; Python scalars become dynamic as Dynamo decides.
* A tpu frame that hits Dynamo's recompile limit gets lazyrt's warning, naming the cause
  (``recompile_limit_hit``): from then on Dynamo runs it eagerly.
"""
from __future__ import annotations

import re
import sys
import types
import warnings

_done: list = []


def setup() -> None:
    if _done:
        return
    import torch._dynamo.trace_rules as trace_rules

    from .._torch import patches as _patches

    _patches.install_dynamo(recompile_limit_hit)
    # NOTE: lazyrt's own modules, and what they call (a frame of a skipped file still runs
    # under Dynamo's callback, so JAX's frames would be traced otherwise).
    for name in ("lazyrt", "kernels_pallas", "jax", "jaxlib", "ml_dtypes", "cachetools"):
        trace_rules.add(name)
    skip_lazyrt_frames()
    _done.append(True)


def _codes_of(obj, seen: set):
    """Code objects of a function/class and of everything defined inside them."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        for f in (obj.fget, obj.fset, obj.fdel):
            if f is not None:
                yield from _codes_of(f, seen)
        return
    wrapped = getattr(obj, "__wrapped__", None)
    if wrapped is not None and wrapped is not obj:
        yield from _codes_of(wrapped, seen)
    if isinstance(obj, types.FunctionType):
        yield from _nested(obj.__code__, seen)
    elif isinstance(obj, type):
        for v in vars(obj).values():
            yield from _codes_of(v, seen)


def _nested(code: types.CodeType, seen: set):
    if id(code) in seen:
        return
    seen.add(id(code))
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _nested(c, seen)


def skip_lazyrt_frames() -> int:
    """Mark every code object of lazyrt (and kernels_pallas) SKIP, recursively: Dynamo
    runs them, and whatever they call, without tracing. Returns how many were marked."""
    from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy
    from torch._dynamo.eval_frame import set_code_exec_strategy

    strategy = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    seen: set = set()
    n = 0
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == "lazyrt" or name.startswith(("lazyrt.", "kernels_pallas"))):
            continue
        for v in list(vars(mod).values()):
            if getattr(v, "__module__", None) != name:
                continue
            for code in _codes_of(v, seen):
                set_code_exec_strategy(code, strategy)
                n += 1
    import torch

    for v in list(vars(torch.tpu).values()):  # lambdas of the torch.tpu module
        if isinstance(v, types.FunctionType):
            for code in _codes_of(v, seen):
                set_code_exec_strategy(code, strategy)
                n += 1
    return n


def _is_tpu_backend(backend) -> bool:
    backend = getattr(backend, "compiler_fn", backend)  # torch._TorchCompileWrapper
    return getattr(backend, "__name__", "") == "tpu_backend" or getattr(backend, "tpu", False)


_SHAPE = re.compile(r"size mismatch|stride mismatch|dim\(\)|\.size\(\)|\.stride\(\)")
_VALUE = re.compile(r"(\S+) == (-?[\d.]+|True|False)\b")


def recompile_hint(reason: str) -> str:
    """What to do about a recompile whose guard failure is ``reason`` (Dynamo's text)."""
    if _SHAPE.search(reason):
        return ("a tensor's shape changed: the tpu backend compiles static shapes, one graph "
                "per shape. Pad inputs to a few fixed sizes; for generation use a static KV "
                "cache (cache_implementation='static').")
    m = _VALUE.search(reason)
    if m:
        return (f"the value of {m.group(1)} changed and Dynamo kept it a constant "
                "(torch.compile(dynamic=False), or the value sets a tensor's size or "
                "controls Python branches). With dynamic=None, the default, a Python scalar "
                "that changes becomes a runtime input; or pass it as a tensor.")
    return "see TORCH_LOGS=recompiles for every recompile's reason."


def recompile_limit_hit(backend, code, reason, limit_type) -> None:
    """Dynamo's recompile limit was hit for the frame of ``code`` (``_patches``): for tpu
    work, say so, with the cause, from the user's function's line."""
    if not _is_tpu_backend(backend):
        return
    import torch._dynamo.config as dconfig

    reason = " ".join((reason or "unknown").split())
    reason = reason.split("#")[0].strip()  # Dynamo appends the source line after '#'
    where = f"'{code.co_name}'" if code is not None else "a function"
    msg = (f"lazyrt: torch.compile on tpu hit Dynamo's {limit_type} "
           f"({getattr(dconfig, limit_type, '?')}) for {where}; it now runs eagerly (one "
           f"program per op, much slower). Last recompile: {reason}. Cause: "
           f"{recompile_hint(reason)}")
    if code is None:
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
    else:
        warnings.warn_explicit(msg, RuntimeWarning, code.co_filename, code.co_firstlineno)

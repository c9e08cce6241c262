"""``torch.compile`` picks the ``"tpu"`` backend for tpu work (TorchTPU's rule).

* ``backend`` not given: a module (or ``module.compile()``) whose parameters or buffers
  are on tpu when ``torch.compile`` is called compiles with ``"tpu"``; a function decides
  at each call, from its arguments and, for ``opt.step``, the optimizer's parameters
  (tpu tensors: ``"tpu"``, each variant compiled on first use); a function that reaches
  tpu tensors only through globals or closures is routed by its graph's inputs.
* ``"tpu"`` compiles static shapes: ``dynamic`` defaults to False, ``dynamic=True`` is an
  error (each new shape compiles its own graph, as Dynamo decides, up to its recompile
  limit, which ``TORCH_LOGS=recompiles`` shows).
* ``backend="inductor"`` with tpu parameters or arguments raises a clear error.

Nothing here imports Dynamo.
"""
from __future__ import annotations

import functools

import torch

_TPU = "tpu"


def _tpu():
    """The tpu backend (importing it sets Dynamo up, before anything is traced)."""
    from .backend import tpu_backend

    return tpu_backend


def _is_tpu_backend(backend) -> bool:
    return backend == _TPU or getattr(backend, "__name__", "") == "tpu_backend"


def _tpu_dynamic(dynamic):
    if dynamic:
        raise ValueError("lazyrt: torch.compile(..., dynamic=True) is not supported on tpu: "
                         "the tpu backend compiles static shapes (dynamic=False, the default "
                         "for tpu); each new shape compiles its own graph")
    return False


def _module_of(model):
    if isinstance(model, torch.nn.Module):
        return model
    owner = getattr(model, "__self__", None)
    return owner if isinstance(owner, torch.nn.Module) else None


def _module_on_tpu(mod) -> bool:
    for t in mod.parameters():
        return t.device.type == _TPU
    for t in mod.buffers():
        return t.device.type == _TPU
    return False


def _owner_on_tpu(fn) -> bool:
    """A bound method of an optimizer whose parameters are on tpu (``opt.step``)."""
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.optim.Optimizer):
        for group in owner.param_groups:
            for p in group["params"]:
                return p.device.type == _TPU
    return False


def _auto(gm, example_inputs, **kwargs):
    """The backend when nothing showed tpu tensors at ``torch.compile`` or call time (a
    function reaching tpu tensors through globals or closures): Dynamo has lifted them
    as graph inputs, so the graph's inputs decide."""
    if any(isinstance(x, torch.Tensor) and x.device.type == _TPU for x in example_inputs):
        return _tpu()(gm, example_inputs, **kwargs)
    from torch._dynamo.backends.registry import lookup_backend

    return lookup_backend("inductor")(gm, example_inputs, **kwargs)


def _has_tpu(args, kwargs) -> bool:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            if a.device.type == _TPU:
                return True
        elif isinstance(a, (list, tuple)):
            if _has_tpu(a, {}):
                return True
        elif isinstance(a, dict):
            if _has_tpu((), a):
                return True
    return False


def _inductor_error():
    return RuntimeError("lazyrt: backend='inductor' cannot compile tpu tensors (it generates "
                        "CPU/GPU kernels); use backend='tpu', the default for tpu inputs")


def compile(orig, model=None, *, backend=None, dynamic=None, **kwargs):
    """``torch.compile`` with the tpu rule; ``orig`` is PyTorch's own."""
    if model is None:
        return lambda m: compile(orig, m, backend=backend, dynamic=dynamic, **kwargs)
    if _is_tpu_backend(backend):
        return orig(model, backend=_tpu(), dynamic=_tpu_dynamic(dynamic), **kwargs)
    mod = _module_of(model)
    if mod is not None and _module_on_tpu(mod):
        if backend is None:
            return orig(model, backend=_tpu(), dynamic=_tpu_dynamic(dynamic), **kwargs)
        if backend == "inductor":
            raise _inductor_error()
        return orig(model, backend=backend, dynamic=dynamic, **kwargs)
    if mod is not None or not callable(model) or backend not in (None, "inductor"):
        return orig(model, backend=backend, dynamic=dynamic, **kwargs)
    return _per_call(orig, model, backend, dynamic, kwargs)


def _per_call(orig, fn, backend, dynamic, kwargs):
    """A function: the backend follows its arguments, each compiled on first use."""
    compiled: dict = {}

    owner_tpu = _owner_on_tpu(fn)

    @functools.wraps(fn)
    def run(*args, **kw):
        tpu = owner_tpu or _has_tpu(args, kw)
        if tpu and backend == "inductor":
            raise _inductor_error()
        f = compiled.get(tpu)
        if f is None:
            if tpu:
                f = orig(fn, backend=_tpu(), dynamic=_tpu_dynamic(dynamic), **kwargs)
            else:
                f = orig(fn, backend=backend or _auto, dynamic=dynamic, **kwargs)
            compiled[tpu] = f
        return f(*args, **kw)

    return run

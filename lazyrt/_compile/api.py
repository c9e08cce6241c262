"""``torch.compile`` picks the ``"tpu"`` backend for tpu work (TorchTPU's rule).

* Tpu work compiles with ``"tpu"``. A module (or ``module.compile()``) whose parameters or
  buffers are on tpu when ``torch.compile`` is called is tpu work; a function decides at
  each call, from its arguments and, for ``opt.step``, the optimizer's parameters (each
  variant compiled on first use); anything else is routed graph by graph: a graph that
  reads or creates tpu tensors (tpu inputs, tensors captured from closures, globals or
  module attributes, factories with ``device="tpu"``) goes to ``"tpu"``, any other graph
  to the backend asked for (inductor by default).
* ``backend="inductor"`` (PyTorch's default, which libraries such as accelerate pass
  explicitly) for tpu work compiles with ``"tpu"`` instead: inductor generates CPU/GPU
  kernels. A warning names the substitution once per process; inductor's ``mode`` and
  ``options`` do not apply to ``"tpu"``.
* ``"tpu"`` compiles static tensor shapes: ``dynamic=True`` is an error. With the default
  ``dynamic=None`` Dynamo's automatic dynamic applies to Python scalars only (an int that
  changes between calls becomes a runtime input of the one graph, after one recompile);
  tpu tensors keep static shapes (``_patches.install_dynamo``), each new shape compiles
  its own graph, up to Dynamo's recompile limit. ``dynamic=False`` specializes scalars too.

Nothing here imports Dynamo; a ``torch.compile`` call sets it up for tpu tensors
(``dynamo.setup``) before anything traces, whatever the backend.
"""
from __future__ import annotations

import functools
import warnings

import torch

_TPU = "tpu"
_INDUCTOR_ONLY = ("mode", "options")  # torch.compile arguments that only inductor reads
_warned: list = []


def _tpu():
    """The tpu backend (importing it sets Dynamo up, before anything is traced)."""
    from .backend import tpu_backend

    return tpu_backend


def _dynamo_setup() -> None:
    from .dynamo import setup

    setup()


def _is_tpu_backend(backend) -> bool:
    return backend == _TPU or getattr(backend, "__name__", "") == "tpu_backend"


def _tpu_dynamic(dynamic):
    if dynamic:
        raise ValueError("lazyrt: torch.compile(..., dynamic=True) is not supported on tpu: "
                         "the tpu backend compiles static shapes (each new shape compiles its "
                         "own graph); with dynamic=None, the default, Python scalars that "
                         "change between calls become runtime inputs")
    return dynamic


def _for_tpu(kwargs) -> dict:
    return {k: v for k, v in kwargs.items() if k not in _INDUCTOR_ONLY}


def warn_inductor() -> None:
    """Once per process: an inductor request for tpu work compiles with ``"tpu"``."""
    if _warned:
        return
    _warned.append(True)
    warnings.warn("lazyrt: torch.compile(backend='inductor') got tpu work; compiling it with "
                  "backend='tpu' instead (inductor generates CPU/GPU kernels, not tpu "
                  "programs; inductor's mode/options do not apply)", stacklevel=4)


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


def _on_tpu(v) -> bool:
    if isinstance(v, torch.Tensor):
        return v.device.type == _TPU
    if isinstance(v, (list, tuple)):
        return any(_on_tpu(x) for x in v)
    return False


def graph_on_tpu(gm, example_inputs) -> bool:
    """Whether a Dynamo graph reads or creates tpu tensors: its inputs (closures, globals
    and module attributes are lifted to inputs) or any node's value (``torch.arange(n,
    device="tpu")``)."""
    if any(_on_tpu(x) for x in example_inputs):
        return True
    return any(_on_tpu(n.meta.get("example_value")) for n in gm.graph.nodes)


class _Route:
    """The backend of work not known to be tpu work when ``torch.compile`` was called:
    each graph goes to ``"tpu"`` if it reads or creates tpu tensors, else to inductor
    (with the ``mode``/``options`` asked for); ``backend`` is None or ``"inductor"``."""

    def __init__(self, backend, kwargs, dynamic):
        self.backend = backend
        self.mode = kwargs.get("mode")
        self.options = kwargs.get("options")
        self.dynamic = dynamic
        self._other = None
        self.tpu = False  # a graph went to "tpu" (the recompile-limit warning asks)

    def other(self):
        if self._other is None:
            self._other = torch._TorchCompileInductorWrapper(self.mode, self.options,
                                                             self.dynamic)
        return self._other

    def __call__(self, gm, example_inputs, **kwargs):
        if graph_on_tpu(gm, example_inputs):
            if self.backend == "inductor":
                warn_inductor()
            self.tpu = True
            return _tpu()(gm, example_inputs)
        return self.other()(gm, example_inputs)

    def reset(self):
        if self._other is not None and hasattr(self._other, "reset"):
            self._other.reset()


def _routed(orig, model, backend, dynamic, kwargs):
    return orig(model, backend=_Route(backend, kwargs, dynamic), dynamic=dynamic,
                **_for_tpu(kwargs))


def compile(orig, model=None, *, backend=None, dynamic=None, **kwargs):
    """``torch.compile`` with the tpu rule; ``orig`` is PyTorch's own."""
    if model is None:
        return lambda m: compile(orig, m, backend=backend, dynamic=dynamic, **kwargs)
    # NOTE: Dynamo set up for tpu tensors before any compile traces, whatever its backend:
    # PyTorch's own backend="eager" compiles (eager flex_attention's) then trace tpu tensors.
    _dynamo_setup()
    if _is_tpu_backend(backend):
        return orig(model, backend=_tpu(), dynamic=_tpu_dynamic(dynamic), **_for_tpu(kwargs))
    if backend not in (None, "inductor") or not callable(model):
        return orig(model, backend=backend, dynamic=dynamic, **kwargs)
    mod = _module_of(model)
    if mod is not None:
        if _module_on_tpu(mod):
            if backend == "inductor":
                warn_inductor()
            return orig(model, backend=_tpu(), dynamic=_tpu_dynamic(dynamic), **_for_tpu(kwargs))
        return _routed(orig, model, backend, dynamic, kwargs)
    return _per_call(orig, model, backend, dynamic, kwargs)


def _per_call(orig, fn, backend, dynamic, kwargs):
    """A function: tpu arguments pick ``"tpu"`` (each variant compiled on first use);
    otherwise each graph is routed by the devices it reads and creates (``_Route``)."""
    compiled: dict = {}

    owner_tpu = _owner_on_tpu(fn)

    @functools.wraps(fn)
    def run(*args, **kw):
        tpu = owner_tpu or _has_tpu(args, kw)
        f = compiled.get(tpu)
        if f is None:
            if tpu:
                if backend == "inductor":
                    warn_inductor()
                f = orig(fn, backend=_tpu(), dynamic=_tpu_dynamic(dynamic), **_for_tpu(kwargs))
            else:
                f = _routed(orig, fn, backend, dynamic, kwargs)
            compiled[tpu] = f
        return f(*args, **kw)

    # NOTE: called inside another compiled region (torchtitan's compiled flex_attention in a
    # compiled block), Dynamo inlines ``fn``, as it does torch.compile's own wrapper
    # (this wrapper's file is in Dynamo's skip list).
    run._torchdynamo_inline = fn
    return run


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

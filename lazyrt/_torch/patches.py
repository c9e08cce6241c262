"""Every change lazyrt makes to PyTorch's own Python objects, in one place (with its parts
``patches_io``: saving, loading and tracing, and ``patches_dist``: FSDP2 and DTensor).

Checked against torch 2.11.0, 2.13.0 and 2.14.1 (lazyrt's range is 2.11 to 2.14); what a
torch lacks is asked of ``_base.compat``, never of the version number. Each patch says what it changes,
why lazyrt needs it, and what to look at when torch moves. ``tests/test_structure.py``
fails loudly if a patched attribute disappears. (Kernels registered through the public
``torch.library`` API are not patches: see ``_registration``.)

Every patch has a name (its function's, without ``_`` or ``_patch_``; ``NAMES``), a
behaviour test (``tests/test_patches.py``) and can be turned off by
``LAZYRT_DISABLE_PATCH=name[,name]`` (``patchset``).
"""
from __future__ import annotations

import functools
import warnings

import torch

from .._base import compat
from .._base.tensor import TpuTensor
from .._ops import backward_hold as _backward_hold
from .._ops import control as _control
from . import patches_dist as _patches_dist
from . import patches_io as _patches_io
from . import patchset as _patchset
from . import profiler as _profiler

_installed = []


def _backward_error_hold() -> None:
    """``torch.autograd.graph._engine_run_backward`` (and its re-export in
    ``torch.autograd``): torch 2.13 aborts the process when a Python exception leaves a
    PrivateUse1 kernel called from a C++ autograd node, so lazyrt holds such errors and
    raises them when the engine returns (``_backward_hold``)."""
    import torch.autograd
    import torch.autograd.graph

    wrapped = _backward_hold.run_backward(torch.autograd.graph._engine_run_backward)
    torch.autograd.graph._engine_run_backward = wrapped
    torch.autograd._engine_run_backward = wrapped


def _fast_dispatch_rule_lookup() -> None:
    """``torch._library.simple_registry.find_torch_dispatch_rule``: PyTorch asks it for a
    torch_dispatch rule on every op of a tensor subclass (~3 us per op); lazyrt registers
    none for TpuTensor, so answer None at once for it."""
    import torch._library.simple_registry as sr

    orig = sr.find_torch_dispatch_rule

    def find_torch_dispatch_rule(op, torch_dispatch_class):
        if torch_dispatch_class is TpuTensor:
            return None
        return orig(op, torch_dispatch_class)

    sr.find_torch_dispatch_rule = find_torch_dispatch_rule


def _tpu_generators() -> None:
    """``torch.Generator``: ``torch.Generator(device="tpu")`` must give a tpu generator,
    and PyTorch makes device generators only through C++ hooks a Python backend cannot
    fill (``getNewGenerator``). The name now refers to a subclass whose constructor makes
    ``_rng.Generator`` for tpu and PyTorch's own generator otherwise; ``isinstance`` and
    ``issubclass`` against it answer as for ``torch._C.Generator``."""
    from .._base import rng as _rng

    base = torch._C.Generator
    if torch.Generator is not base:
        return

    class _Meta(type(base)):
        def __call__(cls, device=None):
            if device is not None and torch.device(device).type == "tpu":
                return _rng.Generator()
            return base() if device is None else base(device)

        def __instancecheck__(cls, obj):
            return isinstance(obj, base)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, base)

    class Generator(base, metaclass=_Meta):
        __doc__ = base.__doc__

    Generator.__module__, Generator.__qualname__ = "torch", "Generator"
    torch.Generator = Generator


# torch.accelerator's device-generic calls and the torch.tpu calls that answer them
_ACCELERATOR_ROUTES = {
    "synchronize": lambda device=None: torch.tpu.synchronize(),
    "empty_cache": lambda: torch.tpu.empty_cache(),
    "memory_allocated": lambda device_index=None: torch.tpu.memory_allocated(),
    "max_memory_allocated": lambda device_index=None: torch.tpu.max_memory_allocated(),
    # no caching allocator in front of XLA's: what is reserved is what is allocated
    "memory_reserved": lambda device_index=None: torch.tpu.memory_allocated(),
    "max_memory_reserved": lambda device_index=None: torch.tpu.max_memory_allocated(),
    "memory_stats": lambda device_index=None: torch.tpu.memory_stats(),
    "reset_peak_memory_stats": lambda device_index=None: torch.tpu.reset_peak_memory_stats(),
    "reset_accumulated_memory_stats": lambda device_index=None: None,
    # (free, total): the C++ default asserts tpu's allocator is a DeviceAllocator
    "get_memory_info": lambda device_index=None: torch.tpu.mem_get_info(),
}


def _accelerator_api() -> None:
    """``torch.accelerator.synchronize`` and its memory calls (``torch.accelerator`` and
    ``torch.accelerator.memory``), which device-generic code calls: they go to C++ device
    guard and allocator hooks a Python backend cannot fill (torch 2.13 raises "Backend
    doesn't support synchronizing all streams on device" or an internal assert about
    ``device_allocator``), so with tpu the current accelerator they are torch.tpu's."""
    import torch.accelerator as acc
    import torch.accelerator.memory as accmem

    for name, fn in _ACCELERATOR_ROUTES.items():
        fn.__name__ = fn.__qualname__ = name
        for mod in (acc, accmem):
            if hasattr(mod, name):
                setattr(mod, name, fn)


def _matmul_precision() -> None:
    """``torch.set_float32_matmul_precision``: lowerings read the precision when they are
    traced and compiled plans bake it in, so a change flushes pending work first (it was
    recorded under the old precision) and drops the compiled plans (``_control``)."""
    orig = torch.set_float32_matmul_precision

    def set_float32_matmul_precision(precision: str) -> None:
        _control.set_matmul_precision(orig, precision)

    set_float32_matmul_precision.__doc__ = orig.__doc__
    torch.set_float32_matmul_precision = set_float32_matmul_precision


def _keep_parameter_objects() -> None:
    """``torch.nn.Module._apply``: ``model.to("tpu")`` (and back) keeps each Parameter
    object, as it does for CUDA, so references and optimizers made before the move stay
    valid, and tied parameters (GPT-2's lm_head/embedding) stay one object. For CUDA,
    ``Module._apply`` swaps ``param.data`` in place; for a wrapper subclass PyTorch makes a
    new Parameter per module instead. Afterwards each original parameter takes the new
    one's contents (``torch.utils.swap_tensors``, what ``_apply`` itself does under
    ``torch.__future__.set_swap_module_params_on_conversion``, gradient included) and goes
    back into every module that held it. Where swapping is refused (a weak reference to
    the parameter, e.g. a Dynamo guard; an autograd graph holding it), the new Parameter
    stays, re-tied, with a warning.
    In defer mode the conversion is then flushed: a move from the CPU records nothing
    (``_special.copy_``), but a conversion of parameters already on tpu (``.to(bf16)``,
    ``.half()``) would otherwise be recorded into the first training step's trace, which
    would then differ from every later step's (two compiles instead of one)."""
    orig = torch.nn.Module._apply
    depth = [0]

    def _apply(self, fn, recurse=True):
        if depth[0]:
            return orig(self, fn, recurse)
        owners: dict = {}
        for mod in self.modules():
            for name, p in mod._parameters.items():
                if p is not None:
                    owners.setdefault(id(p), (p, []))[1].append((mod, name))
        depth[0] += 1
        try:
            out = orig(self, fn, recurse)
        finally:
            depth[0] -= 1
        refused = []
        for old, group in owners.values():
            first_mod, first_name = group[0]
            keep = first_mod._parameters[first_name]
            if keep is not old and (isinstance(keep, TpuTensor) or isinstance(old, TpuTensor)):
                keep = _swap_into(old, keep, refused)
            for mod, name in group:
                mod._parameters[name] = keep
        if refused:
            warnings.warn(_refused_message(refused, len(owners)), stacklevel=3)
        _control.flush_pending("Module._apply (model.to)")
        return out

    torch.nn.Module._apply = _apply


def _swap_into(old, new, refused: list):
    """``old`` holding ``new``'s contents (``new`` is then dropped), or ``new`` where
    PyTorch refuses the swap (then ``(old, new, error)`` goes into ``refused``)."""
    try:
        torch.utils.swap_tensors(old, new)
    except (RuntimeError, TypeError) as e:
        refused.append((old, new, e))
        return new
    return old


def _refused_message(refused: list, total: int) -> str:
    """One warning for a ``Module.to`` whose parameters could not all be kept: how many,
    why, and what the user can do so that they are."""
    shapes = ", ".join(str(tuple(old.shape)) for old, _, _ in refused[:3])
    more = ", ..." if len(refused) > 3 else ""
    errors = [str(e) for _, _, e in refused]
    if any("weakref" in e for e in errors):
        why = ("something holds a weak reference to them (torch.compile does, for a model "
               "it compiled and ran before the move)")
        fix = "move the model first, then compile and run it"
    elif any("use_count" in e for e in errors):
        why = ("an autograd graph from before the move still uses them (an output or loss "
               "that was neither backpropagated nor deleted)")
        fix = ("move the model before running it, or delete (or backpropagate) those outputs "
               "first, or compute them under torch.no_grad()")
    else:
        why, fix = f"PyTorch refused to swap them ({errors[0]})", "move the model before using it"
    return (f"lazyrt: Module.to made a new Parameter in place of {len(refused)} of the "
            f"module's {total} parameters (shapes {shapes}{more}) on {refused[0][1].device}: "
            f"{why}. The module works with the new ones, but references to the old ones (an "
            "optimizer made before the move) no longer see the module's parameters. To keep "
            f"every Parameter object, as a move to CUDA does: {fix}.")


def _foreach_for_tpu_parameters() -> None:
    """``torch.optim.optimizer._foreach_supported_types``: torch.optim picks its foreach
    and fused paths only for tensors whose type is exactly Tensor or Parameter; a tpu
    parameter is a TpuTensor (flagged ``_is_param``)."""
    import torch.optim.optimizer as optim_mod

    if TpuTensor not in optim_mod._foreach_supported_types:
        optim_mod._foreach_supported_types.append(TpuTensor)


def _compile_picks_tpu(rule) -> None:
    """``torch.compile``: TorchTPU's rule, tpu inputs pick the ``"tpu"`` backend and static
    shapes; ``backend="inductor"`` with tpu inputs is a clear error. The rule
    (``_compile.api.compile``, a stage above this one) is handed in by the installer. Only
    the wrapper is installed here: nothing of Dynamo is imported until a compile."""
    orig = torch.compile

    @functools.wraps(orig)
    def compile(model=None, **kwargs):
        return rule(orig, model, **kwargs)

    torch.compile = compile


def _flex_attention_devices() -> None:
    """``torch.nn.attention.flex_attention._validate_device``: FlexAttention refuses every
    device outside a set written into that function (torch 2.13: cuda, cpu, xpu, hpu, mps;
    "FlexAttention is only supported on CUDA, CPU, HPU, or MPS devices"), eagerly and under
    Dynamo, which inlines it. tpu runs FlexAttention, forward and backward (``_torch.flex``
    eagerly, ``_compile.flex`` compiled), so "tpu" joins the set: the function's constant
    is replaced in its code object, so Dynamo still inlines it as PyTorch's own (a wrapper
    defined here would be a function Dynamo skips: a graph break, an error under
    ``fullgraph=True``, which FlexAttention's own compile uses)."""
    import torch.nn.attention.flex_attention as fa

    code = fa._validate_device.__code__
    consts = tuple(c | {"tpu"} if isinstance(c, frozenset) and "cuda" in c else c
                   for c in code.co_consts)
    if consts == code.co_consts:
        raise RuntimeError("lazyrt: torch.nn.attention.flex_attention._validate_device has no "
                           "device set to add tpu to (torch changed; see _torch/patches.py)")
    fa._validate_device.__code__ = code.replace(co_consts=consts)


def _profiler_ranges() -> None:
    """``torch.autograd.profiler.profile``'s ``_start_trace``, ``__exit__`` and
    ``export_chrome_trace`` (``torch.profiler.profile`` records through them, each
    ``schedule`` cycle too, and ``tensorboard_trace_handler`` exports through them): no
    C++ profiler hook reaches a Python backend, so while a profiler records lazyrt opens
    its ranges and runs a ``jax.profiler`` trace, and the exported trace gets XLA's
    executions as a device track and lazyrt's memory events (``_torch.profiler``)."""
    import torch.autograd.profiler as ap

    cls = ap.profile
    start, exit_, export = cls._start_trace, cls.__exit__, cls.export_chrome_trace

    @functools.wraps(start)
    def _start_trace(self):
        start(self)
        _profiler.started(self)

    @functools.wraps(exit_)
    def __exit__(self, exc_type, exc_val, exc_tb):
        if self.enabled:
            _profiler.stopping(self)
        return exit_(self, exc_type, exc_val, exc_tb)

    @functools.wraps(export)
    def export_chrome_trace(self, path, *args, **kwargs):
        out = export(self, path, *args, **kwargs)
        _profiler.exported(self, path)
        return out

    cls._start_trace, cls.__exit__, cls.export_chrome_trace = (_start_trace, __exit__,
                                                              export_chrome_trace)


def _linalg_checks_in_compiled_graphs() -> None:
    """``torch._higher_order_ops.effects``: ``aten::_linalg_check_errors`` (it raises
    "the input matrix is singular" after ``linalg.solve``, ``inv``, ``cholesky``) returns
    nothing, so a torch that does not register it as an ordered effect lets AOTAutograd
    drop it from compiled graphs, and ``torch.compile`` of a singular solve returns inf/nan
    where eager raises. Where torch has no such registration (2.11), lazyrt makes the one
    newer torch makes; elsewhere nothing changes."""
    if compat.has("compiled_linalg_checks"):
        return
    from torch._higher_order_ops import effects

    effects._register_effectful_op("aten::_linalg_check_errors", effects._EffectType.ORDERED)


PATCHES = (_backward_error_hold, _fast_dispatch_rule_lookup, _matmul_precision,
           _keep_parameter_objects, _foreach_for_tpu_parameters,
           _tpu_generators, _accelerator_api, _flex_attention_devices,
           _profiler_ranges, _linalg_checks_in_compiled_graphs) + _patches_io.PATCHES


def name(patch) -> str:
    """A patch's name: its function's, less a leading ``_`` or ``_patch_``."""
    n = patch.__name__
    return n[len("_patch_"):] if n.startswith("_patch_") else n.lstrip("_")


def _apply(patch, *args) -> None:
    if _patchset.enabled(name(patch)):
        patch(*args)


def install_dynamo(on_recompile_limit) -> None:
    """At the first compile: Dynamo treats a ``TpuTensor`` as a tensor (it wraps only plain
    tensors and traceable wrapper subclasses by default, so every tpu op graph-broke with
    "Dynamo does not know how to trace builtin operator `matmul` with argument types
    ['TpuTensor', ...]"). ``VariableBuilder._type_dispatch()`` is Dynamo's cached map from
    exact type to wrapper (torch/_dynamo/variables/builder.py, torch 2.13).

    Tpu tensors keep static shapes under automatic dynamic (Python scalars do not), and
    ``on_recompile_limit(backend, code, reason, limit_type)`` hears of every frame that hit
    Dynamo's recompile limit (``_compile.dynamo``)."""
    import torch._dynamo.variables.builder as builder

    _apply(_dynamo_wraps_tpu_tensors, builder)
    _apply(_dynamo_traces_rnn)
    _apply(_static_tpu_shapes, builder)
    _apply(_recompile_limit_hook, on_recompile_limit)


def _dynamo_wraps_tpu_tensors(builder) -> None:
    """``VariableBuilder._type_dispatch()`` and ``builder.infer_subclass_type``: Dynamo
    wraps a TpuTensor as a plain tensor (see ``install_dynamo``)."""
    from torch._dynamo.variables.builder import VariableBuilder

    VariableBuilder._type_dispatch()[TpuTensor] = VariableBuilder.wrap_tensor
    # ... and as a plain tensor, not a __torch_function__ subclass: otherwise Dynamo re-wraps
    # graph outputs with `to_subclass`, through a global its resume functions (after a
    # graph break) do not have: "NameError: name '__subclass_Tensor_..._c23' is not
    # defined". (``builder.infer_subclass_type``, torch 2.13.)
    infer = builder.infer_subclass_type

    def infer_subclass_type(value):
        return None if type(value) is TpuTensor else infer(value)

    builder.infer_subclass_type = infer_subclass_type


def _dynamo_traces_rnn() -> None:
    """``torch._dynamo.config.allow_rnn``: LSTM/GRU are traced into the graph rather than
    graph-broken, as TorchTPU does (process-wide Dynamo config, set at the first tpu
    compile)."""
    import torch._dynamo

    torch._dynamo.config.allow_rnn = True


def _static_tpu_shapes(builder) -> None:
    """A tpu tensor's shape is never made dynamic (TorchTPU compiles static shapes), while
    Dynamo's automatic dynamic still turns a Python int or float that changed between
    calls into a graph input. ``tensor_always_has_static_shape`` is what Dynamo asks, by
    this module-global name, before it gives a tensor symbolic sizes (torch 2.13; it
    already says yes for ``nn.Parameter``s)."""
    from torch._dynamo.utils import TensorStaticReason

    static = builder.tensor_always_has_static_shape

    def tensor_always_has_static_shape(tensor, is_tensor, tensor_source):
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "tpu":
            return True, TensorStaticReason.PARAMETER
        return static(tensor, is_tensor, tensor_source)

    builder.tensor_always_has_static_shape = tensor_always_has_static_shape


def _recompile_limit_hook(hook) -> None:
    """``convert_frame.exceeds_recompile_limit`` (a module-global name there, torch 2.13)
    answers whether a frame's next compile would pass the limit; when it does, Dynamo runs
    the frame eagerly from then on. Its caller, ``_compile``, holds the backend
    (``compiler_fn``), the frame's ``code`` and the guard failure (``recompile_reason``)."""
    import sys

    from torch._dynamo import convert_frame
    from torch._dynamo.eval_frame import innermost_backend

    exceeds = convert_frame.exceeds_recompile_limit

    def exceeds_recompile_limit(cache_size, compile_id):
        exceeded, limit_type = exceeds(cache_size, compile_id)
        if exceeded:
            caller = sys._getframe(1).f_locals
            fn = caller.get("compiler_fn")
            hook(innermost_backend(fn) if fn is not None else None, caller.get("code"),
                 caller.get("recompile_reason"), limit_type)
        return exceeded, limit_type

    convert_frame.exceeds_recompile_limit = exceeds_recompile_limit


def install(compile_rule) -> None:
    """Install every patch; ``compile_rule(orig_compile, model, **kwargs)`` is what
    ``torch.compile`` calls (``_compile.api.compile``)."""
    if _installed:
        return
    for patch in PATCHES:
        _apply(patch)
    _apply(_compile_picks_tpu, compile_rule)
    _installed.append(True)


# ---- lazyrt.distributed: installed when its collectives are first registered ---------------
# (torch.distributed.fsdp / .tensor load then, never at ``import lazyrt``.)

_dist_installed = []


def install_distributed(hooks) -> None:
    """The patches of FSDP2 and DTensor that ``lazyrt.distributed`` needs. ``hooks``:
    ``flush_for_c10d(reason)``, ``fused_active()``, ``rank_dependent()`` (a context
    manager) from its engine."""
    if _dist_installed:
        return
    _dist_installed.append(True)
    _apply(_patches_dist._patch_fsdp_storage)
    _apply(_patches_dist._patch_fsdp_init, hooks)
    _apply(_patches_dist._patch_dtensor_local_chunks, hooks)


NAMES = tuple(name(p) for p in (*PATCHES, _compile_picks_tpu, _dynamo_wraps_tpu_tensors,
                                _dynamo_traces_rnn, _static_tpu_shapes, _recompile_limit_hook,
                                *_patches_dist.PATCHES))

"""lazyrt's changes to PyTorch's saving, loading and tracing (part of ``patches``, which
installs them; the same rules: each says what it changes, why, and what to watch when torch
moves). Checked against torch 2.13.0.
"""
from __future__ import annotations

import functools

import torch

from .._base import compat
from .._base.tensor import TpuTensor
from . import serialization as _serialization


def _is_tpu_location(loc) -> bool:
    if isinstance(loc, str):
        return loc == "tpu" or loc.startswith("tpu:")
    return isinstance(loc, torch.device) and loc.type == "tpu"


def _tree_to_tpu(obj, memo: dict, storages: dict):
    """``obj`` (what ``torch.load`` returned) with every tensor moved to tpu: parameters
    stay parameters, ``requires_grad`` is kept, a tensor met twice moves once, and tensors
    of one CPU storage share one tpu storage (``storages``, ``_serialization.to_tpu``)."""
    if isinstance(obj, torch.Tensor):
        if id(obj) not in memo:
            t = _serialization.to_tpu(obj.detach(), storages)
            if isinstance(obj, torch.nn.Parameter):
                t = torch.nn.Parameter(t, requires_grad=obj.requires_grad)
            elif obj.requires_grad:
                t.requires_grad_(True)
            memo[id(obj)] = t
        return memo[id(obj)]
    if isinstance(obj, dict):
        out = type(obj)() if type(obj) is not dict else {}
        for k, v in obj.items():
            out[k] = _tree_to_tpu(v, memo, storages)
        if hasattr(obj, "_metadata"):  # a state_dict's OrderedDict
            out._metadata = obj._metadata
        return out
    if isinstance(obj, list):
        return [_tree_to_tpu(v, memo, storages) for v in obj]
    if isinstance(obj, tuple):
        items = [_tree_to_tpu(v, memo, storages) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    return obj


def _load_to_tpu() -> None:
    """``torch.load`` (and ``torch.serialization.load``): ``map_location="tpu"`` (or a
    tpu ``torch.device``) moves *storages* to the device and rebuilds each tensor on its
    storage (``set_``), and a tpu tensor has no byte storage; so such a load reads onto
    the CPU and moves each tensor to tpu. Every load runs in ``_serialization.loading``,
    so tpu tensors saved from one storage load onto one storage again."""
    import torch.serialization as ser

    orig = ser.load

    @functools.wraps(orig)
    def load(f, map_location=None, *args, **kwargs):
        with _serialization.loading():
            if not _is_tpu_location(map_location):
                return orig(f, map_location, *args, **kwargs)
            return _tree_to_tpu(orig(f, "cpu", *args, **kwargs), {}, {})

    ser.load = load
    torch.load = load


def _rebuild_tpu_tensors_sharing() -> None:
    """``torch._utils._rebuild_device_tensor_from_cpu_tensor`` (PyTorch's rebuild of a
    storage-less device tensor from a CPU one, which tpu tensors pickle as): its CPU tensor
    goes to tpu through ``_serialization.to_tpu``, so CPU tensors of one storage (a saved
    view and its base) load as tpu tensors of one storage, as CPU and CUDA tensors do.
    (``torch.load(weights_only=True)`` looks the function up by this name.)"""
    import torch._utils as tu

    orig = tu._rebuild_device_tensor_from_cpu_tensor

    # NOTE: wraps: pickles name it as torch's (module and qualname), so checkpoints stay
    # loadable without lazyrt.
    @functools.wraps(orig)
    def _rebuild_device_tensor_from_cpu_tensor(data, dtype, device, requires_grad):
        loc = tu._get_restore_location(device)
        if not (_is_tpu_location(loc) and isinstance(data, torch.Tensor)
                and data.device.type == "cpu" and data.dtype == dtype):
            return orig(data, dtype, device, requires_grad)
        t = _serialization.to_tpu(data)
        t.requires_grad = requires_grad
        return t

    tu._rebuild_device_tensor_from_cpu_tensor = _rebuild_device_tensor_from_cpu_tensor


_NO_STORAGE = ("lazyrt: a tpu storage holds no bytes of its own (its tensor's value lives in an "
               "XLA buffer; the storage has an identity, and reads and writes go through the "
               "tensor): {} is not supported for it; use tensor ops, e.g. "
               "torch.empty(n, dtype=torch.uint8, device='tpu')")


def _tpu_storage_guards() -> None:
    """``torch.UntypedStorage``: what would allocate a tpu storage through PyTorch's
    PrivateUse1 allocator, which a Python backend cannot register (``UntypedStorage(n,
    device="tpu")``, and through it a tpu storage's ``clone()``, ``TypedStorage(...,
    device="tpu")``; ``new()``), or touch its bytes in C++ (``byteswap``, ``_set_from_file``,
    ``_resize_with_addr_``), killed the process (SIGSEGV, torch 2.13). They raise instead.
    (``device`` is keyword-only in the constructor.)"""
    cls = torch.UntypedStorage
    orig_new = cls.__new__

    def __new__(cls_, *args, device=None, **kwargs):
        if device is not None and torch.device(device).type == "tpu":
            raise RuntimeError(_NO_STORAGE.format("allocating one"))
        if device is not None:
            kwargs["device"] = device
        return orig_new(cls_, *args, **kwargs)

    cls.__new__ = staticmethod(__new__)

    def guard(name):
        orig = compat.api(f"torch.UntypedStorage.{name}")
        if orig is None:  # a method this torch has not (``_resize_with_addr_`` before 2.13)
            compat.skip(f"patch tpu_storage_guards: UntypedStorage.{name}",
                        f"torch {compat.TORCH} has no UntypedStorage.{name}")
            return

        @functools.wraps(orig)
        def method(self, *args, **kwargs):
            if self.device.type == "tpu":
                raise RuntimeError(_NO_STORAGE.format(f"UntypedStorage.{name}"))
            return orig(self, *args, **kwargs)

        setattr(cls, name, method)

    for name in ("new", "_byteswap", "_set_from_file", "_resize_with_addr_", "resize_"):
        guard(name)


def _convolution_meta(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                      groups, benchmark, deterministic, cudnn_enabled, allow_tf32):
    """PyTorch's meta kernel of ``_convolution`` (torch 2.13's ``_meta_registrations``): that
    of ``convolution``."""
    return torch.ops.aten.convolution.default(input, weight, bias, stride, padding, dilation,
                                              transposed, output_padding, groups)


def _jit_trace_untraced_dispatch() -> None:
    """``torch.jit.trace`` / ``trace_module`` (``torch.jit._trace``): TorchScript's tracer
    records each op at the dispatcher's Tracer key, above lazyrt, but its thread-local
    state stays on inside lazyrt's dispatch, where Python size queries then return traced
    values (a conv's meta kernel failed: "cond must be a bool, but got a Tensor"). While a
    trace runs, ``TpuTensor.__torch_dispatch__`` runs each op with the tracing state off,
    as a C++ kernel runs; outside a trace nothing changes (no cost per op)."""
    import torch.jit
    import torch.jit._trace as jt

    get_state, set_state = torch._C._get_tracing_state, torch._C._set_tracing_state
    tracer = torch._C._parse_dispatch_key("Tracer")  # not in the DispatchKey enum in Python
    is_excluded = torch._C._dispatch_tls_is_dispatch_key_excluded
    set_excluded = torch._C._dispatch_tls_set_dispatch_key_excluded
    depth = [0]
    installed = []

    convolution, _convolution = torch.ops.aten.convolution.default, torch.ops.aten._convolution.default
    compat.fill_meta(_convolution, _convolution_meta, "convolution_meta")

    def untraced(dispatch):
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            state = get_state()
            if state is None:
                return dispatch(cls, func, types, args, kwargs)
            excluded = is_excluded(tracer)
            if func is convolution and len(args) == 9 and not kwargs:
                # NOTE: the tracer does not record `convolution` (its don't-record list) but
                # the `_convolution` it calls on the CPU: call that, with the key lifted.
                set_excluded(tracer, False)
                try:
                    return _convolution(*args, False, False, True, True)
                finally:
                    set_excluded(tracer, excluded)
            # NOTE: below the Tracer key the key is excluded, and the tracing state may be
            # set only where it is not: lift the exclusion around both changes.
            set_excluded(tracer, False)
            set_state(None)
            set_excluded(tracer, excluded)
            try:
                return dispatch(cls, func, types, args, kwargs)
            finally:
                set_excluded(tracer, False)
                set_state(state)
                set_excluded(tracer, excluded)

        return classmethod(__torch_dispatch__)

    def wrap(orig):
        @functools.wraps(orig)
        def traced(*args, **kwargs):
            if not depth[0]:
                installed.append(TpuTensor.__dict__["__torch_dispatch__"])
                TpuTensor.__torch_dispatch__ = untraced(installed[-1].__func__)
            depth[0] += 1
            try:
                return orig(*args, **kwargs)
            finally:
                depth[0] -= 1
                if not depth[0]:
                    TpuTensor.__torch_dispatch__ = installed.pop()

        return traced

    jt.trace, jt.trace_module = wrap(jt.trace), wrap(jt.trace_module)
    torch.jit.trace, torch.jit.trace_module = jt.trace, jt.trace_module


def _script_tensors(m):
    """The tensors a ScriptModule holds: parameters, buffers, attributes and the constants
    of its methods' graphs (a trace's captured tensors)."""
    yield from m.state_dict(keep_vars=True).values()
    for mod in m.modules():
        c = getattr(mod, "_c", None)
        if c is None:
            continue
        for name in c._method_names():
            for node in c._get_method(name).graph.nodes():
                if node.kind() == "prim::Constant" and node.hasAttribute("value") \
                        and node.kindOf("value") == "t":
                    yield node.t("value")


def _script_to_tpu(m):
    """A loaded ScriptModule's parameters and buffers moved to tpu in place. (Its
    ``.to("tpu")`` asserts: a loaded module's parameters come back from C++ as plain
    tensors, and ``Module._apply`` rebuilds Parameters for a device it cannot copy into.)"""
    with torch.no_grad():
        for mod in m.modules():
            for slots in (mod._parameters, mod._buffers):
                for name, t in list(slots.items()):
                    if t is not None:
                        slots[name] = t.detach().to("tpu").requires_grad_(t.requires_grad)
    return m


def _jit_save_load() -> None:
    """``torch.jit.save`` / ``torch.jit.load`` (``torch.jit._serialization``). Saving: the
    serializer reads each tensor's storage in C++, so every tpu tensor of the module gets its
    storage identity first (``TpuTensor.untyped_storage``), which it then copies to the host
    through ``set_`` (``_ops.storage.set_storage``). Loading onto tpu: TorchScript rebuilds each
    tensor by setting sizes and storage on a device TensorImpl in C++, which a tpu tensor
    cannot take; so ``map_location="tpu"`` loads onto the CPU and moves the module, and a
    load that would rebuild on tpu by itself (no ``map_location``) is refused by name."""
    import torch.jit
    import torch.jit._serialization as js

    save, load = js.save, js.load

    @functools.wraps(save)
    def jit_save(m, f, _extra_files=None):
        for t in _script_tensors(m):
            if isinstance(t, TpuTensor):
                compat.require("storage_swap_data_ptr", "torch.jit.save of tpu tensors")
                t.untyped_storage()
        return save(m, f, _extra_files)

    @functools.wraps(load)
    def jit_load(f, map_location=None, *args, **kwargs):
        if _is_tpu_location(map_location) or (map_location is None and _saved_on_tpu(f)):
            return _script_to_tpu(load(f, "cpu", *args, **kwargs))
        try:
            return load(f, map_location, *args, **kwargs)
        except (RuntimeError, NotImplementedError) as e:
            if map_location is None and "lazyrt" in str(e):
                raise RuntimeError(
                    "lazyrt: torch.jit.load cannot rebuild tpu tensors itself (TorchScript sets "
                    "sizes and storage on the device tensor in C++); load with "
                    "map_location='tpu' (lazyrt loads on the CPU, then moves the module) or "
                    "map_location='cpu'") from e
            raise

    js.save, js.load = jit_save, jit_load
    torch.jit.save, torch.jit.load = jit_save, jit_load


def _saved_on_tpu(f) -> bool:
    """Whether a TorchScript archive (a path or a seekable file) holds tensors saved on tpu
    (its pickles name their storages' locations): then a load with no ``map_location``
    rebuilds them on tpu as ``map_location="tpu"`` does; TorchScript's own rebuild of a tpu
    tensor in C++ raised, or (depending on what ran before in the process) made a module
    that failed when run. False where it cannot tell."""
    import zipfile

    try:
        pos = f.tell() if hasattr(f, "read") else None
        try:
            with zipfile.ZipFile(f) as z:
                return any(b"tpu" in z.read(n) for n in z.namelist() if n.endswith(".pkl"))
        finally:
            if pos is not None:
                f.seek(pos)
    except Exception:
        return False


def _dlpack_tpu() -> None:
    """DLPack of tpu tensors (``torch.utils.dlpack.to_dlpack``/``from_dlpack``,
    ``torch.asarray`` of a capsule): PyTorch's ``fromDLPack`` makes a plain tensor over
    the tpu storage's address (``at::from_blob``), which no tpu kernel can read (its next
    op failed: "Could not run 'aten::view' ... from the 'tpu' backend"). That tensor becomes
    the tpu tensor aliasing the same storage (``_ops.storage.over_storage``), so the result
    shares the original's storage and ``data_ptr`` as on other devices; ``asarray``'s other
    arguments (``dtype``, ``copy``, ``requires_grad``) then apply to it. Export stamps the
    tensor's storage identity first, so the capsule carries the address the import looks
    up."""
    import torch.utils.dlpack as dl

    from .._base.tensor import _stamped_storage
    from .._ops.storage import over_storage

    def as_tpu(t):
        if isinstance(t, torch.Tensor) and not isinstance(t, TpuTensor) and t.device.type == "tpu":
            return over_storage(t)
        return t

    orig_to, orig_from, orig_asarray = dl.to_dlpack, dl.from_dlpack, torch.asarray

    @functools.wraps(orig_to)
    def to_dlpack(tensor):
        if isinstance(tensor, TpuTensor):
            _stamped_storage(tensor)
        return orig_to(tensor)

    @functools.wraps(orig_from)
    def from_dlpack(ext_tensor, *args, **kwargs):
        if isinstance(ext_tensor, TpuTensor):
            _stamped_storage(ext_tensor)
        return as_tpu(orig_from(ext_tensor, *args, **kwargs))

    @functools.wraps(orig_asarray)
    def asarray(obj, *args, **kwargs):
        if type(obj).__name__ == "PyCapsule":
            t = orig_asarray(obj)
            if isinstance(t, torch.Tensor) and t.device.type == "tpu":
                return orig_asarray(as_tpu(t), *args, **kwargs)
            return orig_asarray(t, *args, **kwargs) if args or kwargs else t
        return orig_asarray(obj, *args, **kwargs)

    dl.to_dlpack, dl.from_dlpack = to_dlpack, from_dlpack
    torch.to_dlpack = to_dlpack
    torch.from_dlpack = from_dlpack
    torch.asarray = asarray
    # NOTE: ``with torch.device(d)`` gives ``device=d`` to the functions of this set, built
    # from ``torch.asarray`` on its first use: the builtin the wrapper calls must stay in it
    # whether it was built before this patch or after.
    constructors = compat.api("torch.utils._device._device_constructors")
    if constructors is None:
        compat.skip("patch dlpack_tpu: asarray under torch.device",
                    f"torch {compat.TORCH} has no torch.utils._device._device_constructors")
    else:
        constructors().add(orig_asarray)


PATCHES = (_load_to_tpu, _rebuild_tpu_tensors_sharing, _tpu_storage_guards,
           _jit_trace_untraced_dispatch, _jit_save_load, _dlpack_tpu)

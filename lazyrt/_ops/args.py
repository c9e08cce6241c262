"""ATen arguments, three ways: the per-call walk (values + cache key), the plan's template
(what the lowering gets back at trace time), and meta tensors (for PyTorch's meta kernels).

The walk is the hot path of every op: it appends each tensor input's value to ``vals``
and each runtime float to ``scal`` and returns the hashable key of the rest. A view input
is keyed by its chain and passes its *base* value: the op applies the view steps itself
(XLA fuses them), so views are never materialized on their own. A view at runtime
positions (``_exec.views.PosChain``: ``x[i]``) is keyed without them, and without its
storage offset (which moves with them): its positions go to ``scal`` as runtime ints, so
one plan serves every position (``_ops.positions``).
"""
from __future__ import annotations

import hashlib
import os

import torch

from .._base.tensor import TpuTensor, storage_extent
from .._exec.values import host_to_device
from .._exec.views import PosChain, apply_chain, chain_text

_META = torch.device("meta")


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


TSLOT = _Marker("<tensor>")  # template: a tensor input
FSLOT = _Marker("<float>")  # template: a runtime float
ISLOT = _Marker("<int>")  # template: a runtime int (``RuntimeInt``)
GSLOT = _Marker("<rng>")  # template: the PRNG key (from a runtime seed)
_B1 = _Marker("True")
_B0 = _Marker("False")
_FLOAT = float  # key marker of a runtime float

# Ops that take CPU tensors of any rank (everything else: 0-d CPU tensors only).
_ALLOW_CPU = {"copy_", "index", "index_put", "index_put_", "_index_put_impl_", "_to_copy"}


class RuntimeInt(int):
    """An int argument that is a runtime input of the plan, not a static argument (an "i"
    scalar): a symbolic int of a compiled graph (``_compile``), or a position of an eager
    op (``_ops.positions``). Its value is this call's (meta kernels get it); ``walk``
    keys it as ``int`` and passes the value as a runtime scalar."""

    __slots__ = ()


class SliceEnd(int):
    """A positional slice's ``end`` (``_ops.positions``): this call's end, and the slice's
    static ``length``, which the lowering takes when its start is a runtime value."""

    def __new__(cls, end: int, length: int):
        self = super().__new__(cls, end)
        self.length = length
        return self

    def __repr__(self):
        return f"<end +{self.length}>"


class TracingArgument(Exception):
    """A tracing tensor (fake or functional: ``torch.compile`` is tracing) met a real tpu
    tensor in one op; the dispatcher reruns the op for the tracer (``_dispatch``)."""


_TRACING_TYPES = ("FakeTensor", "FunctionalTensor")


def _cpu_input(entry, t: torch.Tensor, vals: list):
    if type(t).__name__ in _TRACING_TYPES:
        raise TracingArgument()
    if t.dim() != 0 and entry.packet not in _ALLOW_CPU:
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"tpu:0 and {t.device}! (when checking argument for {entry.name})")
    if t.device.type == "meta":
        raise NotImplementedError(f"lazyrt: {entry.name} got a meta tensor")
    vals.append(host_to_device(t))
    return ("cpu", tuple(t.shape), t.dtype)


def view_key(a: TpuTensor, ch, scal: list):
    """The key of view ``a`` (chain ``ch``); a positional chain's positions go to ``scal``."""
    if type(ch) is PosChain:
        scal.extend(ch.pos)
        sp = a._spec
        return ((sp[0], sp[1], sp[2]), ch.skey)
    return (a._spec, ch)


def walk(entry, a, vals: list, scal: list, dyn: bool):
    """The cache-key part of argument ``a``; collects its values into ``vals`` and (when
    ``dyn``: floats are runtime inputs) its floats into ``scal``."""
    tp = type(a)
    if tp is TpuTensor:
        vals.append(a._st.value)
        ch = a._chain
        if ch is None:
            return a._spec
        return view_key(a, ch, scal)
    if tp is float:
        if dyn:
            scal.append(a)
            return _FLOAT
        return (float, a)
    if tp is bool:
        return _B1 if a else _B0
    if tp is list or tp is tuple:
        return tuple([walk(entry, x, vals, scal, dyn) for x in a])
    if isinstance(a, torch.Tensor):
        return _cpu_input(entry, a, vals)
    if isinstance(a, torch.Generator):
        return None
    if tp is RuntimeInt:
        scal.append(a)
        return int
    return a


class ViewSlot:
    """Template: a tensor input that is a view, folded into the consuming op."""

    __slots__ = ("chain",)

    def __init__(self, chain):
        self.chain = chain

    def __repr__(self):
        return f"<view {chain_text(self.chain)}>"


def template(a, dyn: bool, fold: bool = True):
    """The plan's picture of argument ``a``: slots where runtime values go back in."""
    if isinstance(a, torch.Tensor):
        if fold and type(a) is TpuTensor and a._chain is not None:
            return ViewSlot(a._chain)
        return TSLOT
    if type(a) is float and dyn:
        return FSLOT
    if type(a) is RuntimeInt:
        return ISLOT
    if type(a) is list:
        return [template(x, dyn, fold) for x in a]
    if type(a) is tuple:
        return tuple(template(x, dyn, fold) for x in a)
    if isinstance(a, torch.Generator):
        return None
    return a


def rebuild(tpl, it_arr, it_sc):
    """Arguments for the lowering: ``tpl`` with its slots filled from the iterators."""
    if tpl is TSLOT:
        return next(it_arr)
    if tpl is FSLOT or tpl is ISLOT:
        return next(it_sc)
    if type(tpl) is ViewSlot:
        return apply_chain(tpl.chain, next(it_arr), it_sc=it_sc)
    if type(tpl) is list:
        return [rebuild(x, it_arr, it_sc) for x in tpl]
    if type(tpl) is tuple:
        return tuple(rebuild(x, it_arr, it_sc) for x in tpl)
    return tpl


def static_desc(tpl_args, tpl_kwargs) -> str:
    """The static arguments of a plan, short (trace text, error messages)."""
    parts = []
    for a in tpl_args:
        if a is TSLOT or (isinstance(a, list) and a and all(x is TSLOT for x in a)):
            continue
        parts.append(_short(a))
    for k, v in tpl_kwargs.items():
        if v is None or v is GSLOT:
            continue
        parts.append(f"{k}={_short(v)}")
    return ", ".join(parts)


def _short(a) -> str:
    s = repr(a)
    return s if len(s) <= 40 else s[:37] + "..."


def to_meta(a):
    """``a`` with every tensor replaced by a meta tensor of the same spec."""
    if isinstance(a, torch.Tensor):
        if isinstance(a, TpuTensor):
            shape, stride, dtype, off = a._spec
        else:
            shape, stride, dtype, off = tuple(a.shape), tuple(a.stride()), a.dtype, 0
            if a.dim() == 0:
                return torch.empty((), dtype=dtype, device=_META)
        if off == 0:
            return torch.empty_strided(shape, stride, dtype=dtype, device=_META)
        base = torch.empty(off + storage_extent(shape, stride), dtype=dtype, device=_META)
        return base.as_strided(shape, stride, off)
    if type(a) is list:
        return [to_meta(x) for x in a]
    if type(a) is tuple:
        return tuple(to_meta(x) for x in a)
    if isinstance(a, torch.device) and a.type == "tpu":
        return _META
    if isinstance(a, torch.Generator):
        return None
    if type(a) is RuntimeInt:
        return int(a)
    return a


def _ints(t) -> bool:
    return all(type(x) is int for x in t)


def _meta_own(a):
    if isinstance(a, torch.Tensor):
        if isinstance(a, TpuTensor):
            shape, stride, dtype, off = a._spec
        elif a.dim() == 0:
            return f"C0{a.dtype}"
        else:
            shape, stride, dtype, off = tuple(a.shape), tuple(a.stride()), a.dtype, 0
        if not (_ints(shape) and _ints(stride) and type(off) is int):
            return None  # symbolic sizes
        return f"T{shape}{stride}{dtype}{off}"
    if type(a) is RuntimeInt:
        return f"int:{int(a)}"
    if isinstance(a, torch.Generator):
        return "G"
    return _OTHER


def meta_text(a) -> str | None:
    """A stable text of what ``to_meta(a)`` hands a meta kernel (every tensor's spec, every
    other value by type and value), or None where a value has no stable text: then the
    meta kernel's result is not kept on disk (``_exec.diskcache.meta_specs``)."""
    return _stable_text(a, _meta_own)


def spec_of_meta(m: torch.Tensor) -> tuple:
    return (tuple(m.shape), tuple(m.stride()), m.dtype, m.storage_offset())


def arg(args, kwargs, name: str, pos: int):
    """The argument at schema position ``pos`` / keyword ``name``."""
    return args[pos] if pos < len(args) else kwargs.get(name)


# ---- signatures: a plan's program in lazyrt's own terms (``Prog.sig``) ------------------

_SIG_SCALARS = (int, float, bool, str, type(None))
_SIG_TORCH = (torch.dtype, torch.device, torch.memory_format, torch.layout)


_OTHER = object()  # an ``own`` function's answer: not one of mine


def _stable_text(a, own) -> str | None:
    """A stable text of ``a``: ``own(a)`` where it answers (not ``_OTHER``), else Python
    scalars, torch's dtype/device/layout/memory format, and lists, tuples and dicts of
    those, by type and value; None where some part has no stable text."""
    t = own(a)
    if t is not _OTHER:
        return t
    tp = type(a)
    if tp in _SIG_SCALARS:
        return f"{tp.__name__}:{a!r}"
    if isinstance(a, _SIG_TORCH):
        return f"{tp.__name__}:{a}"
    if tp is list or tp is tuple:
        parts = [_stable_text(x, own) for x in a]
        if any(p is None for p in parts):
            return None
        return ("[" if tp is list else "(") + ",".join(parts) + ("]" if tp is list else ")")
    if tp is dict:
        parts = {k: _stable_text(v, own) for k, v in a.items()}
        if any(v is None for v in parts.values()):
            return None
        return "{" + ",".join(f"{k}={v}" for k, v in sorted(parts.items())) + "}"
    return None


def _sig_own(a):
    if a is TSLOT or a is FSLOT or a is ISLOT or a is GSLOT or a is _B1 or a is _B0:
        return a.name
    if type(a) is ViewSlot:
        steps = []
        for s in a.chain:
            sig = s[0].prog.sig
            if sig is None:
                return None
            steps.append(f"{sig}:{s[1]}:{len(s[2]) if len(s) == 3 else -1}")
        return "view(" + ";".join(steps) + ")"
    if type(a) is SliceEnd:
        return f"end+{a.length}"
    return _OTHER


def _sig_of(a):
    """A stable text of template value ``a``, or None where it has no stable text."""
    return _stable_text(a, _sig_own)



_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STABLE_MODULES = ("lazyrt.", "kernels_pallas", "jax", "numpy", "builtins", "math")


def _lazyrt_code(fn, depth: int = 0) -> bool:
    """Whether ``fn`` is lazyrt's own code (its source is in ``source_key``): defined in
    lazyrt's package, closing over nothing but such functions, JAX's and NumPy's, and plain
    values. A user's function (``lazyrt.jax_op``, a lowering registered from outside)
    is not: its program is found by its traced text only."""
    code = getattr(fn, "__code__", None)
    if code is None or not code.co_filename.startswith(_PKG) or depth > 3:
        return False
    for cell in fn.__closure__ or ():
        try:
            v = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(v, (int, float, str, bool, type(None), torch.dtype)):
            continue
        if hasattr(v, "__code__"):
            if not _lazyrt_code(v, depth + 1):
                return False
        elif not (callable(v) and str(getattr(v, "__module__", "")).startswith(_STABLE_MODULES)):
            return False
    return True


def _closure_text(fn, depth: int = 0) -> str:
    """The plain values ``fn`` closes over (``_lazyrt_code`` allows only those and
    functions): two closures of one factory differ by them."""
    if depth > 3:
        return ""
    vals = []
    for cell in fn.__closure__ or ():
        try:
            v = cell.cell_contents
        except ValueError:
            continue
        vals.append(f"{v.__module__}.{v.__qualname__}{_closure_text(v, depth + 1)}"
                    if hasattr(v, "__code__") else repr(v) if not callable(v) else
                    f"{getattr(v, '__module__', '')}.{getattr(v, '__qualname__', repr(v))}")
    return f"[{','.join(vals)}]" if vals else ""


def signature(e, tpl_args, tpl_kwargs, in_avals, scalar_kinds, out_avals) -> str | None:
    """The program of a plan in lazyrt's own terms: the op and how it resolved (its
    lowering's name), the static arguments, the input and output avals, the runtime
    scalars' kinds. With the hash of lazyrt's source (``_exec.diskcache.source_key``) and
    the switches that lowerings read, it names the program's executable in the persistent
    cache; None where an argument has no stable text (then the traced text names it)."""
    a, kw = _sig_of(tpl_args), _sig_of(dict(tpl_kwargs))
    if a is None or kw is None:
        return None
    # NOTE: the function the plan runs (``e.fn``), not the registered lowering's: they
    # differ once an entry's function is replaced (``_control.invalidate_compiled``), and
    # a signature naming the lowering then named another program (a test's GELU-as-ReLU
    # executable, stored under GELU's signature, was loaded by later GELU plans).
    fn = e.fn
    if fn is None or not _lazyrt_code(fn):
        return None
    name = f"{fn.__module__}.{fn.__qualname__}{_closure_text(fn)}"
    text = (f"{e.name}|{e.resolution.how}|{name}|{a}|{kw}|{in_avals}|{scalar_kinds}|"
            f"{out_avals}")
    return hashlib.sha256(text.encode()).hexdigest()[:32]

"""Your own JAX (or Pallas) function as a torch op on tpu: ``lazyrt.jax_op``.

``op = jax_op("mylib::rms_norm", fn, static=("eps",))`` registers ``torch.ops.mylib.rms_norm``
(a ``torch.library.custom_op``) and returns a callable over tpu tensors:

* the op's fake (meta) kernel takes shapes and dtypes from ``jax.eval_shape(fn)``;
* on tpu the op is a row of lazyrt's lowering table (``fn`` itself), so it runs as every
  ATen op does: strict compiles it once per signature (one cached executable), defer
  records it as ONE node of the pending trace (fused with its neighbours at the flush),
  and ``torch.compile`` keeps it as one node of the graph (a custom op with a fake kernel
  is no graph break), lowered inside the graph's one program;
* autograd: ``jax.vjp(fn)`` by default, or ``backward(grads, *args)`` (a JAX function
  returning one cotangent, or None, per tensor argument); either way the backward is a
  second op ``mylib::rms_norm_bwd``, lowered the same way;
* ``in_specs``/``out_specs`` (``jax.sharding.PartitionSpec``s) with ``mesh``: ``fn`` runs
  under ``shard_map`` on that mesh, per shard;
* a JAX exception raised by ``fn`` names the op and the user's call site; a CPU tensor
  among the arguments gets PyTorch's device-mismatch error;
* ``donate``: arguments the caller gives up, donated to XLA (``_donating``).

Arguments of ``fn``: every parameter not named in ``static`` is a tensor (a ``jax.Array``
inside ``fn``); static parameters are Python values (int, float, bool, str, or a
list/tuple of ints or floats; annotate them or give a default so the schema knows the
type) and each distinct value compiles its own program.
"""
from __future__ import annotations

import inspect
import sys
import weakref

import jax
import torch

from .._base import dtypes as _dtypes
from .._base import memory
from .._base.ir import Pending, Prog
from .._base.source import user_line
from .._base.tensor import TpuTensor
from .._exec import defer as _defer
from .._exec.values import new_tensor, run
from ..lowering._registry import LOWERINGS, Lowering
from .handlers import functional, plan_for
from .resolve import set_special

__all__ = ["jax_op"]

_SCALAR_TYPES = {bool: "bool", int: "int", float: "float", str: "str"}
_NAMED = {"bool": "bool", "int": "int", "float": "float", "str": "str"}


def _static_type(p: inspect.Parameter, opname: str) -> str:
    ann = p.annotation
    if isinstance(ann, str) and p.default is None:  # "float | None", "Optional[int]"
        base = ann.replace(" ", "").replace("|None", "").replace("Optional[", "").rstrip("]")
        if base in _NAMED:
            return _NAMED[base] + "?"
    if isinstance(ann, str):
        t = _NAMED.get(ann.replace("builtins.", ""))
        if t is None and ann.replace(" ", "") in ("tuple[int,...]", "list[int]", "Sequence[int]"):
            t = "int[]"
        if t is None and ann.replace(" ", "") in ("tuple[float,...]", "list[float]",
                                                  "Sequence[float]"):
            t = "float[]"
        if t is not None:
            return t
    elif ann in _SCALAR_TYPES:
        return _SCALAR_TYPES[ann]
    d = p.default
    if type(d) in _SCALAR_TYPES:
        return _SCALAR_TYPES[type(d)]
    if isinstance(d, (tuple, list)) and d:
        if all(type(x) is int for x in d):
            return "int[]"
        if all(type(x) in (int, float) for x in d):
            return "float[]"
    raise TypeError(
        f"lazyrt.jax_op {opname}: static argument '{p.name}' needs a type: annotate it "
        f"(int, float, bool, str, list[int], list[float]) or give it a default")


def _default_text(v) -> str:
    if v is None:
        return "None"
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(repr(x) for x in v) + "]"
    if isinstance(v, str):
        return '"' + v + '"'
    return repr(v)


def _pspec(s):
    """A partition spec: ``PartitionSpec``, a tuple of axis names / None (torch_xla's form),
    or a list/tuple of those (several outputs, a list of grads)."""
    from jax.sharding import PartitionSpec as P

    if s is None or isinstance(s, P):
        return s if s is not None else P()
    if isinstance(s, list) or (isinstance(s, tuple) and s and all(
            isinstance(x, (P, list)) or (isinstance(x, tuple) and x and not all(
                isinstance(y, str) for y in x)) for x in s)):
        return type(s)(_pspec(x) for x in s)
    return P(*s)


class _Signature:
    """Which parameters of ``fn`` are tensors and which static, and the op's schema."""

    def __init__(self, fn, static, opname: str):
        sig = inspect.signature(fn)
        self.names = []
        self.tensor = []
        parts = []
        static = set(static)
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"lazyrt.jax_op {opname}: *args/**kwargs are not supported; "
                                "name every argument")
            self.names.append(p.name)
            if p.name in static:
                t = _static_type(p, opname)
                self.tensor.append(False)
                txt = f"{t} {p.name}"
                if p.default is not p.empty:
                    txt += "=" + _default_text(p.default)
                parts.append(txt)
            elif p.default is None:
                self.tensor.append(True)
                parts.append(f"Tensor? {p.name}=None")
            elif p.default is p.empty:
                self.tensor.append(True)
                parts.append(f"Tensor {p.name}")
            else:
                raise TypeError(f"lazyrt.jax_op {opname}: '{p.name}' has a default, so it must "
                                "be static (static=...) or an optional tensor (default None)")
        unknown = static - set(self.names)
        if unknown:
            raise TypeError(f"lazyrt.jax_op {opname}: static names no parameter: "
                            f"{sorted(unknown)}")
        self.args_text = "(" + ", ".join(parts) + ")"
        self.sig = sig


def _live(args, mask) -> tuple:
    """Which arguments are tensors in this call (an optional tensor given as None is not)."""
    return tuple(t and a is not None for a, t in zip(args, mask))


def _static_value(v):
    return tuple(v) if isinstance(v, list) else v


def _raise_named(opname: str, e: Exception, hint: str = ""):
    """Re-raise ``e`` (from the user's JAX function) naming the op and the user's line."""
    line = user_line(3)
    where = (f"op called at {line}" if line != "<unknown>" else
             "in the backward pass, on autograd's thread")
    msg = f"lazyrt.jax_op {opname}: {type(e).__name__}: {e}{hint}\n  ({where})"
    try:
        new = type(e)(msg)
    except Exception:  # an exception type with a different constructor
        new = RuntimeError(msg)
    raise new.with_traceback(e.__traceback__) from e


def _flat_outputs(out, n: int, opname: str) -> tuple:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    if len(outs) != n:
        raise ValueError(f"lazyrt.jax_op {opname}: the function returned {len(outs)} "
                         f"arrays, num_outputs={n} declared")
    return tuple(outs)


def _returns_text(n: int) -> str:
    return "Tensor" if n == 1 else "(" + ", ".join(["Tensor"] * n) + ")"


def _sharded(fn, mesh, in_specs, out_specs, tensor_mask):
    """``fn`` under ``shard_map`` over its tensor arguments (statics closed over)."""
    if mesh is None:
        return fn
    from jax.sharding import PartitionSpec as P

    mesh = getattr(mesh, "jax_mesh", mesh)  # a lazyrt.distributed.Mesh or a jax Mesh

    try:
        from jax import shard_map
    except ImportError:  # older JAX
        from jax.experimental.shard_map import shard_map

    def run(*args):
        live = _live(args, tensor_mask)
        statics = {i: a for i, a in enumerate(args) if not live[i]}
        arrays = [a for i, a in enumerate(args) if live[i]]
        present = [live[i] for i, t in enumerate(tensor_mask) if t]

        def inner(*arrs):
            it = iter(arrs)
            full = [statics[i] if i in statics else next(it) for i in range(len(args))]
            return fn(*full)

        ins = tuple(_pspec(s) for s, p in zip(in_specs, present) if p) \
            if in_specs is not None else tuple(P() for _ in arrays)
        outs = (out_specs(present) if callable(out_specs) else _pspec(out_specs)
                if out_specs is not None else P())
        return shard_map(inner, mesh=mesh, in_specs=ins, out_specs=outs)(*arrays)

    return run


def jax_op(name: str, fn, *, static=(), donate=(), backward=None, num_outputs: int = 1,
           mesh=None, in_specs=None, out_specs=None):
    """Register the JAX function ``fn`` as the torch op ``name`` ("ns::op"); returns the
    op (``torch.ops.ns.op``: arguments by position or name, static defaults from the schema).
    Module docstring: the rest.

    ``donate``: names of tensor arguments whose buffers the op may reuse for its results
    (``_donating``): the caller gives them up, and reading one afterwards raises.
    """
    if "::" not in name:
        raise ValueError(f"lazyrt.jax_op: name must be 'namespace::op', got {name!r}")
    ns, short = name.split("::", 1)
    sig = _Signature(fn, static, name)
    bad = [d for d in donate if d not in sig.names or not sig.tensor[sig.names.index(d)]]
    if bad:
        raise TypeError(f"lazyrt.jax_op {name}: donate names no tensor argument: {bad}")
    mask = tuple(sig.tensor)
    body = _sharded(fn, mesh, in_specs, out_specs, mask)
    n_out = num_outputs

    schema = sig.args_text + " -> " + _returns_text(n_out)
    lib = _library(ns)
    lib.define(short + schema)
    op = getattr(getattr(torch.ops, ns), short).default

    def run_fn(*args):
        full = [a if t else _static_value(a) for a, t in zip(args, _live(args, mask))]
        try:
            out = body(*full)
        except Exception as e:  # re-raised with the op's name
            _raise_named(name, e)
        outs = _flat_outputs(out, n_out, name)
        return outs[0] if n_out == 1 else outs

    run_fn.__name__ = run_fn.__qualname__ = f"jax_op[{name}]"
    LOWERINGS[op] = Lowering(op, run_fn, static_floats=True)

    def fake(*args):
        live = _live(args, mask)
        abstract = [jax.ShapeDtypeStruct(tuple(a.shape), _dtypes.to_jax(a.dtype))
                    for a, t in zip(args, live) if t]
        dev = next((a.device for a, t in zip(args, live) if t), torch.device("tpu"))

        def tensors_only(*arrs):  # statics stay Python values (eval_shape traces leaves)
            it = iter(arrs)
            return run_fn(*[next(it) if t else a for a, t in zip(args, live)])

        with jax.enable_x64(True):
            out = jax.eval_shape(tensors_only, *abstract)
        outs = out if n_out > 1 else (out,)
        res = tuple(torch.empty(o.shape, dtype=_dtypes.to_torch(o.dtype), device=dev)
                    for o in outs)
        return res[0] if n_out == 1 else res

    lib._register_fake(short, fake)
    if donate:
        set_special(op, _donating(tuple((sig.names.index(d), d) for d in donate)))
    _register_backward(lib, ns, short, op, fn, backward, sig, mask, n_out, mesh, in_specs,
                       out_specs)
    return getattr(getattr(torch.ops, ns), short)


_LIBS: dict[str, torch.library.Library] = {}
# plan -> {donated input positions: its donating Prog}
_DONATING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _donating(declared: tuple):
    """The handler of an op with donated arguments (``declared``: (position, name) pairs).

    A donated argument that is a whole tensor (not a view), passed once, in a call whose
    inputs need no grad (an autograd link would save them for its backward) is
    handed to XLA as donated: strict compiles the op's executable with the buffer donated
    (XLA may write a result into it) and the array is deleted by the call; defer marks it
    donated to the flush's program. Either way reading the tensor afterwards raises
    (``Array has been deleted``). Everything else runs as a plain call."""

    def handler(e, args, kwargs):
        # NOTE: an autograd link saves the op's inputs for its backward (and runs the op
        # under no_grad, so grad mode says nothing here): nothing is given up when any
        # input requires grad
        if any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return functional(e, args, kwargs)
        plan, vals, scal = plan_for(e, args, kwargs)
        idx = []
        for pos, name in declared:
            t = args[pos] if pos < len(args) else kwargs.get(name)
            if type(t) is not TpuTensor or t._chain is not None:
                continue
            v = t._st.value
            at = [j for j, x in enumerate(vals) if x is v]
            if len(at) == 1:  # passed once: a buffer passed twice cannot be given up
                idx.append(at[0])
        if not idx:
            return functional(e, args, kwargs)
        idx = tuple(sorted(idx))
        progs = _DONATING.setdefault(plan, {})
        prog = progs.get(idx)
        if prog is None:
            p = plan.prog
            prog = progs[idx] = Prog(p.name, p.fn, p.scalar_kinds, p.out_avals,
                                     desc=f"{p.desc}, donated inputs {idx}", op=p.op)
            prog.donate = idx
        outs = run(prog, vals, scal)
        given = [vals[j] for j in idx if type(vals[j]) is not Pending]
        if type(outs[0]) is Pending:
            _defer.current().declared.update(id(a) for a in given)
        elif given:
            memory.untrack(given)
        res, _ = plan.layout.wrap_fresh(outs, new_tensor)
        return res[0] if e.n_returns == 1 else tuple(res)

    return handler


def _library(ns: str) -> torch.library.Library:
    lib = _LIBS.get(ns)
    if lib is None:
        lib = _LIBS[ns] = torch.library.Library(ns, "FRAGMENT")
    return lib


def _differentiable(a) -> bool:
    return isinstance(a, torch.Tensor) and (a.is_floating_point() or a.is_complex())


def _register_backward(lib, ns, short, op, fn, backward, sig, mask, n_out, mesh, in_specs,
                       out_specs):
    """The backward op ``ns::short_bwd(*args, Tensor[] grads) -> Tensor[]`` (one gradient
    per tensor argument given, None optional ones skipped; zeros where the argument needs
    none) and its autograd link."""
    bname = short + "_bwd"
    opname = f"{ns}::{bname}"
    lib.define(bname + sig.args_text[:-1] + (", " if sig.names else "")
               + "Tensor[] grads) -> Tensor[]")
    bop = getattr(getattr(torch.ops, ns), bname).default

    if backward is None:
        def grads_fn(grads, *args):
            pos = [i for i, t in enumerate(_live(args, mask)) if t]

            def f(*arrs):
                full = list(args)
                for i, a in zip(pos, arrs):
                    full[i] = a
                return _flat_outputs(fn(*full), n_out, f"{ns}::{short}")

            _, vjp = jax.vjp(f, *[args[i] for i in pos])
            return vjp(tuple(grads))
    else:
        def grads_fn(grads, *args):
            out = backward(grads[0] if n_out == 1 else tuple(grads), *args)
            out = out if isinstance(out, (tuple, list)) else (out,)
            # the user returns one per declared tensor argument; drop the absent ones
            if len(out) == sum(mask):
                declared = [a for a, t in zip(args, mask) if t]
                out = [g for g, a in zip(out, declared) if a is not None]
            return out

    bin_specs = bout_specs = None
    if mesh is not None:
        from jax.sharding import PartitionSpec as P

        ins = tuple(in_specs) if in_specs is not None else tuple(P() for t in mask if t)
        outs = out_specs if out_specs is not None else P()
        outs = list(outs) if n_out > 1 else [outs]
        bin_specs = (*ins, outs)

        def bout_specs(present):  # one gradient per tensor argument given
            return tuple(_pspec(s) for s, p in zip(ins, present) if p)
    body = _sharded(lambda *a: grads_fn(a[-1], *a[:-1]), mesh, bin_specs, bout_specs,
                    mask + (True,))

    def run_bwd(*args):
        *rest, grads = args
        live = _live(rest, mask)
        full = [a if t else _static_value(a) for a, t in zip(rest, live)]
        try:
            gs = body(*full, list(grads))
        except Exception as e:  # re-raised with the op's name
            _raise_named(opname, e, "" if backward is not None else (
                "\n  (the default backward is jax.vjp of the function; a pallas_call has no "
                "automatic derivative: pass backward=, or give fn a jax.custom_vjp)"))
        gs = list(gs)
        tensors = [a for a, t in zip(full, live) if t]
        if len(gs) != len(tensors):
            raise ValueError(f"lazyrt.jax_op {ns}::{short}: backward returned {len(gs)} "
                             f"gradients for {len(tensors)} tensor arguments")
        return [jax.numpy.zeros(a.shape, a.dtype) if g is None or g.dtype == jax.dtypes.float0
                else g.astype(a.dtype) for g, a in zip(gs, tensors)]

    run_bwd.__name__ = run_bwd.__qualname__ = f"jax_op[{opname}]"
    LOWERINGS[bop] = Lowering(bop, run_bwd, static_floats=True)

    def fake_bwd(*args):
        *rest, _grads = args
        return [torch.empty_like(a) for a, t in zip(rest, _live(rest, mask)) if t]

    lib._register_fake(bname, fake_bwd)

    def setup_context(ctx, inputs, output):
        live = ctx.live = _live(inputs, mask)
        ctx.save_for_backward(*[a for a, t in zip(inputs, live) if t])
        ctx.statics = [None if t else a for a, t in zip(inputs, live)]
        ctx.need = [_differentiable(a) for a, t in zip(inputs, live) if t]

    def bwd(ctx, *grads):
        live = ctx.live
        saved = iter(ctx.saved_tensors)
        full = [next(saved) if t else s for s, t in zip(ctx.statics, live)]
        res = iter(bop(*full, list(grads)))
        need = iter(ctx.need)
        return tuple((g if next(need) else None) if t else None
                     for t, g in ((t, next(res) if t else None) for t in live))

    torch.library.register_autograd(f"{ns}::{short}", bwd, setup_context=setup_context,
                                    lib=lib)
    return bop


def pallas_module():
    """``torch.tpu.pallas``: TorchTPU's name for this API."""
    m = type(sys)("torch.tpu.pallas")
    m.jax_op = jax_op
    m.__doc__ = "TorchTPU's Pallas/JAX custom-op API on lazyrt: jax_op (lazyrt.jax_op)."
    return m


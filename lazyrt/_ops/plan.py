"""Plans: one per (op, input signature, static arguments), built once and cached.

A plan knows the op's output specs (from PyTorch's meta kernel, so bad input raises
PyTorch's own error at the op; from the lowering's abstract shapes where the meta
kernel is missing or broken), its ``OutputLayout``, and its ``Prog``: the lowering
with the static arguments bound and the outputs cast to PyTorch's dtypes. Building a
plan also traces the lowering abstractly once, so a lowering that cannot take these
inputs fails here, at the op, in every mode (never later inside a defer flush).

Running an op is then ``plan_for`` (walk the arguments, look the plan up) and
``_values.run(plan.prog, vals, scal)``.
"""
from __future__ import annotations

import threading
import warnings

import jax
import jax.extend.core
import jax.numpy as jnp
import torch

from .._base import dtypes as _dtypes
from .._base import rng as _rng
from .._base.config import config
from .._base.ir import Prog
from .._base.tensor import TpuTensor, contiguous_spec
from .._exec import diskcache as _diskcache
from . import flat_draws as _flat_draws
from . import narrow as _narrow
from . import value_ints as _value_ints
from .args import (
    GSLOT,
    RuntimeInt,
    arg,
    meta_text,
    rebuild,
    signature,
    spec_of_meta,
    static_desc,
    template,
    to_meta,
    view_key,
    walk,
)

_C32 = _narrow.C32  # complex32: its operands are rounded (``narrow.round_operands``)

_X64 = jax.enable_x64
_INSERT_LOCK = threading.Lock()


class OutputLayout:
    """Where an op's values go. THE rule, written once: a plan's flat outputs are its
    fresh outputs (``Tensor[]`` expanded, ``None`` returns skipped), then the new value
    of every mutated argument (lists expanded, ``None`` arguments skipped)."""

    __slots__ = ("fresh", "kinds", "mut", "mut_specs", "flat_specs", "n_fresh", "n_returns",
                 "single")

    def __init__(self, entry, fresh: list, kinds: list, mut_specs: list):
        self.fresh = fresh  # per fresh return: spec, list of specs, None, or a non-tensor
        self.kinds = kinds  # per fresh return: "T", "TL" or "S"
        self.mut = entry.mut
        self.mut_specs = mut_specs  # per mutated argument: spec, list of specs/None, or None
        self.n_fresh = len(fresh)
        self.n_returns = entry.n_returns
        flat = []
        for s, k in zip(fresh, kinds):
            if k == "TL":
                flat.extend(s)
            elif k == "T" and s is not None:
                flat.append(s)
        for ms, (_, _, is_list) in zip(mut_specs, self.mut):
            if is_list:
                flat.extend(x for x in ms if x is not None)
            elif ms is not None:
                flat.append(ms)
        self.flat_specs = flat
        # the common case, wrapped without a loop: one fresh tensor, nothing mutated
        self.single = fresh[0] if (kinds == ["T"] and not self.mut and entry.n_returns == 1
                                   and fresh[0] is not None) else None

    def flatten(self, res) -> list:
        """The lowering's result (see ``lowering._registry``) as the flat output list."""
        if self.mut:
            if self.n_fresh == 0 and len(self.mut) == 1:
                res = (res,)  # the bare new value of the one mutated argument
            fr, mu = res[:self.n_fresh], res[self.n_fresh:]
        else:
            fr = (res,) if self.n_returns == 1 else tuple(res)
            mu = ()
        out = []
        for r, k in zip(fr, self.kinds):
            if k == "TL":
                out.extend(r)
            elif k == "T" and r is not None:
                out.append(r)
        for r, ms, (_, _, is_list) in zip(mu, self.mut_specs, self.mut):
            if ms is None:
                continue
            if is_list:
                out.extend(x for x, s in zip(r, ms) if s is not None)
            else:
                out.append(r)
        return out

    def wrap_fresh(self, outs, make) -> tuple[list, int]:
        """The fresh returns as tensors (``make(value, spec)``) and the index of the first
        mutated-argument value in ``outs``."""
        res = []
        i = 0
        for s, k in zip(self.fresh, self.kinds):
            if k == "TL":
                res.append([make(outs[i + j], sp) for j, sp in enumerate(s)])
                i += len(s)
            elif k == "T":
                if s is None:
                    res.append(None)
                else:
                    res.append(make(outs[i], s))
                    i += 1
            else:
                res.append(s)
        return res, i

    def write_back(self, args, kwargs, outs, i: int, write) -> list:
        """``write(tensor, value)`` for each mutated argument, values from ``outs[i:]``;
        returns the mutated arguments."""
        muts = []
        for (name, pos, is_list), ms in zip(self.mut, self.mut_specs):
            m = arg(args, kwargs, name, pos)
            muts.append(m)
            if ms is None:
                continue
            if is_list:
                for t, s in zip(m, ms):
                    if s is not None:
                        write(t, outs[i])
                        i += 1
            else:
                write(m, outs[i])
                i += 1
        return muts


class Plan:
    __slots__ = ("entry", "name", "prog", "raw", "layout", "in_avals", "resize", "__weakref__")

    @property
    def out_specs(self) -> list:
        return self.layout.fresh


def meta_run(e, args, kwargs):
    """Run the op's meta kernel on meta copies of the arguments."""
    margs = to_meta(list(args))
    mkw = {k: to_meta(v) for k, v in kwargs.items()}
    if e.random and "generator" in mkw:
        mkw["generator"] = None
    return e.op(*margs, **mkw), margs, mkw


def _mut_specs(e, args, kwargs) -> list:
    out = []
    for name, pos, is_list in e.mut:
        a = arg(args, kwargs, name, pos)
        if is_list:
            out.append([x._spec if x is not None else None for x in a])
        else:
            out.append(a._spec if a is not None else None)
    return out


def _specs_from_meta(e, mout, margs, mkw, mut_specs):
    # out= tensors PyTorch resizes (``resize_output``: the meta kernel did it to the meta
    # copies, with PyTorch's warning): their new specs replace the old in ``mut_specs``.
    resize = []
    for k, ((name, pos, is_list), ms) in enumerate(zip(e.mut, mut_specs)):
        ma = arg(margs, mkw, name, pos)
        if is_list or ma is None or ms is None:
            continue
        if tuple(ma.shape) != ms[0]:
            new = (tuple(ma.shape), tuple(ma.stride()), ms[2], ms[3])
            mut_specs[k] = new
            resize.append((name, pos, new))
    rets = mout if e.n_returns != 1 else (mout,)
    fresh, kinds = [], []
    for r, kind, alias in zip(rets if e.n_returns else (), e.ret_kinds, e.ret_alias):
        if alias >= 0:
            continue
        if kind == "TL":
            fresh.append([spec_of_meta(m) for m in r])
        elif kind == "T":
            fresh.append(spec_of_meta(r) if r is not None else None)
        else:
            fresh.append(r)
        kinds.append(kind)
    return fresh, kinds, tuple(resize) or None


def _specs_from_lowering(e, call, vals, scal):
    """Output specs from the lowering's abstract shapes (contiguous)."""
    with _X64(True):
        shaped = jax.eval_shape(call, *vals, *[0 if type(x) is RuntimeInt else 0.0 for x in scal],
                                *([0] if e.random else []))
    if not isinstance(shaped, (tuple, list)) or e.n_returns == 1:
        shaped = (shaped,)
    kinds = [k for k, a in zip(e.ret_kinds, e.ret_alias) if a < 0]
    fresh = []
    for s, kind in zip(shaped[:len(kinds)], kinds):
        if kind == "TL":
            fresh.append([contiguous_spec(x.shape, _dtypes.to_torch(x.dtype)) for x in s])
        elif s is None:
            fresh.append(None)
        else:
            fresh.append(contiguous_spec(s.shape, _dtypes.to_torch(s.dtype)))
    return fresh, kinds


# Ops whose meta kernel rejects inputs their CPU kernel takes (torch 2.13: ``_grouped_mm``'s
# meta checks the CUDA kernel's bfloat16-only rule; CPU takes float32): their output shapes
# come from the lowering.
_META_STRICTER_THAN_CPU = frozenset({"aten::_grouped_mm"})


def _meta_or_none(e, args, kwargs):
    """The meta kernel's ``(outputs, meta args, meta kwargs)``, or None without one."""
    if e.op._schema.name in _META_STRICTER_THAN_CPU:
        return None
    try:
        if e.out_names:
            # out= resizing: PyTorch's warning is the handler's, once per resize
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="An output with one or more elements")
                mout, margs, mkw = meta_run(e, args, kwargs)
        else:
            mout, margs, mkw = meta_run(e, args, kwargs)
    except (NotImplementedError, AttributeError) as ex:
        # No meta kernel (or a broken one, e.g. an AttributeError on a None bias):
        # derive output shapes from the lowering itself.
        if isinstance(ex, NotImplementedError) and "meta" not in str(ex).lower():
            raise
        return None
    return mout, margs, mkw


def _meta_text(e, args, kwargs) -> str | None:
    """What an ATen op's meta kernel reads (``args.meta_text``), or None: another
    namespace's meta (fake) kernel is a user's code, which no key covers."""
    if e.op.namespace != "aten":
        return None
    a, kw = meta_text(list(args)), meta_text([(k, v) for k, v in kwargs.items()])
    return None if a is None or kw is None else f"{e.op}|{a}|{kw}"


def _output_specs(e, args, kwargs, call, vals, scal):
    """``(fresh, kinds, resize, mut_specs)`` (``OutputLayout``'s parts, out= resizes) from
    the meta kernel, or from the lowering where it has none. The meta kernel's are kept on
    disk under its inputs' text, and a later process takes them from there without running
    it (it gave them for exactly these meta inputs; one that warned is not kept)."""
    name, kept = _diskcache.meta_specs(_meta_text(e, args, kwargs))
    if kept is not None:
        fresh, kinds, resize, mut_specs = kept
        return fresh, kinds, resize, list(mut_specs)
    mut_specs = _mut_specs(e, args, kwargs)
    with warnings.catch_warnings(record=True) as caught:  # under the caller's filters
        meta = _meta_or_none(e, args, kwargs)
    for w in caught:  # to the caller's filters, as if not caught
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    if meta is None:
        fresh, kinds = _specs_from_lowering(e, call, vals, scal)
        return fresh, kinds, None, mut_specs
    fresh, kinds, resize = _specs_from_meta(e, *meta, mut_specs)
    if name is not None and not caught:
        _diskcache.note_meta(name, (fresh, kinds, resize, tuple(mut_specs)))
    return fresh, kinds, resize, mut_specs


def _inplace_cast_check(e, args, kwargs) -> None:
    """An in-place pointwise op (``x.mul_(y)``): ATen's TensorIterator computes in the
    promoted type of its operands and refuses a result its ``self`` cannot hold ("result
    type Float can't be cast to the desired output type Char"); the meta kernels of the
    in-place ops cast silently (int8 ``mul_`` by a float tensor ran) or word it otherwise.
    Checked once per plan (a plan exists only for inputs that passed)."""
    f = e.functional
    if (f is None or not e.packet.endswith("_") or not args
            or torch.Tag.pointwise not in e.op.tags or not isinstance(args[0], torch.Tensor)):
        return
    try:
        res = f(*to_meta(list(args)), **{k: to_meta(v) for k, v in kwargs.items()})
    except Exception:  # the op's own checks raise at its plan, as before
        return
    if isinstance(res, torch.Tensor):
        _dtypes.check_result_cast(res.dtype, args[0].dtype)


MAX_DIMS = 64


def check_dims(n: int) -> None:
    """A tpu tensor holds at most 64 dims (XLA's and NumPy's arrays): PyTorch's error for a
    tensor past its own kernels' limit, with lazyrt's reason (CPU holds such a tensor)."""
    if n > MAX_DIMS:
        raise RuntimeError(f"only tensors with up to {MAX_DIMS} dims are supported\n  (lazyrt: a "
                           f"tpu tensor holds at most {MAX_DIMS} dims, as XLA's arrays; this "
                           f"result has {n})")


def make_plan(e, args, kwargs, vals: list, scal: list, fold: bool = True) -> Plan:
    dyn = not e.static_floats
    random = e.random
    tpl_args = template(list(args), dyn, fold)
    tpl_kwargs = {k: template(v, dyn, fold) for k, v in kwargs.items()}
    if random:
        tpl_kwargs["generator"] = GSLOT
    n_arr = len(vals)
    scalar_kinds = tuple("i" if type(s) is RuntimeInt else "f" for s in scal) + (
        ("i",) if random else ())
    c32 = _narrow.computes_in_c32(args)
    call = _caller(e, tpl_args, tpl_kwargs, n_arr, c32)
    fresh, kinds, resize, mut_specs = _output_specs(e, args, kwargs, call, vals, scal)
    layout = OutputLayout(e, fresh, kinds, mut_specs)
    out_avals = tuple((s[0], _dtypes.to_jax(s[2])) for s in layout.flat_specs)
    check_dims(max((len(s[0]) for s in out_avals), default=0))
    narrow = tuple(s[2] if s[2] in _dtypes.WIDENED else None for s in layout.flat_specs)

    def raw(*flat):
        return layout.flatten(call(*flat))

    def prog_fn(*flat):
        return _fixed(e, raw(*flat), out_avals, narrow)

    plan = Plan()
    plan.entry = e
    plan.name = e.name
    plan.layout = layout
    plan.raw = raw
    # out= tensors to resize before each write-back: ``(name, pos, new spec)``
    plan.resize = resize
    plan.in_avals = tuple((tuple(v.shape), jnp.dtype(v.dtype)) for v in vals)
    desc = static_desc(tpl_args, tpl_kwargs)
    # NOTE: a complex32 output is a complex64 aval rounded at the end: its torch dtype is in
    # the signature, or the disk cache served complex32's program (rounding) to complex64's
    # (and so is complex32 math: its complex64 inputs' avals do not tell it)
    sig = signature(e, tpl_args, tpl_kwargs, plan.in_avals, scalar_kinds,
                    (out_avals, narrow, c32) if any(narrow) or c32 else out_avals)
    # NOTE: a plan this lazyrt checked in an earlier process (same signature, source and
    # switches) is not traced again: the persistent cache keeps its verdict
    const = None if sig is None else _diskcache.plan_checked(sig)
    if const is None:
        jaxpr = _check_abstractly(e, prog_fn, vals, scalar_kinds, desc)
        const = not random and not _reads_arrays(jaxpr, n_arr)
        if sig is not None:
            _diskcache.note_plan(sig, const)
    plan.prog = Prog(e.packet, prog_fn, scalar_kinds, out_avals, desc=desc, op=e.op, const=const)
    plan.prog.sig = sig
    if random:
        plan.prog.flat = _flat_draws.maker(e, tpl_args, tpl_kwargs, plan.in_avals, scalar_kinds,
                                           out_avals, narrow, c32, layout, _caller, _fixed)
    return plan


def _caller(e, tpl_args, tpl_kwargs, n_arr: int, c32: bool):
    """The lowering called on a plan's flat inputs (arrays, runtime scalars, the seed)."""
    random = e.random

    def call(*flat):
        arrs = iter(flat[:n_arr])
        sc = list(flat[n_arr:])
        seed = sc.pop() if random else None
        it_sc = iter(sc)
        a = rebuild(tpl_args, arrs, it_sc)
        kw = {k: rebuild(v, arrs, it_sc) for k, v in tpl_kwargs.items()}
        if random:
            kw["generator"] = jax.random.PRNGKey(seed)
        # NOTE: e.fn, not a captured function: a lowering fixed after a failed flush is
        # what the retry traces.
        if c32:
            return _dtypes.in_c32_math(e.fn, *a, **kw)
        return e.fn(*a, **kw)

    return call


def _fixed(e, outs, out_avals, narrow) -> tuple:
    """A lowering's flat outputs in the plan's avals (dtype, complex32 rounding, shape)."""
    if len(outs) != len(out_avals):
        raise RuntimeError(f"lazyrt: lowering of {e.name} returned {len(outs)} outputs, "
                           f"expected {len(out_avals)}")
    fixed = []
    for o, (shape, dt), nd in zip(outs, out_avals, narrow):
        o = jnp.asarray(o)
        if o.dtype != dt:
            o = o.astype(dt)
        if nd is not None:
            o = _dtypes.round_narrow(o, nd)
        if o.shape != shape:
            o = jnp.broadcast_to(o, shape)
        fixed.append(o)
    return tuple(fixed)


def _check_abstractly(e, prog_fn, vals, scalar_kinds, desc):
    """Trace ``prog_fn`` abstractly (errors raise here, at the op); returns its jaxpr."""
    ins = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in vals]
    ins += [0.0 if k == "f" else 0 for k in scalar_kinds]
    try:
        with _X64(True):
            return jax.jit(prog_fn).trace(*ins).jaxpr.jaxpr
    except Exception as ex:
        raise NotImplementedError(
            f"lazyrt: the lowering of {e.name} failed for inputs "
            f"{[(tuple(v.shape), str(v.dtype)) for v in vals]} and arguments ({desc}): "
            f"{type(ex).__name__}: {ex}") from ex


def _reads_arrays(jaxpr, n_arr: int) -> bool:
    """Whether the outputs of ``jaxpr`` read the value of any of its first ``n_arr`` inputs
    (``zeros_like(x)`` reads only ``x``'s shape)."""
    arrays = set(jaxpr.invars[:n_arr])
    if not arrays:
        return False
    if any(v in arrays for v in jaxpr.outvars if type(v) is not jax.extend.core.Literal):
        return True
    return any(v in arrays for eqn in jaxpr.eqns for v in eqn.invars
               if type(v) is not jax.extend.core.Literal)


def remember(plans: dict, key, plan: Plan) -> None:
    """Cache ``plan``; past ``config.plan_cache_size`` plans of one op, the oldest goes."""
    with _INSERT_LOCK:
        while plans and len(plans) >= config.plan_cache_size:
            plans.pop(next(iter(plans)), None)
        plans[key] = plan


def plan_for(e, args, kwargs):
    """``(plan, values, scalars)`` of this call: the hot path of every op."""
    vals: list = []
    scal: list = []
    dyn = not e.static_floats
    if e.int_slots[1]:
        args, kwargs = _value_ints.convert(e, args, kwargs)
    # NOTE: ``walk`` inlined for tensor arguments (most of them): no call per argument.
    key = []
    narrow = False
    for a in args:
        if type(a) is TpuTensor:
            vals.append(a._st.value)
            ch = a._chain
            key.append(a._spec if ch is None else view_key(a, ch, scal))
            if a._spec[2] is _C32:
                narrow = True
        else:
            if type(a) is complex:
                narrow = True
            key.append(walk(e, a, vals, scal, dyn))
    if narrow:
        rounded = _narrow.round_operands(args)
        if rounded is not None:
            return plan_for(e, rounded, kwargs)
    key = tuple(key)
    if kwargs:
        key = (key, tuple([(k, walk(e, v, vals, scal, dyn)) for k, v in kwargs.items()]))
    plan = e.plans.get(key)
    if plan is None:
        _inplace_cast_check(e, args, kwargs)
        plan = make_plan(e, args, kwargs, vals, scal)
        remember(e.plans, key, plan)
    if e.random:
        scal.append(_rng.seed_for(kwargs.get("generator")) if kwargs else _rng.next_seed())
    return plan, vals, scal

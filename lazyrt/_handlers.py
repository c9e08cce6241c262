"""How each kind of op runs, once resolved (``_resolve`` picks one per op).

A handler is ``handler(entry, args, kwargs) -> result``:

  functional       plan, run its Prog, wrap the fresh outputs
  mutating         the same, then write the new values into the mutated arguments
  view             no computation: a new tensor on the same storage, one more view step
  inplace_view     ``t.squeeze_()``: ``t`` becomes the out-of-place view, same object
  data_dependent   output shape depends on values: a sync point, run on concrete arrays
  composite        PyTorch's CompositeImplicitAutograd kernel
  decomposed       ``torch._decomp``
  via_functional   an in-place/out= op whose functional op runs: run it, ``copy_`` back
  missing          NotImplementedError naming the op (or the CPU fallback, when on)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from . import _fallback, _values, memory
from ._args import arg, walk
from ._config import config
from ._plan import make_plan, plan_for, remember
from ._tensor import TpuTensor, contiguous_spec
from ._values import new_tensor, run, write
from .metrics import COUNTERS

aten = torch.ops.aten
_X64 = jax.enable_x64
_IDENTITY_VIEWS = frozenset({"alias", "detach", "lift_fresh"})


def functional(e, args, kwargs):
    plan, vals, scal = plan_for(e, args, kwargs)
    outs = run(plan.prog, vals, scal)
    single = plan.layout.single
    if single is not None:
        return new_tensor(outs[0], single)
    res, _ = plan.layout.wrap_fresh(outs, new_tensor)
    return res[0] if e.n_returns == 1 else tuple(res)


def mutating(e, args, kwargs):
    plan, vals, scal = plan_for(e, args, kwargs)
    outs = run(plan.prog, vals, scal)
    layout = plan.layout
    fresh, i = layout.wrap_fresh(outs, new_tensor)
    muts = layout.write_back(args, kwargs, outs, i, write)
    if e.n_returns == 0:
        return None
    res = []
    fi = 0
    for alias in e.ret_alias:
        if alias >= 0:
            res.append(muts[alias])
        else:
            res.append(fresh[fi])
            fi += 1
    return res[0] if e.n_returns == 1 else tuple(res)


def view(e, args, kwargs):
    """A view op: no computation at all. The new tensor shares the base's storage and
    records one more view step; its value is derived only when something reads it."""
    base = args[0]
    if type(base) is not TpuTensor:
        return functional(e, args, kwargs)
    if base._chain is not None and e.packet == "as_strided":
        # NOTE: as_strided's offset and strides address the base's storage, not the view.
        root_spec = contiguous_spec(base._st.value.shape, base.dtype)
        root = TpuTensor(root_spec, base._st)
        return view(e, (root,) + tuple(args[1:]), kwargs)
    vals: list = []
    scal: list = []
    rest = tuple([walk(e, a, vals, scal, True) for a in args[1:]])
    kw = tuple([(k, walk(e, v, vals, scal, True)) for k, v in kwargs.items()]) if kwargs else ()
    if vals or scal:  # another tensor or a float argument: not a pure view of args[0]
        return functional(e, args, kwargs)
    key = ("view", base._spec, rest, kw)
    plan = e.plans.get(key)
    if plan is None:
        # NOTE: the base's aval, not its value: deriving a view of a view here would record
        # a node on the first call only, and the first step's trace would differ from the
        # second's (two compiles).
        v = base._st.value if base._chain is None else _values.aval(base)
        plan = make_plan(e, args, kwargs, [v], [], fold=False)
        remember(e.plans, key, plan)
    st = base._st
    if e.packet in _IDENTITY_VIEWS:
        # detach/alias: the same storage at the same chain, no extra step to derive.
        return TpuTensor(plan.out_specs[0], st, base._chain, base._cache, base._cver)
    prefix = base._chain or ()
    res = []
    i = 0
    for s, k in zip(plan.layout.fresh, plan.layout.kinds):
        if k == "TL":
            res.append([TpuTensor(sp, st, prefix + ((plan, i + j),)) for j, sp in enumerate(s)])
            i += len(s)
        else:
            res.append(TpuTensor(s, st, prefix + ((plan, i),)))
            i += 1
    return res[0] if e.n_returns == 1 else tuple(res)


def inplace_view(e, args, kwargs):
    """``t.squeeze_()`` and friends: ``t`` becomes the view the out-of-place op returns
    (same storage, new shape/strides), set on the very same Python object."""
    self = args[0]
    self._rebind(e.functional(*args, **kwargs))
    return self


def data_dependent(e, args, kwargs):
    """Ops whose output shape depends on values: a sync point, then run on concrete arrays."""

    def conc(a):
        if isinstance(a, TpuTensor):
            return _values.concrete(a)
        if isinstance(a, torch.Tensor):
            return _values.host_to_device(a)
        if type(a) is list:
            return [conc(x) for x in a]
        if type(a) is tuple:
            return tuple(conc(x) for x in a)
        return a

    cargs = conc(list(args))
    ckw = {k: conc(v) for k, v in kwargs.items()}
    with _X64(True):
        res = e.fn(*cargs, **ckw)
    COUNTERS["executions"] += 1

    def wrap(r):
        if isinstance(r, (list, tuple)):
            return type(r)(wrap(x) for x in r)
        if r is None:
            return None
        r = jnp.asarray(r)
        memory.track(r)
        return new_tensor(r)

    return wrap(res)


def composite(e, args, kwargs):
    COUNTERS["decompositions"] += 1
    return e.op.decompose(*args, **kwargs)


def decomposed(e, args, kwargs):
    COUNTERS["decompositions"] += 1
    return e.decomp(*args, **kwargs)


def mut_args(e, args, kwargs) -> list:
    return [arg(args, kwargs, name, pos) for name, pos, _ in e.mut]


def via_functional(e, args, kwargs):
    kw = {k: v for k, v in kwargs.items() if k not in e.out_names}
    res = e.functional(*args, **kw)
    muts = mut_args(e, args, kwargs)
    if len(muts) == 1:
        res = (res,)
    for m, r in zip(muts, res):
        if m is None:
            continue
        if isinstance(m, (list, tuple)):
            for a, b in zip(m, r):
                aten.copy_.default(a, b)
        else:
            aten.copy_.default(m, r)
    if e.n_returns == 0:
        return None
    out = [muts[a] if a >= 0 else None for a in e.ret_alias]
    return out[0] if e.n_returns == 1 else tuple(out)


def missing(e, args, kwargs):
    if config.cpu_fallback:
        return _fallback.cpu_fallback(e, args, kwargs)
    raise NotImplementedError(
        f"lazyrt: the ATen op '{e.name}' has no lowering for the tpu device and no "
        f"decomposition. Set LAZYRT_CPU_FALLBACK=1 (or lazyrt.set_cpu_fallback(True)) to run it "
        f"on the CPU instead.")

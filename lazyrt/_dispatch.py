"""lazyrt's dispatcher: every ATen op on a ``tpu`` tensor comes here.

Per op (``OpEntry``, resolved once): how to run it, in this order
  1. a lowering in the table (``lazyrt.lowering``), or one derived from the
     functional op for in-place ``foo_`` and ``foo.out`` variants;
  2. PyTorch's CompositeImplicitAutograd decomposition, then ``torch._decomp``;
  3. for an in-place/out variant whose functional op runs: the functional op,
     then a write-back;
  4. the CPU fallback when switched on, else ``NotImplementedError`` naming the op.

Per call signature (``Plan``, cached by op + input shapes/dtypes/strides + static
arguments): output specs from PyTorch's meta kernels (so shape and dtype errors
raise PyTorch's exception at the op), and a ``Prog`` (lowering with the static
arguments bound and outputs cast to PyTorch's dtypes). Running a plan is then:
walk the arguments (collect values and runtime scalars, build the key), look the
plan up, run or record its Prog, wrap the outputs.
"""
from __future__ import annotations

import functools
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax
from torch._ops import OpOverload

from . import _defer, _dtypes, _rng, _source, _strict, _tensor, memory
from ._config import config
from ._ir import Pending, Prog
from ._tensor import Storage, TpuTensor, contiguous_strides
from .lowering import _registry
from .metrics import COUNTERS, FALLBACK_OPS

aten = torch.ops.aten
_X64 = jax.enable_x64
_META = torch.device("meta")


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


_TSLOT = _Marker("<tensor>")  # template: a tensor input
_FSLOT = _Marker("<float>")  # template: a runtime float
_GSLOT = _Marker("<rng>")  # template: the PRNG key (from a runtime seed)
_B1 = _Marker("True")
_B0 = _Marker("False")
_FLOAT = float  # key marker of a runtime float

# ---------------------------------------------------------------------------
# values
# ---------------------------------------------------------------------------


def run(prog, inputs, scalars):
    """Run (strict/debug) or record (defer) ``prog``; returns its output values."""
    if config.mode == "defer":
        with _defer.LOCK:
            out = _defer.record(prog, inputs, scalars)
        return out
    arrays = []
    for v in inputs:
        if type(v) is Pending:
            v = materialize_pending(v)
        arrays.append(v)
    outs = _strict.run(prog, arrays, scalars)
    if config.mode == "debug":
        _debug_check(prog, arrays, scalars, outs)
    return outs


def materialize_pending(p: Pending):
    if p.result is None:
        if p.trace.done:
            raise RuntimeError("lazyrt: internal error: dead pending value")
        _defer.flush(reason="materialize", trace=p.trace)
        if p.result is None:
            raise RuntimeError("lazyrt: internal error: pending value not materialized by flush")
    return p.result


def value(t: TpuTensor):
    """The current value of ``t`` (array or Pending), derived through its view chain."""
    if t._chain is None:
        return t._st.value
    st = t._st
    c = t._cache
    if t._cver == st.version and c is not None:
        if type(c) is not Pending:
            return c
        if c.result is not None:
            t._cache = c.result
            return c.result
        if not c.trace.done:
            return c
    v = run(_chain_prog(t._chain), [st.value], [])[0]
    t._cache = v
    t._cver = st.version
    return v


def concrete(t: TpuTensor):
    """``t``'s value as a ``jax.Array``, flushing the pending trace if needed."""
    v = value(t)
    if type(v) is Pending:
        if t._chain is not None and v.result is None:
            # NOTE: live views are not flush outputs (autograd keeps many, e.g. the
            # transposed weights): materialize the base, then derive this view now.
            _defer.flush(reason="materialize", trace=v.trace)
            base = t._st.value
            if type(base) is Pending:
                base = materialize_pending(base)
            v = _strict.run(_chain_prog(t._chain), [base], [])[0]
            t._cache = v
            t._cver = t._st.version
        else:
            v = materialize_pending(v)
    return v


def write(t: TpuTensor, v) -> None:
    """Rebind ``t`` (and so every alias of it) to the new value ``v``."""
    st = t._st
    old = st.value
    if t._chain is None:
        st.value = v
        st.version += 1
    else:
        nb = run(_write_prog(t._chain), [old, v], [])[0]
        st.value = nb
        st.version += 1
        t._cache = v
        t._cver = st.version
    if type(st.value) is Pending:
        _defer.note_storage(st, old)


def new_tensor(v, spec) -> TpuTensor:
    st = Storage(v)
    t = TpuTensor(spec, st)
    if type(v) is Pending:
        _defer.note_storage(st, None)
    return t


# ---------------------------------------------------------------------------
# view helper programs
# ---------------------------------------------------------------------------

_IDENTITY_VIEWS = {"alias", "detach", "lift_fresh"}
_RESHAPE_VIEWS = {"view", "_reshape_alias", "squeeze", "unsqueeze", "reshape", "_unsafe_view",
                  "flatten", "unflatten", "view_as"}
_chain_progs: dict = {}
_write_progs: dict = {}


def _apply_chain(chain, x, raw=False):
    for plan, i in chain:
        x = (plan.raw if raw else plan.prog.fn)(x)[i]
    return x


def _chain_prog(chain) -> Prog:
    p = _chain_progs.get(chain)
    if p is None:
        last_plan, last_i = chain[-1]
        aval = last_plan.prog.out_avals[last_i]

        def fn(x):
            return (_apply_chain(chain, x),)

        p = Prog("view", fn, (), (aval,), desc="->".join(pl.name for pl, _ in chain))
        _chain_progs[chain] = p
    return p


def _inverse(plan, i, base, new):
    name = plan.entry.packet
    if name in _IDENTITY_VIEWS:
        return new.astype(base.dtype)
    if name in _RESHAPE_VIEWS:
        return new.reshape(base.shape).astype(base.dtype)
    if name == "real":
        return lax.complex(new.astype(jnp.real(base).dtype), jnp.imag(base))
    if name == "imag":
        return lax.complex(jnp.real(base), new.astype(jnp.imag(base).dtype))
    if name == "view_as_real":
        return lax.complex(new[..., 0], new[..., 1]).astype(base.dtype)
    if name == "_conj":
        return jnp.conj(new).astype(base.dtype)
    if name == "_neg_view":
        return (-new).astype(base.dtype)
    # NOTE: generic inverse of any index-rearranging view: push an iota of the base
    # through the view to learn which base element each view element is, then scatter.
    idx_dtype = jnp.int64 if base.size >= 2**31 else jnp.int32
    iota = jnp.arange(base.size, dtype=idx_dtype).reshape(base.shape)
    idx = plan.raw(iota)[i]
    flat = base.reshape(-1).at[idx.reshape(-1)].set(new.reshape(-1).astype(base.dtype))
    return flat.reshape(base.shape)


def _write_prog(chain) -> Prog:
    p = _write_progs.get(chain)
    if p is None:
        base_aval = chain[0][0].in_avals[0]

        def fn(base, new):
            xs = [base]
            for plan, i in chain[:-1]:
                xs.append(plan.prog.fn(xs[-1])[i])
            v = new
            for (plan, i), x in zip(reversed(chain), reversed(xs)):
                v = _inverse(plan, i, x, v)
            return (v,)

        p = Prog("write_through_view", fn, (), (base_aval,),
                 desc="->".join(pl.name for pl, _ in chain))
        _write_progs[chain] = p
    return p


# ---------------------------------------------------------------------------
# op entries
# ---------------------------------------------------------------------------


class OpEntry:
    __slots__ = ("op", "name", "packet", "handler", "fn", "static_floats", "random", "mut",
                 "mut_pos", "is_view", "n_returns", "ret_kinds", "ret_alias", "plans",
                 "decomp", "functional", "data_dependent", "out_names", "schema")

    def __init__(self, op: OpOverload):
        self.op = op
        self.name = str(op)
        self.packet = op._schema.name.split("::")[-1]
        self.schema = op._schema
        self.plans = {}
        self.fn = None
        self.static_floats = False
        self.random = False
        self.decomp = None
        self.functional = None
        self.data_dependent = False
        s = op._schema
        self.mut = []  # (name, position, is_list)
        for i, a in enumerate(s.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                self.mut.append((a.name, i, "List" in str(a.type)))
            if "Generator" in str(a.type):
                self.random = True
        self.out_names = tuple(a.name for a in s.arguments if a.is_out)
        self.is_view = (not self.mut and len(s.returns) > 0
                        and s.returns[0].alias_info is not None)
        self.n_returns = len(s.returns)
        self.ret_kinds = []
        self.ret_alias = []  # per return: index into self.mut or -1
        for r in s.returns:
            t = str(r.type)
            self.ret_kinds.append("TL" if t.startswith("List[Tensor]") else
                                  ("T" if "Tensor" in t else "S"))
            k = -1
            if r.alias_info is not None and r.alias_info.is_write:
                for j, (name, pos, _) in enumerate(self.mut):
                    a = s.arguments[pos]
                    if a.alias_info.before_set == r.alias_info.before_set:
                        k = j
            self.ret_alias.append(k)
        self.mut_pos = tuple(pos for _, pos, _ in self.mut)

    def set_mutates(self, names):
        s = self.schema
        self.mut = []
        for i, a in enumerate(s.arguments):
            if a.name in names:
                self.mut.append((a.name, i, "List" in str(a.type)))
        self.mut_pos = tuple(pos for _, pos, _ in self.mut)


_ENTRIES: dict = {}
_RESOLVE_LOCK = threading.RLock()


def _functional_of(op: OpOverload):
    """The functional overload of an in-place ``foo_`` or ``foo.out`` op, or None."""
    s = op._schema
    name = s.name.split("::")[-1]
    ov = s.overload_name or "default"
    packet = None
    if any(a.is_out for a in s.arguments):
        packet = getattr(aten, name, None)
        if packet is None:
            return None
        want = [a.name for a in s.arguments if not a.is_out]
        for cand in packet.overloads():
            f = getattr(packet, cand)
            fs = f._schema
            if any(a.is_out for a in fs.arguments):
                continue
            if any(a.alias_info is not None and a.alias_info.is_write for a in fs.arguments):
                continue
            if [a.name for a in fs.arguments] == want:
                return f
        return None
    if name.endswith("_") and not name.startswith("__"):
        want = [(a.name, str(a.type)) for a in s.arguments]
        # foo_.ov -> foo.ov, else the overload of foo (or foo_functional) with the same
        # arguments (bernoulli_.float -> bernoulli.p, normal_ -> normal_functional).
        for fname in (name[:-1], name[:-1] + "_functional"):
            packet = getattr(aten, fname, None)
            if packet is None:
                continue
            f = getattr(packet, ov, None)
            if f is not None and [(a.name, str(a.type)) for a in f._schema.arguments] == want:
                return f
            for cand in packet.overloads():
                f = getattr(packet, cand)
                fs = f._schema
                if any(a.is_out or (a.alias_info is not None and a.alias_info.is_write)
                       for a in fs.arguments):
                    continue
                if [(a.name, str(a.type)) for a in fs.arguments] == want:
                    return f
    return None


def _is_view_op(op: OpOverload) -> bool:
    s = op._schema
    return (len(s.returns) > 0 and s.returns[0].alias_info is not None
            and not s.returns[0].alias_info.is_write
            and not any(a.alias_info is not None and a.alias_info.is_write for a in s.arguments))


def _has_composite_implicit(op: OpOverload) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")


def _decomposition(op: OpOverload):
    from torch._decomp import decomposition_table

    return decomposition_table.get(op)


def resolve(op: OpOverload) -> OpEntry:
    with _RESOLVE_LOCK:
        e = _ENTRIES.get(op)
        if e is not None:
            return e
        e = OpEntry(op)
        special = _SPECIAL.get(op)
        low = _registry.LOWERINGS.get(op)
        f = _functional_of(op)
        flow = _registry.LOWERINGS.get(f) if f is not None else None
        if low is not None:
            _use_lowering(e, low)
        elif flow is not None and not flow.data_dependent and flow.mutates is None:
            _use_lowering(e, flow, derived=True)
        elif _has_composite_implicit(op):
            e.handler = _h_composite
        elif _decomposition(op) is not None:
            e.decomp = _decomposition(op)
            e.handler = _h_decomp
        elif f is not None and e.mut:
            e.functional = f
            e.handler = _h_via_functional
        else:
            e.handler = _h_missing
        if special is not None:
            e.handler = special
        elif e.mut and f is not None and _is_view_op(f):
            # squeeze_, unsqueeze_, transpose_, t_, as_strided_, swapdims_: metadata-only
            e.functional = f
            e.handler = _h_inplace_view
        _ENTRIES[op] = e
        return e


def _use_lowering(e: OpEntry, low, derived: bool = False) -> None:
    fn = low.fn
    if derived and e.out_names:
        outs = set(e.out_names)

        def fn(*args, _f=low.fn, **kwargs):
            return _f(*args, **{k: v for k, v in kwargs.items() if k not in outs})

    e.fn = fn
    e.static_floats = low.static_floats
    e.random = e.random or getattr(low, "random", False)
    e.data_dependent = low.data_dependent
    if low.mutates is not None and not derived:
        e.set_mutates(low.mutates)
    if low.data_dependent:
        e.handler = _h_data_dependent
    elif e.is_view:
        e.handler = _h_view
    elif e.mut:
        e.handler = _h_mutating
    else:
        e.handler = _h_functional


def dispatch(func, args, kwargs):
    COUNTERS["ops_dispatched"] += 1
    e = _ENTRIES.get(func)
    if e is None:
        e = resolve(func)
    try:
        if config.debug_compare and config.mode == "debug":
            out = e.handler(e, args, kwargs)
            debug_compare(e, args, kwargs, out)
            return out
        return e.handler(e, args, kwargs)
    except Exception as ex:
        if torch._C._current_autograd_node() is None:
            raise
        return _backward_error(e, args, kwargs, ex)


# NOTE: PyTorch 2.13 aborts the process ("terminate called without an active
# exception") when a Python exception leaves a PrivateUse1 kernel called by a C++
# autograd node. So inside backward an op's error is kept here, the op returns
# zeros of the right shape, and the error is raised when backward() returns.
_backward_errors: list = []


def _backward_error(e, args, kwargs, ex):
    if not _backward_errors:
        _backward_errors.append(ex)
    try:
        mout, _, _ = _meta_run(e, args, kwargs)
    except Exception:
        mout = args[0] if args else None

    def zeros(m):
        if isinstance(m, torch.Tensor):
            shape = tuple(m.shape)
            return new_tensor(jnp.zeros(shape, _dtypes.to_jax(m.dtype)),
                              (shape, contiguous_strides(shape), m.dtype, 0))
        if isinstance(m, (list, tuple)):
            return type(m)(zeros(x) for x in m)
        return m

    return zeros(mout)


def _install_backward_error_hook():
    import torch.autograd
    import torch.autograd.graph

    orig = torch.autograd.graph._engine_run_backward

    def _engine_run_backward(*args, **kwargs):
        _backward_errors.clear()
        try:
            out = orig(*args, **kwargs)
        except BaseException:
            if _backward_errors:
                err = _backward_errors.pop()
                _backward_errors.clear()
                raise err from None
            raise
        if _backward_errors:
            err = _backward_errors.pop()
            _backward_errors.clear()
            raise err
        return out

    torch.autograd.graph._engine_run_backward = _engine_run_backward
    torch.autograd._engine_run_backward = _engine_run_backward


_install_backward_error_hook()


def _install_fast_dispatch_rule_lookup():
    # NOTE: PyTorch asks torch._library.simple_registry for a torch_dispatch rule
    # on every op of a tensor subclass (~3 us). lazyrt registers none for TpuTensor.
    import torch._library.simple_registry as sr

    orig = sr.find_torch_dispatch_rule

    def find_torch_dispatch_rule(op, torch_dispatch_class):
        if torch_dispatch_class is TpuTensor:
            return None
        return orig(op, torch_dispatch_class)

    sr.find_torch_dispatch_rule = find_torch_dispatch_rule


_install_fast_dispatch_rule_lookup()


_tensor._dispatch = dispatch

# ---------------------------------------------------------------------------
# argument walk (hot path)
# ---------------------------------------------------------------------------

_ALLOW_CPU = {"copy_", "index", "index_put", "index_put_", "_index_put_impl_", "_to_copy"}


def _cpu_input(e, t: torch.Tensor, vals):
    if t.dim() != 0 and e.packet not in _ALLOW_CPU:
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"tpu:0 and {t.device}! (when checking argument for {e.name})")
    if t.device.type == "meta":
        raise NotImplementedError(f"lazyrt: {e.name} got a meta tensor")
    vals.append(host_to_device(t))
    return ("cpu", tuple(t.shape), t.dtype)


class _ViewSlot:
    """Template: a tensor input that is a view, folded into the consuming op."""

    __slots__ = ("chain",)

    def __init__(self, chain):
        self.chain = chain


def _walk(e, a, vals, scal, dyn):
    tp = type(a)
    if tp is TpuTensor:
        vals.append(a._st.value)
        ch = a._chain
        if ch is None:
            return a._spec
        # NOTE: a view input is folded into the op: the op gets the base value and
        # applies the view steps itself (XLA fuses them: a transpose feeding a dot costs
        # nothing), so views are never materialized on their own. The plan is keyed by
        # the view chain.
        return (a._spec, ch)
    if tp is float:
        if dyn:
            scal.append(a)
            return _FLOAT
        return (float, a)
    if tp is bool:
        return _B1 if a else _B0
    if tp is list or tp is tuple:
        return tuple([_walk(e, x, vals, scal, dyn) for x in a])
    if isinstance(a, torch.Tensor):
        return _cpu_input(e, a, vals)
    if isinstance(a, torch.Generator):
        return None
    return a


def _template(a, dyn, fold=True):
    if isinstance(a, torch.Tensor):
        if fold and type(a) is TpuTensor and a._chain is not None:
            return _ViewSlot(a._chain)
        return _TSLOT
    if type(a) is float and dyn:
        return _FSLOT
    if type(a) is list:
        return [_template(x, dyn, fold) for x in a]
    if type(a) is tuple:
        return tuple(_template(x, dyn, fold) for x in a)
    if isinstance(a, torch.Generator):
        return None
    return a


def _rebuild(tpl, it_arr, it_sc):
    if tpl is _TSLOT:
        return next(it_arr)
    if tpl is _FSLOT:
        return next(it_sc)
    if type(tpl) is _ViewSlot:
        return _apply_chain(tpl.chain, next(it_arr))
    if type(tpl) is list:
        return [_rebuild(x, it_arr, it_sc) for x in tpl]
    if type(tpl) is tuple:
        return tuple(_rebuild(x, it_arr, it_sc) for x in tpl)
    return tpl


def _to_meta(a):
    if isinstance(a, torch.Tensor):
        if isinstance(a, TpuTensor):
            shape, stride, dtype, off = a._spec
        else:
            shape, stride, dtype, off = tuple(a.shape), tuple(a.stride()), a.dtype, 0
            if a.dim() == 0:
                return torch.empty((), dtype=dtype, device=_META)
        if off == 0:
            return torch.empty_strided(shape, stride, dtype=dtype, device=_META)
        extent = 1 + sum((s - 1) * st for s, st in zip(shape, stride) if s > 0)
        base = torch.empty(off + extent, dtype=dtype, device=_META)
        return base.as_strided(shape, stride, off)
    if type(a) is list:
        return [_to_meta(x) for x in a]
    if type(a) is tuple:
        return tuple(_to_meta(x) for x in a)
    if isinstance(a, torch.device) and a.type == "tpu":
        return _META
    if isinstance(a, torch.Generator):
        return None
    return a


def _spec_of_meta(m: torch.Tensor) -> tuple:
    return (tuple(m.shape), tuple(m.stride()), m.dtype, m.storage_offset())


# ---------------------------------------------------------------------------
# plans
# ---------------------------------------------------------------------------


class Plan:
    __slots__ = ("entry", "name", "prog", "raw", "out_specs", "mut_specs", "in_avals", "n_fresh",
                 "random", "fresh_kinds", "__weakref__")


def _aval(spec):
    return (spec[0], _dtypes.to_jax(spec[2]))


def _meta_run(e, args, kwargs):
    margs = _to_meta(list(args))
    mkw = {k: _to_meta(v) for k, v in kwargs.items()}
    if e.random:
        mkw.pop("generator", None)
    return e.op(*margs, **mkw), margs, mkw


def _make_plan(e: OpEntry, key, args, kwargs, vals, scal, fold=True) -> Plan:
    dyn = not e.static_floats
    plan = Plan()
    plan.entry = e
    plan.name = e.name
    plan.random = e.random
    tpl_args = _template(list(args), dyn, fold)
    tpl_kwargs = {k: _template(v, dyn, fold) for k, v in kwargs.items()}
    if e.random:
        tpl_kwargs["generator"] = _GSLOT
    n_arr = len(vals)
    scalar_kinds = tuple("f" for _ in scal) + (("i",) if e.random else ())
    in_avals = tuple((tuple(v.shape), jnp.dtype(v.dtype)) for v in vals)

    def call(*flat):
        arrs = iter(flat[:n_arr])
        sc = list(flat[n_arr:])
        if e.random:
            seed = sc.pop()
        it_sc = iter(sc)
        a = _rebuild(tpl_args, arrs, it_sc)
        kw = {k: _rebuild(v, arrs, it_sc) for k, v in tpl_kwargs.items()}
        if e.random:
            kw["generator"] = jax.random.PRNGKey(seed)
        # NOTE: e.fn, not a captured function: a lowering fixed after a failed flush is
        # what the retry traces.
        return e.fn(*a, **kw)

    # Output specs from PyTorch's meta kernel (raises PyTorch's errors for bad input).
    try:
        mout, margs, mkw = _meta_run(e, args, kwargs)
        meta_ok = True
    except (NotImplementedError, AttributeError) as ex:
        # No meta kernel (or a broken one, e.g. an AttributeError on a None bias):
        # derive output shapes from the lowering itself.
        if isinstance(ex, NotImplementedError) and "meta" not in str(ex).lower():
            raise
        meta_ok = False
        mout = margs = mkw = None
    mut_specs = []
    for name, pos, is_list in e.mut:
        a = args[pos] if pos < len(args) else kwargs.get(name)
        if is_list:
            mut_specs.append([x._spec if x is not None else None for x in a])
        else:
            mut_specs.append(a._spec if a is not None else None)
    if meta_ok:
        # out= tensors that PyTorch would resize
        for (name, pos, is_list), ms in zip(e.mut, mut_specs):
            ma = margs[pos] if pos < len(margs) else mkw.get(name)
            if is_list or ma is None or ms is None:
                continue
            if tuple(ma.shape) != ms[0]:
                raise RuntimeError(
                    f"lazyrt: {e.name}: the out= tensor of shape {list(ms[0])} would have to be "
                    f"resized to {list(ma.shape)}; resizing tpu tensors is not supported, pass an "
                    f"out= tensor of the right shape")
        rets = mout if e.n_returns != 1 else (mout,)
        fresh = []
        kinds = []
        for r, kind, alias in zip(rets if e.n_returns else (), e.ret_kinds, e.ret_alias):
            if alias >= 0:
                continue
            if kind == "TL":
                fresh.append([_spec_of_meta(m) for m in r])
            elif kind == "T":
                fresh.append(_spec_of_meta(r) if r is not None else None)
            else:
                fresh.append(r)
            kinds.append(kind)
    else:
        with _X64(True):
            shaped = jax.eval_shape(call, *vals, *[0.0] * len(scal), *([0] if e.random else []))
        if not isinstance(shaped, (tuple, list)) or e.n_returns == 1:
            shaped = (shaped,)
        fresh, kinds = [], []
        n_fresh_ret = sum(1 for a in e.ret_alias if a < 0)
        for s, kind in zip(shaped[:n_fresh_ret], [k for k, a in zip(e.ret_kinds, e.ret_alias) if a < 0]):
            if kind == "TL":
                fresh.append([(tuple(x.shape), contiguous_strides(x.shape), _dtypes.to_torch(x.dtype), 0)
                              for x in s])
            elif s is None:
                fresh.append(None)
            else:
                fresh.append((tuple(s.shape), contiguous_strides(s.shape), _dtypes.to_torch(s.dtype), 0))
            kinds.append(kind)
    plan.out_specs = fresh
    plan.fresh_kinds = kinds
    plan.mut_specs = mut_specs
    plan.n_fresh = len(fresh)
    plan.in_avals = in_avals

    # Flat outputs: fresh outputs (lists expanded), then mutated args (lists expanded).
    flat_specs = []
    for s, k in zip(fresh, kinds):
        if k == "TL":
            flat_specs.extend(s)
        elif k == "T" and s is not None:
            flat_specs.append(s)
    for ms, (name, pos, is_list) in zip(mut_specs, e.mut):
        if is_list:
            flat_specs.extend(x for x in ms if x is not None)
        elif ms is not None:
            flat_specs.append(ms)
    out_avals = tuple(_aval(s) for s in flat_specs)
    n_fresh = len(fresh)
    n_mut = len(e.mut)
    has_mut = n_mut > 0

    def raw(*flat):
        res = call(*flat)
        if has_mut:
            if n_fresh == 0 and n_mut == 1:
                res = (res,)  # the bare new value of the one mutated argument
            fr, mu = res[:n_fresh], res[n_fresh:]
        else:
            fr = (res,) if e.n_returns == 1 else tuple(res)
            mu = ()
        out = []
        for r, k in zip(fr, kinds):
            if k == "TL":
                out.extend(r)
            elif k == "T" and r is not None:
                out.append(r)
        for r, ms, (name, pos, is_list) in zip(mu, mut_specs, e.mut):
            if ms is None:
                continue
            if is_list:
                out.extend(x for x, s in zip(r, ms) if s is not None)
            else:
                out.append(r)
        return out

    def prog_fn(*flat):
        outs = raw(*flat)
        if len(outs) != len(out_avals):
            raise RuntimeError(f"lazyrt: lowering of {e.name} returned {len(outs)} outputs, "
                               f"expected {len(out_avals)}")
        fixed = []
        for o, (shape, dt) in zip(outs, out_avals):
            o = jnp.asarray(o)
            if o.dtype != dt:
                o = o.astype(dt)
            if o.shape != shape:
                o = jnp.broadcast_to(o, shape)
            fixed.append(o)
        return tuple(fixed)

    plan.raw = raw
    desc = _static_desc(tpl_args, tpl_kwargs)
    plan.prog = Prog(e.packet, prog_fn, scalar_kinds, out_avals, desc=desc, op=e.op)
    # NOTE: trace the lowering abstractly once per plan, so a lowering that cannot take
    # these inputs fails here, at the op, in every mode (not later inside a defer flush).
    ins = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in vals]
    ins += [0.0 if k == "f" else 0 for k in scalar_kinds]
    try:
        with _X64(True):
            jax.eval_shape(prog_fn, *ins)
    except Exception as ex:
        raise NotImplementedError(
            f"lazyrt: the lowering of {e.name} failed for inputs "
            f"{[(tuple(v.shape), str(v.dtype)) for v in vals]} and arguments ({desc}): "
            f"{type(ex).__name__}: {ex}") from ex
    return plan


def _static_desc(tpl_args, tpl_kwargs) -> str:
    parts = []
    for a in tpl_args:
        if a is _TSLOT or (isinstance(a, list) and a and all(x is _TSLOT for x in a)):
            continue
        parts.append(_short(a))
    for k, v in tpl_kwargs.items():
        if v is None or v is _GSLOT:
            continue
        parts.append(f"{k}={_short(v)}")
    return ", ".join(parts)


def _short(a) -> str:
    s = repr(a)
    return s if len(s) <= 40 else s[:37] + "..."


def _plan_for(e: OpEntry, args, kwargs):
    vals: list = []
    scal: list = []
    dyn = not e.static_floats
    if kwargs:
        key = (tuple([_walk(e, a, vals, scal, dyn) for a in args]),
               tuple([(k, _walk(e, v, vals, scal, dyn)) for k, v in kwargs.items()]))
    else:
        key = tuple([_walk(e, a, vals, scal, dyn) for a in args])
    plan = e.plans.get(key)
    if plan is None:
        plan = _make_plan(e, key, args, kwargs, vals, scal)
        e.plans[key] = plan
    if e.random:
        scal.append(_rng.next_seed())
    return plan, vals, scal


# ---------------------------------------------------------------------------
# handlers
# ---------------------------------------------------------------------------


def _wrap_fresh(plan, outs, start=0):
    res = []
    i = start
    for s, k in zip(plan.out_specs, plan.fresh_kinds):
        if k == "TL":
            lst = []
            for sp in s:
                lst.append(new_tensor(outs[i], sp))
                i += 1
            res.append(lst)
        elif k == "T":
            if s is None:
                res.append(None)
            else:
                res.append(new_tensor(outs[i], s))
                i += 1
        else:
            res.append(s)
    return res, i


def _h_functional(e, args, kwargs):
    plan, vals, scal = _plan_for(e, args, kwargs)
    outs = run(plan.prog, vals, scal)
    if e.n_returns == 1 and plan.fresh_kinds[0] == "T":
        return new_tensor(outs[0], plan.out_specs[0])
    res, _ = _wrap_fresh(plan, outs)
    return res[0] if e.n_returns == 1 else tuple(res)


def _h_view(e, args, kwargs):
    """A view op: no computation at all. The new tensor shares the base's storage and
    records one more view step; its value is derived only when something reads it."""
    base = args[0]
    if type(base) is not TpuTensor:
        return _h_functional(e, args, kwargs)
    if base._chain is not None and e.packet == "as_strided":
        # NOTE: as_strided's offset and strides address the base's storage, not the view.
        root_shape = tuple(base._st.value.shape)
        root = TpuTensor((root_shape, contiguous_strides(root_shape), base.dtype, 0), base._st)
        return _h_view(e, (root,) + tuple(args[1:]), kwargs)
    vals: list = []
    scal: list = []
    rest = tuple([_walk(e, a, vals, scal, True) for a in args[1:]])
    kw = tuple([(k, _walk(e, v, vals, scal, True)) for k, v in kwargs.items()]) if kwargs else ()
    if vals or scal:  # another tensor or a float argument: not a pure view of args[0]
        return _h_functional(e, args, kwargs)
    key = ("view", base._spec, rest, kw)
    plan = e.plans.get(key)
    if plan is None:
        plan = _make_plan(e, key, args, kwargs, [value(base)], [], fold=False)
        e.plans[key] = plan
    st = base._st
    prefix = base._chain or ()
    if e.packet in _IDENTITY_VIEWS:
        # detach/alias: the same storage at the same chain, no extra step to derive.
        return TpuTensor(plan.out_specs[0], st, base._chain, base._cache, base._cver)
    res = []
    i = 0
    for s, k in zip(plan.out_specs, plan.fresh_kinds):
        if k == "TL":
            lst = []
            for sp in s:
                lst.append(TpuTensor(sp, st, prefix + ((plan, i),)))
                i += 1
            res.append(lst)
        else:
            res.append(TpuTensor(s, st, prefix + ((plan, i),)))
            i += 1
    return res[0] if e.n_returns == 1 else tuple(res)


def _h_inplace_view(e, args, kwargs):
    """``t.squeeze_()`` and friends: ``t`` becomes the view the out-of-place op returns
    (same storage, new shape/strides), set on the very same Python object."""
    self = args[0]
    self._rebind(e.functional(*args, **kwargs))
    return self


def _mut_args(e, args, kwargs):
    out = []
    for name, pos, is_list in e.mut:
        out.append(args[pos] if pos < len(args) else kwargs.get(name))
    return out


def _h_mutating(e, args, kwargs):
    plan, vals, scal = _plan_for(e, args, kwargs)
    outs = run(plan.prog, vals, scal)
    fresh, i = _wrap_fresh(plan, outs)
    muts = _mut_args(e, args, kwargs)
    for m, ms, (name, pos, is_list) in zip(muts, plan.mut_specs, e.mut):
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


def _h_data_dependent(e, args, kwargs):
    """Ops whose output shape depends on values: a sync point, then run on concrete arrays."""

    def conc(a):
        if isinstance(a, TpuTensor):
            return concrete(a)
        if isinstance(a, torch.Tensor):
            return host_to_device(a)
        if type(a) is list:
            return [conc(x) for x in a]
        if type(a) is tuple:
            return tuple(conc(x) for x in a)
        return a

    # PyTorch's meta kernels still validate arguments where they can.
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
        return _tensor.from_value(r)

    out = wrap(res)
    return out


def _h_composite(e, args, kwargs):
    COUNTERS["decompositions"] += 1
    return e.op.decompose(*args, **kwargs)


def _h_decomp(e, args, kwargs):
    COUNTERS["decompositions"] += 1
    return e.decomp(*args, **kwargs)


def _h_via_functional(e, args, kwargs):
    kw = {k: v for k, v in kwargs.items() if k not in e.out_names}
    res = e.functional(*args, **kw)
    muts = _mut_args(e, args, kwargs)
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


_warned_fallback: set = set()


def _h_missing(e, args, kwargs):
    if config.cpu_fallback:
        return cpu_fallback(e, args, kwargs)
    raise NotImplementedError(
        f"lazyrt: the ATen op '{e.name}' has no lowering for the tpu device and no "
        f"decomposition. Set LAZYRT_CPU_FALLBACK=1 (or lazyrt.set_cpu_fallback(True)) to run it "
        f"on the CPU instead.")


def to_cpu(t: TpuTensor) -> torch.Tensor:
    arr = concrete(t)
    COUNTERS["transfers_to_host"] += 1
    return _dtypes.numpy_to_torch(np.asarray(arr))


def to_cpu_tree(a, originals: dict | None = None):
    """``a`` with every tpu tensor copied to the CPU (and tpu devices made cpu);
    ``originals`` maps id(copy) -> the tpu tensor it came from."""
    if isinstance(a, TpuTensor):
        c = to_cpu(a)
        if originals is not None:
            originals[id(c)] = a
        return c
    if type(a) is list:
        return [to_cpu_tree(x, originals) for x in a]
    if type(a) is tuple:
        return tuple(to_cpu_tree(x, originals) for x in a)
    if isinstance(a, torch.device) and a.type == "tpu":
        return torch.device("cpu")
    return a


def cpu_fallback(e, args, kwargs):
    if e.name not in _warned_fallback:
        _warned_fallback.add(e.name)
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
        seq = c if is_list else [c]
        for x in seq:
            if x is not None and id(x) in originals:
                t = originals[id(x)]
                write(t, host_to_device(x))

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


def host_to_device(c: torch.Tensor):
    """The one host->device transfer: a CPU tensor to a tracked jax.Array.

    NOTE: under enable_x64, or JAX would silently truncate int64/float64 to 32 bits.
    """
    with _X64(True):
        arr = jax.device_put(_dtypes.torch_to_numpy(c.detach().cpu().contiguous()))
    memory.track(arr)
    COUNTERS["transfers_to_device"] += 1
    return arr


def from_cpu(c: torch.Tensor) -> TpuTensor:
    arr = host_to_device(c)
    return new_tensor(arr, (tuple(c.shape), contiguous_strides(c.shape), c.dtype, 0))


# ---------------------------------------------------------------------------
# special ops
# ---------------------------------------------------------------------------


def _h_to_copy(e, args, kwargs):
    x = args[0]
    dev = kwargs.get("device")
    if dev is not None and torch.device(dev).type != "tpu":
        c = to_cpu(x)
        dtype = kwargs.get("dtype")
        if dtype is not None and dtype != c.dtype:
            c = c.to(dtype)
        mf = kwargs.get("memory_format")
        if mf is not None and mf is not torch.preserve_format:
            c = c.contiguous(memory_format=mf)
        return c.to(dev) if torch.device(dev).type != "cpu" else c
    kw = dict(kwargs)
    kw.pop("non_blocking", None)
    return _h_functional(_copy_entry(), [x], kw)


@functools.lru_cache(None)
def _copy_entry():
    e = OpEntry(aten._to_copy.default)
    _use_lowering(e, _registry.LOWERINGS[aten._to_copy.default])
    return e


def _h_copy_(e, args, kwargs):
    dst, src = args[0], args[1]
    if not isinstance(dst, TpuTensor):
        # tpu -> cpu (or another device)
        c = to_cpu(src)
        dst.copy_(c)
        return dst
    if isinstance(src, TpuTensor):
        return _h_mutating(e, args, kwargs)
    # host -> tpu: one transfer, then the same broadcast/cast rule
    if src.device.type == "meta":
        raise NotImplementedError("Cannot copy out of meta tensor; no data!")
    src_t = from_cpu(src.detach())
    return _h_mutating(e, (dst, src_t) + tuple(args[2:]), kwargs)


def _h_local_scalar_dense(e, args, kwargs):
    t = args[0]
    arr = np.asarray(concrete(t))
    COUNTERS["transfers_to_host"] += 1
    v = arr.reshape(()).item()
    if t.dtype == torch.bool:
        return bool(v)
    if t.dtype.is_floating_point:
        return float(v)
    if t.dtype.is_complex:
        return complex(v)
    return int(v)


def _h_equal(e, args, kwargs):
    a, b = args
    if a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return bool(aten.eq.Tensor(a, b).all().item())


def _h_allclose(e, args, kwargs):
    a, b = args[0], args[1]
    rest = dict(zip(("rtol", "atol", "equal_nan"), args[2:]))
    rest.update(kwargs)
    return bool(aten.isclose.default(a, b, **rest).all().item())


def _h_is_nonzero(e, args, kwargs):
    t = args[0]
    n = t.numel()
    if n == 0:
        raise RuntimeError("Boolean value of Tensor with no values is ambiguous")
    if n > 1:
        raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
    return bool(_h_local_scalar_dense(e, (t,), {}))


def _bool_to_long_indices(indices):
    """PyTorch's expandTensors: a bool/uint8 mask index becomes its nonzero coordinates."""
    out = []
    changed = False
    for idx in indices:
        if idx is not None and idx.dtype in (torch.bool, torch.uint8):
            changed = True
            nz = aten.nonzero.default(idx if isinstance(idx, TpuTensor) else idx.to("tpu"))
            for j in range(idx.dim()):
                out.append(aten.select.int(nz, 1, j))
        else:
            out.append(idx)
    return out, changed


def _h_index(e, args, kwargs):
    x, indices = args[0], args[1]
    indices, changed = _bool_to_long_indices(indices)
    return _h_functional(e, (x, indices) + tuple(args[2:]), kwargs)


def _h_index_put(e, args, kwargs):
    x, indices, values = args[0], args[1], args[2]
    rest = tuple(args[3:])
    # x[mask] = scalar-like: a where(), no sync.
    if (len(indices) == 1 and indices[0] is not None and indices[0].dtype == torch.bool
            and isinstance(indices[0], TpuTensor) and values.numel() == 1
            and tuple(indices[0].shape) == tuple(x.shape[: indices[0].dim()])):
        accumulate = rest[0] if rest else kwargs.get("accumulate", False)
        if not accumulate:
            mask = indices[0]
            for _ in range(x.dim() - mask.dim()):
                mask = aten.unsqueeze.default(mask, -1)
            v = values if isinstance(values, TpuTensor) else from_cpu(values)
            v = aten.reshape.default(v, []) if v.dim() else v
            newv = aten.where.self(mask, aten._to_copy.default(v, dtype=x.dtype), x)
            if e.mut:
                return aten.copy_.default(x, newv)
            return newv
    indices, changed = _bool_to_long_indices(indices)
    handler = _h_mutating if e.mut else _h_functional
    return handler(e, (x, indices, values) + rest, kwargs)


def _h_noop_pin(e, args, kwargs):
    return False


def _h_resize(e, args, kwargs):
    self, size = args[0], args[1]
    if tuple(self.shape) == tuple(size):
        return self
    raise RuntimeError(f"lazyrt: resizing a tpu tensor from {list(self.shape)} to {list(size)} "
                       f"is not supported")


def _h_record_stream(e, args, kwargs):
    return None


_SPECIAL: dict = {}


def _install_specials():
    _SPECIAL.update({
        aten._to_copy.default: _h_to_copy,
        aten.copy_.default: _h_copy_,
        aten._local_scalar_dense.default: _h_local_scalar_dense,
        aten.equal.default: _h_equal,
        aten.allclose.default: _h_allclose,
        aten.is_nonzero.default: _h_is_nonzero,
        aten.is_pinned.default: _h_noop_pin,
        aten.resize_.default: _h_resize,
        aten.record_stream.default: _h_record_stream,
    })


def _late_specials():
    # ops whose special handler wraps a lowering
    for op, h in ((aten.index.Tensor, _h_index), (aten.index_put.default, _h_index_put),
                  (aten.index_put_.default, _h_index_put),
                  (aten._index_put_impl_.default, _h_index_put)):
        e = OpEntry(op)
        low = _registry.LOWERINGS.get(op)
        if low is None and op is not aten.index.Tensor:
            f = _functional_of(op)
            if f is not None and f in _registry.LOWERINGS:
                _use_lowering(e, _registry.LOWERINGS[f], derived=True)
            else:
                continue
        elif low is None:
            continue
        else:
            _use_lowering(e, low)
        e.handler = h
        _ENTRIES[op] = e


_install_specials()

# ---------------------------------------------------------------------------
# debug mode
# ---------------------------------------------------------------------------

_divergences: list = []


def _has_bad(a) -> tuple[bool, bool]:
    if not jnp.issubdtype(a.dtype, jnp.inexact):
        return False, False
    arr = np.asarray(a)
    return bool(np.isnan(arr).any()), bool(np.isinf(arr).any())


def _debug_check(prog, arrays, scalars, outs):
    for o in outs:
        o.block_until_ready()
    in_nan = in_inf = False
    for a in arrays:
        n, i = _has_bad(a)
        in_nan |= n
        in_inf |= i
    inf_scalar = any(isinstance(s, float) and (s != s or s in (float("inf"), float("-inf")))
                     for s in scalars)
    for o in outs:
        n, i = _has_bad(o)
        if (n and not in_nan) or (i and not in_inf and not inf_scalar):
            what = "NaN" if n else "Inf"
            raise FloatingPointError(
                f"lazyrt debug: {prog.op if prog.op is not None else prog.name} produced {what} "
                f"(its inputs had none) at {_source.user_line(2)}")


def debug_compare(e, args, kwargs, result):
    """LAZYRT_DEBUG_COMPARE: rerun the op on CPU and report the first divergence."""
    if _divergences:
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
                _divergences.append(msg)
                warnings.warn(msg, stacklevel=3)
                return


def divergences() -> list:
    return list(_divergences)

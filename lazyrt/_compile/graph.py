"""An FX graph of ATen ops (one of AOTAutograd's forward/backward graphs) as ONE lazyrt
program.

Each graph node goes through the same op lookup (``_resolve``) and plans (``_plan``) as
eager: the node's plan is built from the node's fake-tensor metadata, and the graph's
program calls the node plans' Progs one after the other inside one JAX function. So
derived in-place/out= ops, random ops, dtype rules and Pallas routing come along, and
the graph's Prog runs through ``_values.run`` like any op: strict compiles it once
(cached executable, memory accounting, debug checks), defer records it as one node of
the pending trace (a compiled model plus an eager optimizer step is one flush).

A graph that holds something lazyrt cannot lower as one program (an op with no lowering,
a data-dependent op, a higher-order op, a device crossing) runs eagerly through the
dispatcher instead, node by node (counted in ``compiled_eager_calls``), never failing
later at a flush.
"""
from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import torch
from torch._ops import OpOverload

from .._base import dtypes as _dtypes
from .._base import rng as _rng
from .._base.ir import Prog
from .._base.metrics import COUNTERS
from .._base.tensor import Storage, TpuTensor
from .._exec import defer as _defer
from .._exec.values import concrete, host_to_device, new_tensor, run, write
from .._ops.args import rebuild, spec_of_meta, template, walk
from .._ops.control import flush_pending
from .._ops.plan import make_plan
from .._ops.resolve import resolve
from .host import _host_args, _host_value, _HostRef, _input_key, _is_cpu_tensor

_X64 = jax.enable_x64


def _abstract(shape, dtype, ref, refs: dict):
    """A node value while a graph plan is built: its aval; ``refs`` records where it
    comes from (by identity)."""
    a = jax.ShapeDtypeStruct(shape, dtype)
    refs[id(a)] = (a, ref)
    return a


def _meta_val(node):
    return node.meta.get("val")


def _is_tpu_meta(v) -> bool:
    return isinstance(v, torch.Tensor) and v.device.type == "tpu"


_COPY_ = torch.ops.aten.copy_.default


class Unsupported(Exception):
    """The graph cannot run as one lazyrt program; it runs eagerly."""


def _is_check(node) -> bool:
    """``with_effects(token, aten._linalg_check_errors, info, ...)``: PyTorch's linalg error
    check, an effect in AOT graphs."""
    return (node.target is torch.ops.higher_order.with_effects
            and node.args[1] is torch.ops.aten._linalg_check_errors.default)


def _check_graph(gm) -> str | None:
    """Why ``gm`` must run eagerly, or None."""
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if node.op != "call_function":
            return f"{node.op} node {node.name}"
        t = node.target
        if t is operator.getitem:
            continue
        if _is_check(node):
            continue
        if not isinstance(t, OpOverload):
            return f"{t} ({node.name}) is not an ATen op"
        vals = _meta_val(node)
        flat = vals if isinstance(vals, (list, tuple)) else [vals]
        if any(isinstance(v, torch.Tensor) and v.device.type not in ("tpu", "cpu")
               for v in flat):
            return f"{node.name} makes a tensor on another device"
    return None


# The flush of a compiled graph that runs alone (``_defer.isolated``).
ALONE = "a compiled graph that runs alone (its surroundings kept recompiling)"


class GraphProgram:
    """The callable AOTAutograd gets back for one graph."""

    def __init__(self, gm: torch.fx.GraphModule, kind: str):
        self.gm = gm
        self.kind = kind
        self.name = f"compiled_{kind}"
        self.reason = _check_graph(gm)
        self.plans: dict = {}
        COUNTERS["compiled_graphs"] += 1

    def __call__(self, *args):
        COUNTERS["compiled_calls"] += 1
        if self.reason is None:
            vals: list = []
            scal: list = []
            try:
                key = tuple([_input_key(a, vals, scal) for a in args])
            except RuntimeError as ex:  # a CPU tensor input of the whole graph
                self.reason = str(ex)
            else:
                plan = self.plans.get(key)
                if plan is None:
                    plan = self._plan(args, vals, scal)
                    self.plans[key] = plan
                if isinstance(plan, _GraphPlan):
                    return plan.call(args, vals, scal)
        return self._eager(args)

    def _plan(self, args, vals, scal):
        try:
            return _GraphPlan(self, args, vals, scal)
        except Unsupported as ex:
            return str(ex)

    def _eager(self, args):
        COUNTERS["compiled_eager_calls"] += 1
        return self.gm(*args)


class _GraphPlan:
    """One input signature of a graph: its Prog, the host work around it, and how to
    wrap the outputs.

    Node values are refs: ``("in", i)`` graph input i, ``("node", k)`` device step k,
    ``("host", k)`` host step k (CPU work on CPU inputs, e.g. the optimizer's step
    counters: run on the CPU at each call, as eager does), ``("hostv", j)`` host value j
    as a device input, ``("const", c)`` device constant c, ``("cpu", t)`` a CPU constant,
    ``("py", v)`` a Python value, ``("get", ref, idx)`` one output of a multi-output op.
    """

    def __init__(self, gp: GraphProgram, args, vals, scal):
        gm = gp.gm
        n_arr, n_f = len(vals), len(scal)
        # NOTE: a CPU tensor input has no device value (``_input_key``): None in the
        # template; the plan reads it on the host (``_host_ref``)
        tpl = [None if _is_cpu_tensor(a) else template(a, True) for a in args]
        self.consts: list = []  # device arrays the graph reads (constants)
        self.host_steps: list = []  # (op, args, kwargs) over refs
        self.host_inputs: list = []  # host refs fed to the device program, per call
        # NOTE: a 0-d floating or bool host value (the optimizer's bias corrections) enters
        # as a runtime scalar, not a device_put (~1 us against ~100 us per value)
        self.host_scalars: list = []  # (host ref, dtype)
        self._host_slot: dict = {}  # host ref -> its "hostv"/"hosts" ref
        self.checks: list = []  # linalg error checks, run on the host after the program
        # An inference graph's input mutations (``copy_(input, new)`` at its end): device
        # inputs take a program output after the call, host inputs a host value.
        self.mut_refs: list = []  # (input index, its new value's ref)
        self.muts: list = []  # (input index, the program output holding its new value)
        self.host_muts: list = []  # (input index, host ref)
        self.copied: dict = {}  # copy_ node -> the input it mutates
        env: dict = {}
        steps: list = []  # (plan, input refs, floats, random)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for i, node in enumerate(placeholders):
            env[node] = ("in", i)
        self.host_in = {i for i, n in enumerate(placeholders) if not _is_tpu_meta(_meta_val(n))}
        out_node = None
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                out_node = node
                break
            if node.op == "get_attr":
                env[node] = self._constant(getattr(gm, node.target))
                continue
            if node.target is operator.getitem:
                src, idx = node.args
                env[node] = ("get", env[src], idx)
                continue
            if _is_check(node):
                # NOTE: the check reads its info values on the host after the program ran
                # (a sync, as in eager); its effect token is None at run time.
                _, op, info, *rest = node.args
                self.checks.append((resolve(op).fn, env[info], _meta_val(info), rest,
                                    dict(node.kwargs)))
                env[node] = ("py", (None, None))
                continue
            if node.target is _COPY_ and node.args[0].op == "placeholder":
                env[node] = self._input_mutation(node, env, steps)
                continue
            host = self._host_node(node, env)
            if host is not None:
                env[node] = host
                continue
            env[node] = ("node", len(steps))
            steps.append(self._step(node, env))
        consts = self.consts
        self.n_random = sum(1 for s in steps if s[3])
        # Graph outputs: the prog's outputs (tensors made on the device), the inputs
        # themselves (returned as they are: exact aliasing), host values, constants.
        self.outs = []
        prog_outs = []  # refs of the program's outputs, in order
        out_avals = []  # their (shape, dtype)

        def prog_out(ref, spec) -> int:
            prog_outs.append(ref)
            out_avals.append((spec[0], _dtypes.to_jax(spec[2])))
            return len(prog_outs) - 1

        for o in out_node.args[0]:
            ref = env.get(o) if isinstance(o, torch.fx.Node) else ("py", o)
            if o in self.copied:  # the mutated input itself
                ref = ("in", self.copied[o])
            if ref[0] == "in":
                self.outs.append(("input", ref[1]))
            elif self._is_host(ref) or ref[0] in ("cpu", "py"):
                self.outs.append(("host", ref))
            else:
                v = _meta_val(o)
                if not _is_tpu_meta(v):
                    raise Unsupported(f"graph output {o.name} is not a tpu tensor")
                spec = _out_spec(v)
                self.outs.append(("prog", prog_out(ref, spec), spec))
        # then the mutated inputs' new values, then the checks' infos
        self.muts = [(i, prog_out(ref, _out_spec(_meta_val(placeholders[i]))))
                     for i, ref in self.mut_refs]
        self.check_outs = []
        for _, ref, v, _, _ in self.checks:
            spec = _out_spec(v)
            self.check_outs.append((prog_out(ref, spec), spec))
        out_avals = tuple(out_avals)
        n_c, n_h = len(consts), len(self.host_inputs)
        n_in = n_arr + n_c + n_h
        n_hs = len(self.host_scalars)
        hs_dtypes = [dt for _, dt in self.host_scalars]

        def graph_fn(*flat):
            inputs = rebuild(tpl, iter(flat[:n_arr]), iter(flat[n_in:n_in + n_f]))
            const_vals = flat[n_arr:n_arr + n_c]
            host_vals = flat[n_arr + n_c:n_in]
            host_scal = [jnp.asarray(x, dt) for x, dt in
                         zip(flat[n_in + n_f:n_in + n_f + n_hs], hs_dtypes)]
            seeds = iter(flat[n_in + n_f + n_hs:])
            results = []

            def value(ref):
                kind = ref[0]
                if kind == "in":
                    return inputs[ref[1]]
                if kind == "node":
                    return results[ref[1]]
                if kind == "const":
                    return const_vals[ref[1]]
                if kind == "hostv":
                    return host_vals[ref[1]]
                if kind == "hosts":
                    return host_scal[ref[1]]
                if kind == "get":
                    return value(ref[1])[ref[2]]
                return ref[1]  # "py": a Python value

            for plan, refs, floats, random in steps:
                ins = [value(r) for r in refs]
                extra = [next(seeds)] if random else []
                results.append(_structure(plan, plan.prog.fn(*ins, *floats, *extra)))
            return tuple(value(r) for r in prog_outs)

        kinds = ("f",) * (n_f + n_hs) + ("i",) * self.n_random
        self.prog = Prog(gp.name, graph_fn, kinds, out_avals,
                         desc=f"{len(steps)} ops", op=None)
        self.prog.graph = True

    # ---- building ----------------------------------------------------------------------

    def _constant(self, value):
        if isinstance(value, TpuTensor):
            self.consts.append(concrete(value))
            return ("const", len(self.consts) - 1)
        if isinstance(value, torch.Tensor):
            return ("cpu", value)
        return ("py", value)

    def _is_host(self, ref) -> bool:
        kind = ref[0]
        if kind == "get":
            return self._is_host(ref[1])
        return kind in ("host", "cpu", "py") or (kind == "in" and ref[1] in self.host_in)

    def _host_node(self, node, env):
        """A node computing on the host (CPU inputs, CPU output): its ref, folded to a
        constant when its inputs are constants; None for a device node."""
        v = _meta_val(node)
        flat = v if isinstance(v, (list, tuple)) else [v]
        if any(_is_tpu_meta(x) for x in flat):
            return None
        ins = [a for a in torch.utils._pytree.tree_leaves((node.args, node.kwargs))
               if isinstance(a, torch.fx.Node)]
        if not all(self._is_host(env[a]) for a in ins):
            raise Unsupported(f"{node.name} moves device values to the host inside the graph")
        def ref(a):
            return _HostRef(env[a]) if isinstance(a, torch.fx.Node) else a

        args = torch.fx.node.map_aggregate(node.args, ref)
        kwargs = torch.fx.node.map_aggregate(node.kwargs, ref)
        if all(env[a][0] in ("cpu", "py") for a in ins):
            return ("cpu", node.target(*_host_args(args, {}, ()), **_host_args(kwargs, {}, ())))
        self.host_steps.append((node.target, args, kwargs))
        return ("host", len(self.host_steps) - 1)

    def _input_mutation(self, node, env, steps):
        """``copy_(input i, src)``: the ref of i's new value (what later nodes read), kept
        to be written into input i after the program (``call``)."""
        dst, src = node.args[0], node.args[1]
        i = env[dst][1]
        self.copied[node] = i
        if not isinstance(src, torch.fx.Node):
            raise Unsupported(f"{node.name} copies a non-tensor into an input")
        sref = env[src]
        if i in self.host_in:
            if not self._is_host(sref):
                raise Unsupported(f"{node.name} copies a device value into a CPU input")
            self.host_muts.append((i, sref))
            return sref
        dv, sv = _meta_val(dst), _meta_val(src)
        if not (_is_tpu_meta(sv) and sv.shape == dv.shape and sv.dtype == dv.dtype):
            # a cast, a broadcast or a host value: aten.copy makes the new value
            sref = ("node", len(steps))
            steps.append(self._step(node, env, op=torch.ops.aten.copy.default))
        self.mut_refs.append((i, sref))
        return sref

    def _host_ref(self, ref, spec):
        """The device program's ref for host value ``ref`` (shape/stride/dtype ``spec``):
        each host value enters once, a 0-d floating or bool one as a runtime scalar."""
        slot = self._host_slot.get(ref)
        if slot is None:
            dtype = spec[2]
            if spec[0] == () and (dtype.is_floating_point or dtype is torch.bool):
                self.host_scalars.append((ref, _dtypes.to_jax(dtype)))
                slot = ("hosts", len(self.host_scalars) - 1)
            else:
                self.host_inputs.append(ref)
                slot = ("hostv", len(self.host_inputs) - 1)
            self._host_slot[ref] = slot
        return slot

    def _step(self, node, env, op=None):
        op = node.target if op is None else op
        e = resolve(op)
        if e.fn is None or e.data_dependent or e.mut:
            raise Unsupported(f"{op} ({e.resolution.how}) cannot be part of a compiled program")
        abstract_refs: dict = {}

        def abstract(a):
            if isinstance(a, torch.fx.Node):
                ref = env[a]
                if ref[0] in ("cpu", "py"):
                    return ref[1]
                v = _meta_val(a)
                if not isinstance(v, torch.Tensor):
                    raise Unsupported(f"{a.name} is not a tensor")
                spec = _out_spec(v)
                if self._is_host(ref):
                    ref = self._host_ref(ref, spec)
                aval = _abstract(spec[0], _dtypes.to_jax(spec[2]), ref, abstract_refs)
                return TpuTensor._wrap(spec, Storage(aval))
            # NOTE: FX keeps list arguments as immutable_list, which the argument walk
            # would take for a constant: plain lists and tuples here.
            if isinstance(a, list):
                return [abstract(x) for x in a]
            if isinstance(a, tuple):
                return tuple(abstract(x) for x in a)
            return a

        args = abstract(tuple(node.args))
        kwargs = {k: abstract(v) for k, v in node.kwargs.items()}
        vals: list = []
        scal: list = []
        dyn = not e.static_floats
        for a in args:
            walk(e, a, vals, scal, dyn)
        for v in kwargs.values():
            walk(e, v, vals, scal, dyn)
        try:
            plan = make_plan(e, args, kwargs, vals, scal, fold=False)
        except Exception as ex:  # eager raises PyTorch's own error for this node
            raise Unsupported(f"{op}: {type(ex).__name__}: {ex}") from ex
        refs = []
        for v in vals:
            if id(v) in abstract_refs:
                refs.append(abstract_refs[id(v)][1])
            else:  # a CPU tensor argument, moved to the device once
                self.consts.append(v)
                refs.append(("const", len(self.consts) - 1))
        return plan, tuple(refs), tuple(scal), e.random

    # ---- running -----------------------------------------------------------------------

    def call(self, args, vals, scal):
        host: list = []
        for op, a, kw in self.host_steps:
            host.append(op(*_host_args(a, host, args), **_host_args(kw, host, args)))
        hv = [host_to_device(_host_value(r, host, args)) for r in self.host_inputs]
        inputs = vals + self.consts + hv
        hs = [float(_host_value(r, host, args)) for r, _ in self.host_scalars]
        scal = scal + hs + [_rng.next_seed() for _ in range(self.n_random)]
        # NOTE: only defer flushes count misses; flush_pending is a no-op in other modes
        alone = _defer.isolated(self.prog)
        if alone:
            flush_pending("before a compiled graph that runs alone")
        outs = run(self.prog, inputs, scal)
        res = []
        for o in self.outs:
            kind = o[0]
            if kind == "prog":
                res.append(new_tensor(outs[o[1]], o[2]))
            elif kind == "input":
                res.append(args[o[1]])
            else:
                res.append(_host_value(o[1], host, args))
        # NOTE: after the outputs are tensors: reading a check's value flushes the trace
        # (defer), which materializes only values that live tensors hold.
        for i, k in self.muts:
            t = args[i]
            write(t, outs[k])
            torch.autograd.graph.increment_version(t)  # as the in-place copy_ does
        for i, ref in self.host_muts:
            args[i].copy_(_host_value(ref, host, args))
        infos = [new_tensor(outs[k], spec) for k, spec in self.check_outs]
        if alone:
            flush_pending(ALONE)
        for (fn, _, _, rest, kw), info in zip(self.checks, infos):
            fn(concrete(info), *rest, **kw)
        return res


def _out_spec(v) -> tuple:
    shape, stride, dtype, _ = spec_of_meta(v)
    return (shape, stride, dtype, 0)


def _structure(plan, flat):
    """A node plan's flat outputs in the shape of the op's returns."""
    layout = plan.layout
    if layout.single is not None:
        return flat[0]
    res, i = [], 0
    for s, k in zip(layout.fresh, layout.kinds):
        if k == "TL":
            res.append(list(flat[i:i + len(s)]))
            i += len(s)
        elif k == "T":
            if s is None:
                res.append(None)
            else:
                res.append(flat[i])
                i += 1
        else:
            res.append(s)
    return res[0] if layout.n_returns == 1 else tuple(res)


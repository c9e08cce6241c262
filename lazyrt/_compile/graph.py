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

from .._base import dtypes as _dtypes
from .._base import rng as _rng
from .._base.ir import Prog
from .._base.metrics import COUNTERS
from .._base.tensor import Storage, TpuTensor
from .._exec import defer as _defer
from .._exec.values import concrete, host_to_device, new_tensor, run, write
from .._ops.args import rebuild, template
from .._ops.control import flush_pending
from .._ops.plan import make_plan
from .._ops.resolve import resolve
from . import flex as _flex
from .checks import entry as check_entry
from .checks import is_check
from .checks import result as check_result
from .host import _host_args, _host_value, _HostRef, _input_key, _is_cpu_tensor
from .nodes import Unsupported, check_graph, is_tpu_meta, meta_val, out_spec, structure
from .symbolic import GraphSymbols, RuntimeInt, Slot, Specialize, concretize, free_symbols
from .symbolic import walk_node_arg as _walk_arg

_X64 = jax.enable_x64


def _abstract(shape, dtype, ref, refs: dict):
    """A node value while a graph plan is built: its aval; ``refs`` records where it
    comes from (by identity)."""
    a = jax.ShapeDtypeStruct(shape, dtype)
    refs[id(a)] = (a, ref)
    return a


_COPY_ = torch.ops.aten.copy_.default


# The flush of a compiled graph that runs alone (``_defer.isolated``).
ALONE = "a compiled graph that runs alone (its surroundings kept recompiling)"
# The flush of the work pending before a graph's first call.
FIRST = "before a compiled graph's first call"


class GraphProgram:
    """The callable AOTAutograd gets back for one graph."""

    def __init__(self, gm: torch.fx.GraphModule, kind: str):
        self.gm = gm
        self.kind = kind
        self.name = f"compiled_{kind}"
        self.reason = check_graph(gm)
        self.symbols = GraphSymbols(gm)
        self.plans: dict = {}
        COUNTERS["compiled_graphs"] += 1

    def __call__(self, *args):
        COUNTERS["compiled_calls"] += 1
        while self.reason is None:
            vals: list = []
            scal: list = []
            rt = self.symbols.runtime_inputs
            try:
                if rt:  # runtime ints: fed to the program, not part of the key
                    key = tuple([int if i in rt else _input_key(a, vals, scal)
                                 for i, a in enumerate(args)])
                else:
                    key = tuple([_input_key(a, vals, scal) for a in args])
            except RuntimeError as ex:  # a CPU tensor input of the whole graph
                self.reason = str(ex)
                break
            plan = self.plans.get(key)
            if plan is None:
                try:
                    plan = _GraphPlan(self, args, vals, scal)
                except Specialize as ex:  # constants from now on: plan again
                    self.symbols.make_static(ex.symbols)
                    self.plans.clear()
                    continue
                except Unsupported as ex:
                    plan = str(ex)
                self.plans[key] = plan
            if isinstance(plan, _GraphPlan):
                return plan.call(args, vals, scal)
            break
        return self._eager(args)

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
        # symbol -> value: runtime ones only as examples for meta kernels (``symbolic``)
        self.subs = gp.symbols.values(args)
        self.static_syms = gp.symbols.static
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
        # host refs of the graph's symbolic scalars, runtime inputs: (ref, "i" or "f")
        self.host_rt: list = []
        self._host_slot: dict = {}  # host ref -> its "hostv"/"hosts" ref
        self.checks: list = []  # linalg checks and asserts (``checks.entry``)
        self.first = True  # not called yet
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
        self.host_in = {i for i, n in enumerate(placeholders) if not is_tpu_meta(meta_val(n))}
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
            if is_check(node):
                self.checks.append(check_entry(node, env))
                env[node] = ("py", check_result(node))
                continue
            if node.target in _flex.HOPS:
                env[node] = ("node", len(steps))
                try:
                    steps.append(_flex.step(node, env, self))
                except Exception as ex:  # eagerly, the HOP's tpu rule runs it
                    raise Unsupported(f"{node.name}: {type(ex).__name__}: {ex}") from ex
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
                v = meta_val(o)
                if not is_tpu_meta(v):
                    raise Unsupported(f"graph output {o.name} is not a tpu tensor")
                spec = self._spec(v)
                self.outs.append(("prog", prog_out(ref, spec), spec))
        # then the mutated inputs' new values, then the checks' infos
        self.muts = [(i, prog_out(ref, self._spec(meta_val(placeholders[i]))))
                     for i, ref in self.mut_refs]
        self.check_outs = []
        for _, ref, info, _, _ in self.checks:
            spec = self._spec(meta_val(info))
            self.check_outs.append((prog_out(ref, spec), spec))
        out_avals = tuple(out_avals)
        n_c, n_h = len(consts), len(self.host_inputs)
        n_in = n_arr + n_c + n_h
        n_hs, n_hi = len(self.host_scalars), len(self.host_rt)
        hs_dtypes = [dt for _, dt in self.host_scalars]
        rt_ints = [k == "i" for _, k in self.host_rt]

        def graph_fn(*flat):
            inputs = rebuild(tpl, iter(flat[:n_arr]), iter(flat[n_in:n_in + n_f]))
            const_vals = flat[n_arr:n_arr + n_c]
            host_vals = flat[n_arr + n_c:n_in]
            o = n_in + n_f
            host_scal = [jnp.asarray(x, dt) for x, dt in zip(flat[o:o + n_hs], hs_dtypes)]
            # NOTE: a runtime float stays as it comes (weak-typed, as in eager)
            host_rt = [jnp.asarray(x, jnp.int64) if i else x
                       for x, i in zip(flat[o + n_hs:o + n_hs + n_hi], rt_ints)]
            seeds = iter(flat[o + n_hs + n_hi:])
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
                if kind == "hostr":
                    return host_rt[ref[1]]
                if kind == "get":
                    return value(ref[1])[ref[2]]
                return ref[1]  # "py": a Python value

            for plan, refs, floats, random in steps:
                ins = [value(r) for r in refs]
                floats = [value(f.ref) if type(f) is Slot else f for f in floats]
                extra = [next(seeds)] if random else []
                results.append(structure(plan, plan.prog.fn(*ins, *floats, *extra)))
            return tuple(value(r) for r in prog_outs)

        kinds = ("f",) * (n_f + n_hs) + tuple(k for _, k in self.host_rt) + (
            ("i",) * self.n_random)
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

    def _spec(self, v) -> tuple:
        """A tensor node value's (shape, stride, dtype, 0), symbols made concrete."""
        return concretize(out_spec(v), self.subs)

    def _is_static(self, v) -> bool:
        return free_symbols(v) <= self.static_syms

    def _host_node(self, node, env):
        """A node computing on the host (CPU inputs, CPU output): its ref, folded to a
        constant when its inputs are constants; None for a device node."""
        v = meta_val(node)
        if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool) and self._is_static(v):
            return ("py", concretize(v, self.subs))
        flat = v if isinstance(v, (list, tuple)) else [v]
        if any(is_tpu_meta(x) for x in flat):
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
        dv, sv = meta_val(dst), meta_val(src)
        if not (is_tpu_meta(sv) and self._spec(sv)[0] == self._spec(dv)[0]
                and sv.dtype == dv.dtype):
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

    def _host_scalar(self, ref, kind):
        """The device program's ref for runtime scalar ``ref`` (a symbolic int, ``kind``
        "i", or float, "f", computed on the host), entering once."""
        slot = self._host_slot.get(ref)
        if slot is None:
            self.host_rt.append((ref, kind))
            slot = self._host_slot[ref] = ("hostr", len(self.host_rt) - 1)
        return slot

    def device_ref(self, a, env):
        """The program's ref of tensor node ``a``: a CPU constant moves to the device once,
        a host value enters as an input (a custom step's argument: ``_flex``)."""
        ref = env[a]
        if ref[0] == "cpu":
            self.consts.append(host_to_device(ref[1]))
            return ("const", len(self.consts) - 1)
        return self._host_ref(ref, self._spec(meta_val(a))) if self._is_host(ref) else ref

    def _step(self, node, env, op=None):
        op = node.target if op is None else op
        e = resolve(op)
        if e.fn is None or e.data_dependent or e.mut:
            raise Unsupported(f"{op} ({e.resolution.how}) cannot be part of a compiled program")
        abstract_refs: dict = {}
        runtime: dict = {}  # id(runtime scalar) -> (its Slot, its symbols, itself)

        def abstract(a):
            if isinstance(a, torch.fx.Node):
                ref = env[a]
                if ref[0] in ("cpu", "py"):
                    return ref[1]
                v = meta_val(a)
                if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
                    if self._is_static(v):
                        return concretize(v, self.subs)
                    if isinstance(v, torch.SymBool):
                        raise Specialize(free_symbols(v))
                    # NOTE: a runtime float is a float object of its own, found by identity
                    # among the plan's scalars
                    fl = isinstance(v, torch.SymFloat)
                    r = float(concretize(v, self.subs)) if fl else RuntimeInt(
                        concretize(v, self.subs))
                    slot = Slot(self._host_scalar(ref, "f" if fl else "i"))
                    runtime[id(r)] = (slot, free_symbols(v), r)
                    return r
                if not isinstance(v, torch.Tensor):
                    raise Unsupported(f"{a.name} is not a tensor")
                spec = self._spec(v)
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
        if runtime and not dyn and any(type(r) is float for _, _, r in runtime.values()):
            raise Specialize(set().union(*(s for _, s, _ in runtime.values())))
        for a in args:
            _walk_arg(e, a, vals, scal, dyn)
        for v in kwargs.values():
            _walk_arg(e, v, vals, scal, dyn)
        try:
            plan = make_plan(e, args, kwargs, vals, scal, fold=False)
        except Exception as ex:  # eager raises PyTorch's own error for this node
            if runtime:  # perhaps only as a runtime int: try these symbols as constants
                raise Specialize(set().union(*(s for _, s, _ in runtime.values()))) from ex
            raise Unsupported(f"{op}: {type(ex).__name__}: {ex}") from ex
        scal = [runtime[id(x)][0] if id(x) in runtime else x for x in scal]
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
        # NOTE: the pending trace's lock from recording the program to wrapping and writing
        # its outputs, as the dispatcher holds it for an op (another thread's flush must not
        # split the two).
        with _defer.LOCK:
            return self._call(args, vals, scal)

    def _call(self, args, vals, scal):
        host: list = []
        for op, a, kw in self.host_steps:
            host.append(op(*_host_args(a, host, args), **_host_args(kw, host, args)))
        hv = [host_to_device(_host_value(r, host, args)) for r in self.host_inputs]
        inputs = vals + self.consts + hv
        hs = [float(_host_value(r, host, args)) for r, _ in self.host_scalars]
        hs += [int(_host_value(r, host, args)) if k == "i" else float(_host_value(r, host, args))
               for r, k in self.host_rt]
        scal = scal + hs + [_rng.next_seed() for _ in range(self.n_random)]
        # NOTE: only defer flushes count misses; flush_pending is a no-op in other modes
        alone = _defer.isolated(self.prog)
        if alone:
            flush_pending("before a compiled graph that runs alone")
        elif self.first:
            self.first = False
            if not _defer.holds_graph():
                # NOTE: what is pending before a graph's first call (work done once, such
                # as parameter transfers, and what Dynamo's tracing made) runs on its own:
                # fused with it, the first call's program would differ from every later
                # call's. Not when the trace holds a graph already (a training step's
                # backward graph after its forward): the step must stay one program.
                flush_pending(FIRST)
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
        for (call, _, _, rest, kw), info in zip(self.checks, infos):
            call(info, *rest, **kw)
        return res

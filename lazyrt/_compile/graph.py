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
from .checks import insert_bounds_checks, insert_division_checks, is_check
from .checks import result as check_result
from .host import _host_args, _HostRef, _input_key, _is_cpu_tensor
from .nodes import Unsupported, check_graph, is_tpu_meta, meta_val, out_spec, structure
from .refs import Kind, Ref, is_host, is_literal, value
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
        insert_bounds_checks(gm)
        insert_division_checks(gm)
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
    wrap the outputs. Node values are ``refs.Ref``s (graph inputs, device steps, host
    steps, constants, ...): ``env`` maps each graph node to its value's ref.
    """

    def __init__(self, gp: GraphProgram, args, vals, scal):
        # symbol -> value: runtime ones only as examples for meta kernels (``symbolic``)
        self.subs = gp.symbols.values(args)
        self.static_syms = gp.symbols.static
        self.consts: list = []  # device arrays the graph reads (constants)
        self.host_steps: list = []  # (op, args, kwargs) over refs
        self.host_inputs: list = []  # host refs fed to the device program, per call
        # NOTE: a 0-d floating or bool host value (the optimizer's bias corrections) enters
        # as a runtime scalar, not a device_put (~1 us against ~100 us per value)
        self.host_scalars: list = []  # (host ref, dtype)
        # host refs of the graph's symbolic scalars, runtime inputs: (ref, "i" or "f")
        self.host_rt: list = []
        self._host_slot: dict = {}  # host ref -> its HOSTV/HOSTS/HOSTR ref
        self.checks: list = []  # linalg checks and asserts (``checks.entry``)
        self.first = True  # not called yet
        # An inference graph's input mutations (``copy_(input, new)`` at its end): device
        # inputs take a program output after the call, host inputs a host value.
        self.mut_refs: list = []  # (input index, its new value's ref)
        self.muts: list = []  # (input index, the program output holding its new value)
        self.host_muts: list = []  # (input index, host ref)
        self.copied: dict = {}  # copy_ node -> the input it mutates
        # NOTE: a CPU tensor input has no device value (``_input_key``): None in the
        # template; the plan reads it on the host (``_host_ref``)
        tpl = [None if _is_cpu_tensor(a) else template(a, True) for a in args]
        placeholders = [n for n in gp.gm.graph.nodes if n.op == "placeholder"]
        self.host_in = {i for i, n in enumerate(placeholders) if not is_tpu_meta(meta_val(n))}
        env, steps, out_node = self._walk(gp.gm, placeholders)
        self.n_random = sum(1 for s in steps if s[3])
        prog_outs, out_avals = self._outputs(out_node, env, placeholders)
        # the inputs' runtime scalars: floats, and views' positions (ints)
        in_kinds = tuple("i" if type(x) is RuntimeInt else "f" for x in scal)
        self.prog = self._program(gp.name, tpl, len(vals), in_kinds, steps, prog_outs,
                                  out_avals)

    def _walk(self, gm, placeholders):
        """Each graph node's ref (``env``), the device steps ``(plan, input refs, floats,
        random)`` and the output node."""
        env: dict = {node: Ref(Kind.IN, i) for i, node in enumerate(placeholders)}
        steps: list = []
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                return env, steps, node
            if node.op == "get_attr":
                env[node] = self._constant(getattr(gm, node.target))
            elif node.target is operator.getitem:
                src, idx = node.args
                env[node] = Ref(Kind.GET, env[src], idx)
            elif is_check(node):
                self.checks.append(check_entry(node, env))
                env[node] = Ref(Kind.PY, check_result(node))
            elif node.target in _flex.HOPS:
                env[node] = Ref(Kind.NODE, len(steps))
                try:
                    steps.append(_flex.step(node, env, self))
                except Exception as ex:  # eagerly, the HOP's tpu rule runs it
                    raise Unsupported(f"{node.name}: {type(ex).__name__}: {ex}") from ex
            elif node.target is _COPY_ and node.args[0].op == "placeholder":
                env[node] = self._input_mutation(node, env, steps)
            else:
                host = self._host_node(node, env)
                if host is None:
                    host = Ref(Kind.NODE, len(steps))
                    steps.append(self._step(node, env))
                env[node] = host
        return env, steps, None

    def _outputs(self, out_node, env, placeholders):
        """``self.outs`` (how each graph output is made), ``self.muts``, ``self.check_outs``;
        returns the refs of the program's outputs and their (shape, dtype)s.

        Graph outputs: the prog's outputs (tensors made on the device), the inputs
        themselves (returned as they are: exact aliasing), host values, constants."""
        self.outs = []
        prog_outs = []  # refs of the program's outputs, in order
        out_avals = []  # their (shape, dtype)

        def prog_out(ref, spec) -> int:
            prog_outs.append(ref)
            out_avals.append((spec[0], _dtypes.to_jax(spec[2])))
            return len(prog_outs) - 1

        for o in out_node.args[0]:
            ref = env.get(o) if isinstance(o, torch.fx.Node) else Ref(Kind.PY, o)
            if o in self.copied:  # the mutated input itself
                ref = Ref(Kind.IN, self.copied[o])
            if ref.kind is Kind.IN:
                self.outs.append(("input", ref.at))
            elif self._is_host(ref) or is_literal(ref):
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
        return prog_outs, tuple(out_avals)

    def _program(self, name, tpl, n_arr, in_kinds, steps, prog_outs, out_avals) -> Prog:
        """The graph's Prog: ``graph_fn(*arrays, *consts, *host values, *floats, *host
        scalars, *runtime scalars, *seeds)`` runs the steps and returns ``prog_outs``."""
        n_c, n_h, n_f = len(self.consts), len(self.host_inputs), len(in_kinds)
        n_in = n_arr + n_c + n_h
        n_hs, n_hi = len(self.host_scalars), len(self.host_rt)
        hs_dtypes = [dt for _, dt in self.host_scalars]
        rt_ints = [k == "i" for _, k in self.host_rt]

        def graph_fn(*flat):
            inputs = rebuild(tpl, iter(flat[:n_arr]), iter(flat[n_in:n_in + n_f]))
            o = n_in + n_f
            host_scal = [jnp.asarray(x, dt) for x, dt in zip(flat[o:o + n_hs], hs_dtypes)]
            # NOTE: a runtime float stays as it comes (weak-typed, as in eager)
            host_rt = [jnp.asarray(x, jnp.int64) if i else x
                       for x, i in zip(flat[o + n_hs:o + n_hs + n_hi], rt_ints)]
            seeds = iter(flat[o + n_hs + n_hi:])
            results = []
            # indexed by Kind: IN, NODE, HOST (none here), HOSTV, HOSTS, HOSTR, CONST
            tables = (inputs, results, None, flat[n_arr + n_c:n_in], host_scal, host_rt,
                      flat[n_arr:n_arr + n_c])
            for plan, refs, floats, random in steps:
                ins = [value(r, tables) for r in refs]
                floats = [value(f.ref, tables) if type(f) is Slot else f for f in floats]
                extra = [next(seeds)] if random else []
                results.append(structure(plan, plan.prog.fn(*ins, *floats, *extra)))
            return tuple(value(r, tables) for r in prog_outs)

        kinds = in_kinds + ("f",) * n_hs + tuple(k for _, k in self.host_rt) + (
            ("i",) * self.n_random)
        prog = Prog(name, graph_fn, kinds, out_avals, desc=f"{len(steps)} ops", op=None)
        prog.graph = True
        return prog

    # ---- building ----------------------------------------------------------------------

    def _constant(self, value):
        if isinstance(value, TpuTensor):
            self.consts.append(concrete(value))
            return Ref(Kind.CONST, len(self.consts) - 1)
        if isinstance(value, torch.Tensor):
            return Ref(Kind.CPU, value)
        return Ref(Kind.PY, value)

    def _is_host(self, ref: Ref) -> bool:
        return is_host(ref, self.host_in)

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
            return Ref(Kind.PY, concretize(v, self.subs))
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
        if all(is_literal(env[a]) for a in ins):
            return Ref(Kind.CPU, node.target(*_host_args(args, ()), **_host_args(kwargs, ())))
        self.host_steps.append((node.target, args, kwargs))
        return Ref(Kind.HOST, len(self.host_steps) - 1)

    def _input_mutation(self, node, env, steps):
        """``copy_(input i, src)``: the ref of i's new value (what later nodes read), kept
        to be written into input i after the program (``call``)."""
        dst, src = node.args[0], node.args[1]
        i = env[dst].at
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
            sref = Ref(Kind.NODE, len(steps))
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
                slot = Ref(Kind.HOSTS, len(self.host_scalars) - 1)
            else:
                self.host_inputs.append(ref)
                slot = Ref(Kind.HOSTV, len(self.host_inputs) - 1)
            self._host_slot[ref] = slot
        return slot

    def _host_scalar(self, ref, kind):
        """The device program's ref for runtime scalar ``ref`` (a symbolic int, ``kind``
        "i", or float, "f", computed on the host), entering once."""
        slot = self._host_slot.get(ref)
        if slot is None:
            self.host_rt.append((ref, kind))
            slot = self._host_slot[ref] = Ref(Kind.HOSTR, len(self.host_rt) - 1)
        return slot

    def device_ref(self, a, env):
        """The program's ref of tensor node ``a``: a CPU constant moves to the device once,
        a host value enters as an input (a custom step's argument: ``_flex``)."""
        ref = env[a]
        if ref.kind is Kind.CPU:
            self.consts.append(host_to_device(ref.at))
            return Ref(Kind.CONST, len(self.consts) - 1)
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
                if is_literal(ref):
                    return ref.at
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
                refs.append(Ref(Kind.CONST, len(self.consts) - 1))
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
        tables = (args, None, host)  # ``refs.value`` on the host: IN, NODE (none), HOST
        for op, a, kw in self.host_steps:
            host.append(op(*_host_args(a, tables), **_host_args(kw, tables)))
        hv = [host_to_device(value(r, tables)) for r in self.host_inputs]
        inputs = vals + self.consts + hv
        hs = [float(value(r, tables)) for r, _ in self.host_scalars]
        hs += [int(value(r, tables)) if k == "i" else float(value(r, tables))
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
                res.append(value(o[1], tables))
        # NOTE: after the outputs are tensors: reading a check's value flushes the trace
        # (defer), which materializes only values that live tensors hold.
        for i, k in self.muts:
            t = args[i]
            write(t, outs[k])
            torch.autograd.graph.increment_version(t)  # as the in-place copy_ does
        for i, ref in self.host_muts:
            args[i].copy_(value(ref, tables))
        infos = [new_tensor(outs[k], spec) for k, spec in self.check_outs]
        if alone:
            flush_pending(ALONE)
        for (call, _, _, rest, kw), info in zip(self.checks, infos):
            call(info, *rest, **kw)
        return res

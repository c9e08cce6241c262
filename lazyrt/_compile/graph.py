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
import torch
from torch._ops import OpOverload

from .. import _dtypes, _rng
from .._args import rebuild, spec_of_meta, template, walk
from .._ir import Prog
from .._plan import make_plan
from .._resolve import resolve
from .._tensor import Storage, TpuTensor
from .._values import concrete, new_tensor, run
from ..metrics import COUNTERS

_X64 = jax.enable_x64


def _abstract(shape, dtype, ref, refs: dict):
    """A node value while a graph plan is built: its aval; ``refs`` records where it
    comes from (by identity)."""
    a = jax.ShapeDtypeStruct(shape, dtype)
    refs[id(a)] = (a, ref)
    return a


class _GraphEntry:
    """What ``_args.walk`` needs of an op, for a graph's own inputs."""

    name = "torch.compile graph"
    packet = "compiled_graph"


_ENTRY = _GraphEntry()


def _meta_val(node):
    return node.meta.get("val")


def _is_tpu_meta(v) -> bool:
    return isinstance(v, torch.Tensor) and v.device.type == "tpu"


class Unsupported(Exception):
    """The graph cannot run as one lazyrt program; it runs eagerly."""


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
        if not isinstance(t, OpOverload):
            return f"{t} ({node.name}) is not an ATen op"
        vals = _meta_val(node)
        flat = vals if isinstance(vals, (list, tuple)) else [vals]
        if any(isinstance(v, torch.Tensor) and v.device.type not in ("tpu", "cpu")
               for v in flat):
            return f"{node.name} makes a tensor on another device"
    return None


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
                key = tuple([walk(_ENTRY, a, vals, scal, True) for a in args])
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
    """One input signature of a graph: its Prog and how to wrap the outputs."""

    def __init__(self, gp: GraphProgram, args, vals, scal):
        gm = gp.gm
        n_arr, n_f = len(vals), len(scal)
        tpl = template(list(args), True)
        consts: list = []  # device arrays the graph reads (constants), after the inputs
        env: dict = {}  # node -> ("in", i) | ("node", k) | ("get", ref, idx) | ("cpu", tensor)
        steps: list = []  # (plan, input refs, floats, random)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for i, node in enumerate(placeholders):
            env[node] = ("in", i)
        out_node = None
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                out_node = node
                break
            if node.op == "get_attr":
                env[node] = self._constant(getattr(gm, node.target), consts)
                continue
            if node.target is operator.getitem:
                src, idx = node.args
                env[node] = ("get", env[src], idx)
                continue
            folded = self._fold_cpu(node, env)
            if folded is not None:
                env[node] = folded
                continue
            env[node] = ("node", len(steps))
            steps.append(self._step(node, env, consts))
        self.n_arr, self.n_f, self.n_consts = n_arr, n_f, len(consts)
        self.consts = consts
        self.n_random = sum(1 for s in steps if s[3])
        outs = out_node.args[0]
        # Graph outputs: the prog's outputs (tensors made by the graph), the inputs
        # themselves (returned as they are: exact aliasing), constants.
        self.outs = []
        prog_outs = []
        for o in outs:
            if isinstance(o, torch.fx.Node) and o.op == "placeholder":
                self.outs.append(("input", placeholders.index(o)))
            elif isinstance(o, torch.fx.Node):
                v = _meta_val(o)
                if not _is_tpu_meta(v):
                    raise Unsupported(f"graph output {o.name} is not a tpu tensor")
                self.outs.append(("prog", len(prog_outs), _out_spec(v)))
                prog_outs.append(env[o])
            else:
                self.outs.append(("const", o))
        out_avals = tuple((s[0], _dtypes.to_jax(s[2])) for _, _, s in
                          (x for x in self.outs if x[0] == "prog"))
        n_in = n_arr + len(consts)

        def graph_fn(*flat):
            arrs = iter(flat[:n_in])
            inputs = rebuild(tpl, arrs, iter(flat[n_in:n_in + n_f]))
            const_vals = list(flat[n_arr:n_in])
            seeds = iter(flat[n_in + n_f:])
            results = []

            def value(ref):
                kind = ref[0]
                if kind == "in":
                    return inputs[ref[1]]
                if kind == "node":
                    return results[ref[1]]
                if kind == "const":
                    return const_vals[ref[1]]
                if kind == "get":
                    return value(ref[1])[ref[2]]
                return ref[1]  # "py": a Python value

            for plan, refs, floats, random in steps:
                ins = [value(r) for r in refs]
                extra = [next(seeds)] if random else []
                results.append(_structure(plan, plan.prog.fn(*ins, *floats, *extra)))
            return tuple(value(r) for r in prog_outs)

        kinds = ("f",) * n_f + ("i",) * self.n_random
        self.prog = Prog(gp.name, graph_fn, kinds, out_avals,
                         desc=f"{len(steps)} ops", op=None)

    # ---- building ----------------------------------------------------------------------

    @staticmethod
    def _constant(value, consts):
        if isinstance(value, TpuTensor):
            consts.append(concrete(value))
            return ("const", len(consts) - 1)
        if isinstance(value, torch.Tensor):
            return ("cpu", value)
        return ("py", value)

    @staticmethod
    def _fold_cpu(node, env):
        """A node computing on CPU constants only (a lifted index list): run it now."""
        v = _meta_val(node)
        flat = v if isinstance(v, (list, tuple)) else [v]
        if any(_is_tpu_meta(x) for x in flat):
            return None
        leaves = torch.utils._pytree.tree_leaves((node.args, node.kwargs))
        if not all(env[a][0] == "cpu" for a in leaves if isinstance(a, torch.fx.Node)):
            raise Unsupported(f"{node.name} computes on the host inside the graph")

        def real(a):
            return env[a][1] if isinstance(a, torch.fx.Node) else a

        args = torch.fx.node.map_aggregate(node.args, real)
        kwargs = torch.fx.node.map_aggregate(node.kwargs, real)
        return ("cpu", node.target(*args, **kwargs))

    @staticmethod
    def _step(node, env, consts):
        op = node.target
        e = resolve(op)
        if e.fn is None or e.data_dependent or e.mut:
            raise Unsupported(f"{op} ({e.resolution.how}) cannot be part of a compiled program")

        abstract_refs: dict = {}

        def abstract(a):
            if isinstance(a, torch.fx.Node):
                ref = env[a]
                if ref[0] == "cpu":
                    return ref[1]
                if ref[0] == "py":
                    return ref[1]
                v = _meta_val(a)
                if not isinstance(v, torch.Tensor):
                    raise Unsupported(f"{a.name} is not a tensor")
                spec = _out_spec(v)
                aval = _abstract(spec[0], _dtypes.to_jax(spec[2]), ref, abstract_refs)
                return TpuTensor(spec, Storage(aval))
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
                consts.append(v)
                refs.append(("const", len(consts) - 1))
        return plan, tuple(refs), tuple(scal), e.random

    # ---- running -----------------------------------------------------------------------

    def call(self, args, vals, scal):
        inputs = vals + self.consts
        scal = scal + [_rng.next_seed() for _ in range(self.n_random)]
        outs = run(self.prog, inputs, scal)
        res = []
        for o in self.outs:
            kind = o[0]
            if kind == "prog":
                res.append(new_tensor(outs[o[1]], o[2]))
            elif kind == "input":
                res.append(args[o[1]])
            else:
                res.append(o[1])
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


"""Facts about an ATen overload, read once from its schema.

Nothing here runs an op: which arguments an op writes, what it returns, whether it
is a view, and which functional overload an in-place ``foo_`` / ``foo.out`` variant
computes. The resolver (``_resolve``) and the plans (``_plan``) build on these.
"""
from __future__ import annotations

import torch
from torch._ops import OpOverload

aten = torch.ops.aten


class Schema:
    """Schema facts of one overload.

    ``mut``: ``(name, position, is_list)`` of every argument the op writes, in schema order.
    ``ret_kinds``: per return, ``"T"`` (Tensor / Tensor?), ``"TL"`` (Tensor[]) or ``"S"``
    (anything else). ``ret_alias``: per return, the index into ``mut`` of the argument it
    aliases (``foo_`` returns ``self``), or -1 for a fresh output.
    """

    __slots__ = ("op", "name", "packet", "mut", "mut_pos", "out_names", "is_view", "n_returns",
                 "ret_kinds", "ret_alias", "has_generator")

    def __init__(self, op: OpOverload):
        s = op._schema
        self.op = op
        self.name = str(op)
        self.packet = s.name.split("::")[-1]
        self.has_generator = any("Generator" in str(a.type) for a in s.arguments)
        self.mut = tuple((a.name, i, _is_list(a)) for i, a in enumerate(s.arguments)
                         if a.alias_info is not None and a.alias_info.is_write)
        self.mut_pos = tuple(pos for _, pos, _ in self.mut)
        self.out_names = tuple(a.name for a in s.arguments if a.is_out)
        self.is_view = (not self.mut and len(s.returns) > 0
                        and s.returns[0].alias_info is not None)
        self.n_returns = len(s.returns)
        kinds, alias = [], []
        for r in s.returns:
            t = str(r.type)
            kinds.append("TL" if t.startswith("List[Tensor]") else ("T" if "Tensor" in t else "S"))
            k = -1
            if r.alias_info is not None and r.alias_info.is_write:
                for j, (_, pos, _) in enumerate(self.mut):
                    if s.arguments[pos].alias_info.before_set == r.alias_info.before_set:
                        k = j
            alias.append(k)
        self.ret_kinds = tuple(kinds)
        self.ret_alias = tuple(alias)

    def with_mutated(self, names) -> None:
        """Override which arguments the op writes (a lowering that knows better than the
        schema: ``native_batch_norm`` updates its running stats)."""
        s = self.op._schema
        self.mut = tuple((a.name, i, _is_list(a)) for i, a in enumerate(s.arguments)
                         if a.name in names)
        self.mut_pos = tuple(pos for _, pos, _ in self.mut)


def _is_list(arg) -> bool:
    return "List" in str(arg.type)


def _writes(args) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write for a in args)


def functional_of(op: OpOverload) -> OpOverload | None:
    """The functional overload an in-place ``foo_`` or a ``foo.out`` op computes, or None.

    ``foo.out`` -> the overload of ``foo`` with the same non-out arguments;
    ``foo_.ov`` -> ``foo.ov``, else the overload of ``foo`` (or ``foo_functional``) with the
    same arguments (``bernoulli_.float`` -> ``bernoulli.p``, ``normal_`` ->
    ``normal_functional``).
    """
    s = op._schema
    name = s.name.split("::")[-1]
    if any(a.is_out for a in s.arguments):
        packet = getattr(aten, name, None)
        if packet is None:
            return None
        want = [a.name for a in s.arguments if not a.is_out]
        for cand in packet.overloads():
            f = getattr(packet, cand)
            fs = f._schema.arguments
            if any(a.is_out for a in fs) or _writes(fs):
                continue
            if [a.name for a in fs] == want:
                return f
        return None
    if name.endswith("_") and not name.startswith("__"):
        want = [(a.name, str(a.type)) for a in s.arguments]
        ov = s.overload_name or "default"
        for fname in (name[:-1], name[:-1] + "_functional"):
            packet = getattr(aten, fname, None)
            if packet is None:
                continue
            f = getattr(packet, ov, None)
            if f is not None and [(a.name, str(a.type)) for a in f._schema.arguments] == want:
                return f
            for cand in packet.overloads():
                f = getattr(packet, cand)
                fs = f._schema.arguments
                if any(a.is_out for a in fs) or _writes(fs):
                    continue
                if [(a.name, str(a.type)) for a in fs] == want:
                    return f
    return None


def is_view_op(op: OpOverload) -> bool:
    """A pure view: its first return aliases an input and it writes nothing."""
    s = op._schema
    return (len(s.returns) > 0 and s.returns[0].alias_info is not None
            and not s.returns[0].alias_info.is_write and not _writes(s.arguments))


def has_composite_implicit(op: OpOverload) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")


def decomposition(op: OpOverload):
    """PyTorch's ``torch._decomp`` decomposition of ``op``, or None."""
    from torch._decomp import decomposition_table

    return decomposition_table.get(op)


def custom_kernel(op: OpOverload):
    """The kernel of a ``torch.library.custom_op`` (a Python function over torch ops) for
    tpu, or for every device, or None (an ATen op, or a custom op with device-specific
    kernels only)."""
    from torch._library.custom_ops import _maybe_get_opdef

    opdef = _maybe_get_opdef(op._schema.name)
    if opdef is None:
        return None
    fns = opdef._backend_fns
    return fns.get("tpu", fns.get(None))

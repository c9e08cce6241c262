"""Which ATen ops lazyrt runs, and how: ``lazyrt.coverage()``.

Statuses (the dispatcher's own resolution order, see ``_dispatch.resolve``):
  lowered     a JAX lowering in the table
  derived     an in-place / out= variant of a lowered op (written back generically)
  decomposed  PyTorch's CompositeImplicit decomposition or ``torch._decomp``
  functional  an in-place / out= variant whose functional op runs, then a write-back
  missing     raises NotImplementedError naming the op (or runs on CPU with the fallback)
"""
from __future__ import annotations

import torch

from . import _dispatch
from .lowering import _registry

aten = torch.ops.aten


def status(op) -> str:
    if isinstance(op, str):
        name = op.removeprefix("aten.").removeprefix("aten::")
        packet, _, ov = name.partition(".")
        op = getattr(getattr(aten, packet), ov or "default")
    if op in _dispatch._SPECIAL or op in _registry.LOWERINGS:
        return "lowered"
    f = _dispatch._functional_of(op)
    if f is not None and f in _registry.LOWERINGS:
        return "derived"
    if _dispatch._has_composite_implicit(op) or _dispatch._decomposition(op) is not None:
        return "decomposed"
    if f is not None and status(f) != "missing":
        return "functional"
    return "missing"


def coverage(op=None):
    """With an op (``"aten.add.Tensor"`` or an OpOverload): its status. Without: a dict
    status -> sorted op names over every ATen overload, plus counts."""
    if op is not None:
        return status(op)
    out: dict = {k: [] for k in ("lowered", "derived", "decomposed", "functional", "missing")}
    for packet_name in dir(aten):
        packet = getattr(aten, packet_name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for ov in packet.overloads():
            try:
                o = getattr(packet, ov)
                out[status(o)].append(str(o))
            except Exception:
                continue
    for v in out.values():
        v.sort()
    out["counts"] = {k: len(v) for k, v in out.items() if isinstance(v, list)}
    return out


def main() -> None:
    import sys

    if len(sys.argv) > 1:
        for name in sys.argv[1:]:
            print(f"{name}: {coverage(name)}")
        return
    c = coverage()
    for k, n in c["counts"].items():
        print(f"{k:11s} {n}")
    print("(python -m lazyrt._coverage OP [OP ...] for single ops)")


if __name__ == "__main__":
    main()

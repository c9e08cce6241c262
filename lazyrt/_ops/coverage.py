"""Which ATen ops lazyrt runs, and how: ``lazyrt.coverage()``.

It reads the dispatcher's own lookup (``_resolve.lookup``), so it reports what the
dispatcher does. Statuses:
  lowered      a JAX lowering in the table
  special      a handler of its own (host transfers, ``.item()``, mask indexing)
  derived      an in-place / out= variant of a lowered op (written back generically)
  decomposed   PyTorch's CompositeImplicit decomposition or ``torch._decomp``
  functional   an in-place / out= (or in-place view) variant whose functional op runs
  missing      raises NotImplementedError naming the op (or runs on CPU with the fallback)

``coverage()["skipped"]``: what lazyrt left out at import because the running torch lacks
it (a lowering of an op it does not have, a patch of a method it does not have) and the
features it lacks, each with why (``lazyrt._base.compat``; docs/versions.md).
"""
from __future__ import annotations

import dataclasses
import inspect
import os

import torch

from .._base import compat
from .resolve import lookup

aten = torch.ops.aten
STATUSES = ("lowered", "special", "derived", "decomposed", "functional", "missing")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


@dataclasses.dataclass(frozen=True)
class OpCoverage:
    """How one overload runs: ``status``, ``how`` (the resolver's answer), and ``by``:
    the function that does it and where it is defined (``module.function (file:line)``)."""

    op: str
    status: str
    how: str
    by: str

    def __str__(self) -> str:
        return f"{self.op}: {self.status} ({self.how}) by {self.by}"


def _where(fn) -> str:
    if fn is None:
        return "-"
    fn = inspect.unwrap(fn)
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    try:
        path = inspect.getsourcefile(fn) or "?"
        line = inspect.getsourcelines(fn)[1]
    except (OSError, TypeError):
        return name
    return f"{name} ({path.removeprefix(_ROOT)}:{line})"


def _op_of(op):
    if isinstance(op, str):
        name = op.removeprefix("aten.").removeprefix("aten::")
        packet, _, ov = name.partition(".")
        return getattr(getattr(aten, packet), ov or "default")
    return op


def status(op: str | torch._ops.OpOverload) -> OpCoverage:
    if isinstance(op, str):
        name = op.replace("::", ".")
        name = name if name.startswith("aten.") else f"aten.{name}"
        if compat.op(name) is None:
            return OpCoverage(name, "missing", "not in this torch",
                              f"torch {compat.TORCH} has no {name}")
    op = _op_of(op)
    r = lookup(op)
    how = r.how
    if how == "special":
        st, by = "special", _where(r.special)
    elif how in ("lowered", "derived"):
        st, by = how, _where(r.lowering.fn)
    elif how == "composite":
        st, by = "decomposed", f"CompositeImplicitAutograd kernel of {op}"
    elif how == "decomposed":
        st, by = "decomposed", _where(r.decomp)
    elif how in ("functional", "inplace_view"):
        # runs as its functional op does: missing if that one is
        st = "missing" if lookup(r.functional).how == "missing" else "functional"
        by = f"{r.functional}, then a write-back"
    else:
        st, by = "missing", "-"
    return OpCoverage(str(op), st, how, by)


def coverage(op: str | torch._ops.OpOverload | None = None) -> OpCoverage | dict:
    """With an op (``"aten.add.Tensor"`` or an OpOverload): its ``OpCoverage``
    (``.status``, ``.by``: which file and function lowers it). Without: a dict
    status -> sorted op names over every ATen overload, plus ``counts``."""
    if op is not None:
        return status(op)
    out: dict = {k: [] for k in STATUSES}
    for packet_name in dir(aten):
        packet = getattr(aten, packet_name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for ov in packet.overloads():
            try:
                o = getattr(packet, ov)
                out[status(o).status].append(str(o))
            except Exception:
                continue
    for v in out.values():
        v.sort()
    out["counts"] = {k: len(v) for k, v in out.items() if isinstance(v, list)}
    out["skipped"] = skipped()
    return out


def skipped() -> dict[str, str]:
    """What lazyrt left out on this torch (a lowering, a patch, a feature) -> why."""
    out = dict(compat.SKIPPED)
    out.update({f"feature {n}": m for n, m in compat.missing_features().items()})
    return out


def main() -> None:
    import sys

    # (``python -m lazyrt._ops.coverage`` imports the ``lazyrt`` package first: the
    # tables are filled.)
    if len(sys.argv) > 1:
        for name in sys.argv[1:]:
            print(coverage(name))
        return
    c = coverage()
    for k, n in c["counts"].items():
        print(f"{k:11s} {n}")
    for what, why in c["skipped"].items():
        print(f"skipped     {what}: {why}")
    print("(python -m lazyrt._ops.coverage OP [OP ...] for single ops)")


if __name__ == "__main__":
    main()

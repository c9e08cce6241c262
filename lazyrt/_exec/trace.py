"""The pending trace: what defer mode records, and its text (``lazyrt.graph``,
``LAZYRT_EXPLAIN_RECOMPILE``).

A trace is a list of nodes (a Prog each) with their input refs: ``-(leaf + 1)`` for a
materialized input (a leaf), ``(node << _SHIFT) | output`` for a pending one.
"""
from __future__ import annotations

import difflib
import re

from .._base.ir import Prog

LOOP_PERIODS = 4  # the periods (in ops) of the loops ``defer`` cuts (``config.loop_cut``)
_SHIFT = 20
_MASK = (1 << _SHIFT) - 1


class Trace:
    __slots__ = ("nodes", "refs", "leaves", "leaf_index", "leaf_avals", "scalars",
                 "storages", "overwritten", "declared", "done", "srcs", "cuttable",
                 "streaks", "__weakref__")

    def __init__(self):
        self.nodes: list[Prog] = []  # Prog per node
        self.refs: list[tuple] = []  # input refs per node (tuple of ints)
        self.leaves: list = []  # materialized inputs (jax arrays)
        self.leaf_index: dict = {}  # id(array) -> leaf number
        self.leaf_avals: list = []  # (shape, dtype) per leaf: part of the verified key
        self.scalars: list = []  # runtime scalars, flat
        # id(storage) -> weak ref, for each storage that got a pending value of this trace
        self.storages: dict = {}
        self.overwritten: set = set()  # ids of leaves whose storage was overwritten here
        self.declared: set = set()  # ids of leaves an op declared donated (``jax_op``)
        self.done = False
        self.srcs: list = []  # user source line per node (when recorded)
        self.cuttable = True  # False once a fusion-window cut of it failed
        # per period p = 1..LOOP_PERIODS: how many nodes in a row repeat the prog p back
        self.streaks = [0] * LOOP_PERIODS


def structure_hash(tr: Trace) -> int:
    """The hash of ``tr``'s structure: its progs (by identity: a cached executable keeps
    its progs alive, so no other prog can take their ids), its input wiring and its leaf
    avals. Computed at the flush, in C (tuple hashes)."""
    return hash((tuple(tr.nodes), tuple(tr.refs), tuple(tr.leaf_avals)))


def _ref_text(tr: Trace, r: int) -> str:
    if r < 0:
        return f"in{-r - 1}"
    n = r >> _SHIFT
    return f"%{n}" if len(tr.nodes[n].out_avals) == 1 else f"%{n}.{r & _MASK}"


def _leaf_text(tr: Trace, i: int) -> str:
    shape, dtype = tr.leaf_avals[i]
    return f"in{i}: {tuple(shape)} {dtype}"


def node_text(tr: Trace, n: int, with_leaves: bool = False) -> str:
    """One node as ``cosh[desc](in0, %3)``; ``with_leaves`` spells leaves out with their
    avals (explain-recompile compares nodes of different traces, whose leaves differ)."""
    p = tr.nodes[n]
    ins = ", ".join(f"in{-r - 1}:{tuple(tr.leaf_avals[-r - 1][0])}:{tr.leaf_avals[-r - 1][1]}"
                    if r < 0 and with_leaves else _ref_text(tr, r) for r in tr.refs[n])
    static = f"[{p.desc}]" if p.desc else ""
    return f"{p.name}{static}({ins})"


def describe(tr: Trace) -> list[str]:
    return [node_text(tr, n, with_leaves=True) for n in range(len(tr.nodes))]


def graph_text(tr: Trace, only=None) -> str:
    lines = [f"lazyrt pending trace: {len(tr.nodes)} ops, {len(tr.leaves)} inputs"]
    lines += [f"  {_leaf_text(tr, i)}" for i in range(len(tr.leaves))]
    for n, p in enumerate(tr.nodes):
        if only is not None and not only[n]:
            continue
        outs = ", ".join(f"{tuple(s)} {d}" for s, d in p.out_avals)
        src = f"  # {tr.srcs[n]}" if n < len(tr.srcs) else ""
        lines.append(f"  %{n} = {node_text(tr, n)} -> {outs}{src}")
    return "\n".join(lines)


# Explanations stay short: one op's text is clipped to this many characters around where
# it differs (a ``_foreach_*`` node over 200 tensors is several KB on one line).
_WIDTH = 120


def _differing(old: str, new: str) -> tuple[str, str]:
    """``old`` and ``new`` cut to where they differ, with a little context either side."""
    n = min(len(old), len(new))
    p = 0
    while p < n and old[p] == new[p]:
        p += 1
    q = 0
    while q < n - p and old[-1 - q] == new[-1 - q]:
        q += 1
    ctx = 30

    def cut(s):
        a, b = max(0, p - ctx), min(len(s), len(s) - q + ctx)
        out = ("..." if a else "") + s[a:b] + ("..." if b < len(s) else "")
        return out if len(out) <= _WIDTH else out[:_WIDTH - 3] + "..."

    return cut(old), cut(new)


_INT = re.compile(r"-?\d+")


def at_new_position(old: str, new: str) -> bool:
    """Whether two node texts (``describe``) differ only in the integers of their static
    arguments: the same op on the same input shapes at another value (whose outputs the
    caller checks are the same shapes too)."""
    if _op_name(old) != _op_name(new):
        return False
    a, b = old.find("]("), new.find("](")
    if a < 0 or b < 0 or old[a:] != new[b:]:
        return False  # no static arguments, or other inputs
    return old[:a] != new[:b] and _INT.sub("#", old[:a]) == _INT.sub("#", new[:b])


def _op_name(text: str) -> str:
    return text.split("(", 1)[0].split("[", 1)[0]


def explain(tr: Trace, src: str, cached) -> str:
    """Why ``tr`` recompiles: its first difference from the closest of the ``cached``
    executables (each with ``desc``, the ``describe`` of its trace, and ``src``), with the
    user's source line that recorded the op, in a few short lines. Traces are aligned by
    their ops' names; an aligned op whose text differs (shapes, static arguments) is a
    difference too."""
    desc = describe(tr)
    names = [_op_name(d) for d in desc]
    best, best_key = None, None
    for exe in cached:
        old_names = [_op_name(d) for d in exe.desc]
        key = (difflib.SequenceMatcher(a=old_names, b=names, autojunk=False).ratio(),
               difflib.SequenceMatcher(a=exe.desc, b=desc, autojunk=False).ratio())
        if best_key is None or key > best_key:
            best, best_key, best_names = exe, key, old_names
    lines = [f"lazyrt: recompiling a trace of {len(desc)} ops (flush at {src})"]
    if best is None:
        lines.append("  no cached trace to compare with")
        return "\n".join(lines)
    closest = (f"closest cached trace: {len(best.desc)} ops, {best_key[1]:.0%} similar, "
               f"compiled for the flush at {best.src}")
    if best_key[0] < 0.5:
        first = tr.srcs[0] if tr.srcs else "an unknown line"
        lines.append(f"  a new trace, first op {names[0] if names else '-'} recorded at {first}")
        lines.append(f"  ({closest})")
        return "\n".join(lines)
    # (index in the new trace, old text or None, new text or None, index in the old one)
    diffs = []
    sm = difflib.SequenceMatcher(a=best_names, b=names, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            diffs += [(j1 + k, best.desc[i1 + k], desc[j1 + k], i1 + k) for k in range(i2 - i1)
                      if best.desc[i1 + k] != desc[j1 + k]]
            continue
        for k in range(max(i2 - i1, j2 - j1)):
            old = best.desc[i1 + k] if i1 + k < i2 else None
            new = desc[j1 + k] if j1 + k < j2 else None
            diffs.append((j1 + k if new is not None else j1, old, new, i1 + k))
    if not diffs:
        lines.append("  same ops as a cached trace; its live outputs or donated inputs differ "
                     f"(cached for the flush at {best.src})")
        return "\n".join(lines)
    # the first op of this trace that differs (it has a source line); an op only the
    # cached trace had is named when nothing else differs
    j, old, new, i = next((d for d in diffs if d[2] is not None), diffs[0])
    where = tr.srcs[j] if j < len(tr.srcs) else "an unknown line"
    if old is not None and new is not None:
        was, now = _differing(old, new)
        lines.append(f"  first difference: op {j} {names[j]}, recorded at {where}")
        lines.append(f"    was {was}")
        lines.append(f"    now {now}")
        olds = getattr(best, "nodes", None)
        if olds is not None and i < len(olds) and olds[i].out_avals == tr.nodes[j].out_avals \
                and at_new_position(old, new):
            lines.append("    the same op at a new position: only an integer argument "
                         "changed (a value, not a shape)")
    elif new is not None:
        lines.append(f"  first difference: op {j} {names[j]} is new, recorded at {where}")
    else:
        lines.append(f"  first difference: the cached trace's {_op_name(old)} before op {j} is "
                     "gone")
    more = f"{len(diffs) - 1} more ops differ; " if len(diffs) > 1 else ""
    lines.append(f"  ({more}{closest})")
    return "\n".join(lines)

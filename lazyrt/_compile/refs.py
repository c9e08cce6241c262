"""Where a value of a compiled graph comes from (``graph._GraphPlan``): one ``Ref`` per
node value, read in one place (``value``), on the host (each call) or in the device
program (once, as it is traced)."""
from __future__ import annotations

import enum
from typing import Any, NamedTuple


class Kind(enum.IntEnum):
    """A ``Ref``'s kind. The indexed kinds come first: ``value`` reads ``tables[kind][at]``."""

    IN = 0  # graph input ``at``
    NODE = 1  # the output of device step ``at``
    HOST = 2  # the output of host step ``at`` (CPU work on CPU inputs, run at each call)
    HOSTV = 3  # host value ``at``, a device input of the program
    HOSTS = 4  # host value ``at``, a runtime scalar of the program (0-d floating or bool)
    HOSTR = 5  # runtime scalar ``at`` of the graph's symbols, computed on the host
    CONST = 6  # device constant ``at``
    GET = 7  # item ``item`` of the multi-output value ``at`` (a Ref)
    CPU = 8  # ``at`` is the value: a CPU constant
    PY = 9  # ``at`` is the value: a Python value


class Ref(NamedTuple):
    """A node value's source; hashable and compared as a tuple (a dict key of the plan)."""

    kind: Kind
    at: Any
    item: int | None = None


# Kinds whose value is computed or known on the host (graph inputs: the plan's ``host_in``).
_HOST = frozenset((Kind.HOST, Kind.CPU, Kind.PY))


def is_literal(ref: Ref) -> bool:
    """Whether ``ref`` holds its value itself (a CPU constant or a Python value)."""
    return ref.kind >= Kind.CPU


def is_host(ref: Ref, host_in) -> bool:
    """Whether ``ref``'s value lives on the host (``host_in``: the CPU graph inputs)."""
    while ref.kind is Kind.GET:
        ref = ref.at
    return ref.kind in _HOST or (ref.kind is Kind.IN and ref.at in host_in)


def value(ref: Ref, tables):
    """``ref``'s value; ``tables[kind]`` is the sequence an indexed kind reads: on the host
    ``(args, None, host step outputs)``, in the program all seven."""
    kind = ref.kind
    if kind is Kind.GET:
        return value(ref.at, tables)[ref.item]
    if kind >= Kind.CPU:
        return ref.at
    return tables[kind][ref.at]

"""What the running torch has: the one place that answers "does this torch have X".

lazyrt supports every torch from 2.11 to 2.14 (``pyproject.toml``; the table of what each
lacks is ``docs/versions.md``). Ops, APIs and modules that not every torch in that range
has are looked up here, by trying the real thing (an attribute lookup, an import, a call
on meta tensors), never by comparing version numbers. Everything else in lazyrt asks this
module instead of calling ``hasattr`` itself:

* ``has(name)``: a named feature (``FEATURES``) lazyrt uses when it is there;
  ``require(name)`` raises ``FeatureUnavailable`` (a ``NotImplementedError``) naming the
  feature and the torch it needs when it is not.
* ``aten`` / ``prims`` / ``ops(namespace)``: ``torch.ops.<ns>`` whose missing ops are a
  ``MissingOp`` placeholder instead of an ``AttributeError``, so ``@lower(aten.x.default)``
  of an op this torch lacks skips that lowering at import (``lowering/_registry``).
* ``api("torch.UntypedStorage._resize_with_addr_")``: an attribute by its dotted path, or
  None.
* ``skip(what, why)`` / ``SKIPPED``: what lazyrt left out at import because this torch
  lacks it (``lazyrt.coverage()["skipped"]`` lists it).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable

import torch

__all__ = ["TORCH", "Feature", "FEATURES", "FeatureUnavailable", "has", "require", "api", "ops",
           "op", "aten", "prims", "MissingOp", "SKIPPED", "skip", "missing_features", "fill_meta"]

TORCH = torch.__version__.split("+")[0]

# what lazyrt left out at import -> why (in the order it happened)
SKIPPED: dict[str, str] = {}


def skip(what: str, why: str) -> None:
    """Record that lazyrt leaves ``what`` (a lowering, a patch) out on this torch."""
    SKIPPED.setdefault(what, why)


class FeatureUnavailable(NotImplementedError):
    """A lazyrt feature the running torch cannot serve (the message names the torch it needs)."""


@dataclasses.dataclass(frozen=True)
class Feature:
    name: str
    what: str  # what lazyrt uses it for, as a user would name it
    since: str  # first torch in lazyrt's range that has it (for messages and docs; never checked)
    probe: Callable[[], bool]  # tries the real thing
    # what lazyrt does without it ("" = the feature is not available: ``require`` raises)
    instead: str = ""


FEATURES: dict[str, Feature] = {}


def _feature(name: str, what: str, since: str, instead: str = ""):
    def deco(probe: Callable[[], bool]) -> Callable[[], bool]:
        FEATURES[name] = Feature(name, what, since, probe, instead)
        return probe

    return deco


@functools.cache
def has(name: str) -> bool:
    """Whether the running torch has feature ``name`` (a key of ``FEATURES``)."""
    try:
        return bool(FEATURES[name].probe())
    except KeyError:
        raise KeyError(f"lazyrt: no feature {name!r}; known: {', '.join(FEATURES)}") from None
    except Exception:  # a probe that fails is a feature this torch does not have
        return False


def message(name: str) -> str:
    """What the running torch's lack of feature ``name`` means for the user."""
    f = FEATURES[name]
    head = f"torch {TORCH} has no {f.what} (torch >= {f.since} has)"
    return f"{head}; lazyrt {f.instead}" if f.instead else head


def require(name: str, use: str = "") -> None:
    """Raise ``FeatureUnavailable`` naming the feature and the torch it needs, unless the
    running torch has it; ``use``: what the user asked for that needs it."""
    if not has(name):
        f = FEATURES[name]
        if use:
            raise FeatureUnavailable(f"lazyrt: {use} needs {f.what} (torch >= {f.since}); "
                                     f"this is torch {TORCH}")
        raise FeatureUnavailable(f"lazyrt: {f.what} needs torch >= {f.since} ({name}); "
                                 f"this is torch {TORCH}")


def missing_features() -> dict[str, str]:
    """feature name -> the message ``require`` raises, for every feature this torch lacks."""
    return {n: message(n) for n in FEATURES if not has(n)}


def api(path: str):
    """The object at dotted ``path`` ("torch.UntypedStorage._swap_data_ptr_"), or None
    where the running torch has no such attribute or module."""
    parts = path.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            try:
                obj = importlib.import_module(".".join(parts[:i + 1]))
            except ImportError:
                return None
    return obj


# ---- ops ------------------------------------------------------------------------------

class MissingOp:
    """Stands for an op (``aten.foo``) or overload (``aten.foo.default``) the running torch
    does not have: ``@lower`` / ``@inverse`` skip it (and ``skip`` records it); calling it
    raises ``FeatureUnavailable``."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, overload: str) -> MissingOp:
        if overload.startswith("__"):
            raise AttributeError(overload)
        return MissingOp(f"{self.name}.{overload}")

    def __call__(self, *args, **kwargs):
        raise FeatureUnavailable(f"lazyrt: {self.name} is not an op of torch {TORCH}")

    def overloads(self) -> list:
        skip(self.name, f"not an op of torch {TORCH}")
        return []

    def __repr__(self) -> str:
        return f"<{self.name}: not in torch {TORCH}>"

    __str__ = __repr__


class _OpNamespace:
    """``torch.ops.<ns>`` whose missing ops and overloads are ``MissingOp``s."""

    def __init__(self, ns: str):
        self._ns = ns

    def __getattr__(self, name: str):
        try:
            packet = getattr(getattr(torch.ops, self._ns), name)
        except (AttributeError, RuntimeError):
            if name.startswith("__") and name.endswith("__"):
                raise AttributeError(name) from None
            return MissingOp(f"{self._ns}.{name}")
        return _Packet(packet) if isinstance(packet, torch._ops.OpOverloadPacket) else packet


class _Packet:
    """An ``OpOverloadPacket`` seen through ``_OpNamespace``: ``.overload`` is the real
    overload or a ``MissingOp``; ``.packet`` the real packet (``@lower`` takes either)."""

    __slots__ = ("packet",)

    def __init__(self, packet: torch._ops.OpOverloadPacket):
        self.packet = packet

    def __getattr__(self, name: str):
        try:
            return getattr(self.packet, name)
        except AttributeError:
            if name.startswith("__"):
                raise
            return MissingOp(f"{self.packet}.{name}")

    def __call__(self, *args, **kwargs):
        return self.packet(*args, **kwargs)

    def __repr__(self) -> str:
        return repr(self.packet)


def unwrap(op):
    """The real op of what ``aten.x`` gave (a ``_Packet``'s packet; anything else as is)."""
    return op.packet if isinstance(op, _Packet) else op


@functools.cache
def ops(ns: str) -> _OpNamespace:
    return _OpNamespace(ns)


aten = ops("aten")
prims = ops("prims")


def op(qualname: str):
    """``"aten.cholesky.default"`` (or ``aten::cholesky``, overload ``default``): the
    OpOverload, or None where this torch has no such op."""
    ns, _, rest = qualname.replace("::", ".").partition(".")
    packet, _, overload = rest.partition(".")
    o = getattr(getattr(ops(ns), packet), overload or "default")
    return None if isinstance(o, MissingOp) else o


# ---- what lazyrt fills in ------------------------------------------------------------

_LIBS: list = []  # the torch.library.Library objects of the kernels registered below


def fill_meta(op, fn: Callable, feature: str) -> None:
    """Where the running torch lacks ``feature`` (a meta kernel of ``op``), register ``fn``
    (PyTorch's own meta kernel of a newer torch) as ``op``'s Meta kernel: lazyrt plans an
    op's outputs from its meta kernel."""
    if has(feature) or isinstance(op, MissingOp):
        return
    lib = torch.library.Library(op.namespace, "IMPL")
    lib.impl(op, fn, "Meta")
    _LIBS.append(lib)


# ---- the features ---------------------------------------------------------------------
# Each probe tries the real thing. ``since``: the first torch of lazyrt's range that has it
# (2.11.0, 2.13.0 and 2.14.1 are tested; 2.12.0 read from its wheel: native_functions.yaml,
# _meta_registrations.py, libtorch_python's method names).

@_feature("linear_cross_entropy",
          "F.linear_cross_entropy (its chunked torch_nn:: ops)", "2.13")
def _linear_cross_entropy() -> bool:
    importlib.import_module("torch.nn.modules.linear_cross_entropy")  # registers torch_nn::*
    return True


@_feature("storage_swap_data_ptr", "UntypedStorage._swap_data_ptr_", "2.12",
          instead="gives a tpu tensor's untyped_storage() as a new non-owning storage object "
                  "per call (data_ptr and nbytes are the storage's identity as on newer torch; "
                  "the object is not the tensor's own, and C++ readers of a tensor's storage "
                  "see none: torch.jit.save of tpu tensors raises)")
def _storage_swap_data_ptr() -> bool:
    return api("torch.UntypedStorage._swap_data_ptr_") is not None


@_feature("sdpa_overrideable_backward_meta",
          "meta kernel of _scaled_dot_product_fused_attention_overrideable_backward", "2.12",
          instead="registers PyTorch's own (SDPA's fused backward)")
def _sdpa_overrideable_backward_meta() -> bool:
    # (lowering/attention.py fills it in)
    bwd = aten._scaled_dot_product_fused_attention_overrideable_backward.default
    m = torch.empty(1, 1, 2, 4, device="meta")
    e = torch.empty((), dtype=torch.int64, device="meta")
    try:
        bwd(m, m, m, m, None, [True, True, True, False], m, m[..., 0], e, e, 2, 2, 0.0, False,
            e, e)
    except NotImplementedError:
        return False
    return True


@_feature("compiled_linalg_checks",
          "_linalg_check_errors as an ordered effect in compiled graphs", "2.13",
          instead="registers it as newer torch does (torch.compile of a singular linalg.solve "
                  "raises as in eager)")
def _compiled_linalg_checks() -> bool:
    from torch._higher_order_ops import effects

    return effects._get_effect("aten::_linalg_check_errors") is not None


@_feature("convolution_meta", "meta kernel of aten::_convolution", "2.13",
          instead="registers PyTorch's own (torch.jit.trace of convolutions on tpu records it)")
def _convolution_meta() -> bool:
    a = torch.empty(1, 1, 3, 3, device="meta")
    try:
        aten._convolution.default(a, a, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                  False, False, True, True)
    except NotImplementedError:
        return False
    return True

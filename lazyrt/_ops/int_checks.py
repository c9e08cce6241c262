"""ATen's checks that XLA does not make, each of which left a value where CPU raises:

* an integer division by zero (``floor_divide``, ``remainder``, ``fmod``, ``div`` with a
  rounding mode) raises ``RuntimeError: ZeroDivisionError``. A divisor known on the host
  (a Python number, a CPU tensor) is checked at the op; one on the device by an
  asynchronous assert read at the next sync point (``_exec.asserts``; at once in debug
  mode), as an index check is;
* a Python number converted to a tensor's dtype (``fill_``, ``full``, ``full_like``,
  ``scalar_tensor``, ``masked_fill``, ``index_fill``, ``scatter``, ``clamp``) raises
  c10's ``checked_convert`` error when it overflows the dtype ("value cannot be
  converted to type uint8_t without overflow"), where XLA wrapped it (300 filled 44)."""
from __future__ import annotations

import numbers

import torch

from .checks import require
from .handlers import functional, mutating

aten = torch.ops.aten

_ZERO_DIV = "ZeroDivisionError"


def _arg(e, args, kwargs, name):
    for i, a in enumerate(e.op._schema.arguments):
        if a.name == name:
            return args[i] if i < len(args) else kwargs.get(name)
    return None


def _integral(dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex)


def check_divisor(e, self, other) -> None:
    """Raise (or assert on the device) where an integer division's divisor has a zero."""
    if isinstance(other, torch.Tensor):
        if not other.numel() or (isinstance(self, torch.Tensor) and not self.numel()):
            return
    elif not isinstance(other, numbers.Number):
        return
    common = torch.result_type(self, other)
    if not _integral(common):
        return
    # the divisor as the op computes with it: in the common dtype (256 is 0 in uint8)
    if not isinstance(other, torch.Tensor):
        if torch.tensor(other).to(common).item() == 0:
            raise RuntimeError(_ZERO_DIV)
        return
    if other.dtype != common:
        other = aten._to_copy.default(other.detach(), dtype=common)
    require(e, aten.all.default(aten.ne.Scalar(other.detach(), 0)), _ZERO_DIV)


def division_checked(e, args, kwargs):
    """An integer division: its divisor checked, then the op."""
    if e.op._opname != "div" or _arg(e, args, kwargs, "rounding_mode") is not None:
        self = args[0] if args else _arg(e, args, kwargs, "self")
        check_divisor(e, self, _arg(e, args, kwargs, "other"))
    return (mutating if e.mut else functional)(e, args, kwargs)


division_checked.value_ints = True


def _overloads(*packets) -> list:
    return [getattr(p, n) for p in packets for n in p.overloads()]


def special_handlers() -> dict:
    """op -> handler, merged into ``special.SPECIAL``."""
    ops = _overloads(aten.floor_divide, aten.floor_divide_, aten.remainder, aten.remainder_,
                     aten.fmod, aten.fmod_)
    ops += [op for op in _overloads(aten.div, aten.div_) if "mode" in op._overloadname]
    return dict.fromkeys(ops, division_checked)


# ---- Python scalars converted to a tensor's dtype: c10's checked_convert ----------------

# verdicts of converting (dtype, type, value): None or the exception CPU raises
_VERDICTS: dict = {}


def check_convert(v, dtype, one: bool = False) -> None:
    """Raise what CPU raises converting the Python number ``v`` to ``dtype`` (c10's
    ``checked_convert``: "value cannot be converted to type uint8_t without overflow"):
    CPU's own conversion, once per (dtype, value). ``one``: as CPU fills one element
    (its fast path converts a float unchecked: ``scalar_tensor``, a one-element
    ``fill_``)."""
    key = (dtype, type(v), "nan" if v != v else v, one)  # (NaN: one key, not a new one)
    verdict = _VERDICTS.get(key, key)
    if verdict is key:
        try:
            torch.empty(1 if one else 2, dtype=dtype).fill_(v)
            verdict = None
        except RuntimeError as ex:
            verdict = ex
        if len(_VERDICTS) > 4096:
            _VERDICTS.clear()
        _VERDICTS[key] = verdict
    if verdict is not None:
        raise RuntimeError(str(verdict))


def _scalar_target(e, args, kwargs, name):
    self = args[0] if args else _arg(e, args, kwargs, "self")
    if name in ("fill_value", "s"):  # full: its dtype (none given: one that holds the value)
        dtype = _arg(e, args, kwargs, "dtype")
        return self.dtype if dtype is None and e.op._opname == "full_like" else dtype
    if name in ("min", "max"):  # clamp: the result type
        return torch.result_type(self, _arg(e, args, kwargs, name))
    return self.dtype


def scalar_checked(inner, names):
    """``inner`` (a handler; None: the op's plain one) after ``checked_convert`` of its
    Python number arguments ``names``."""

    def handler(e, args, kwargs):
        for name in names:
            v = _arg(e, args, kwargs, name)
            # (a complex number on a real tensor: the op's own error, not this one)
            if isinstance(v, numbers.Number) and not isinstance(v, (bool, complex)):
                dtype = _scalar_target(e, args, kwargs, name)
                if dtype is not None and dtype != torch.bool:
                    op = e.op._opname
                    one = op == "scalar_tensor" or (op in ("fill", "fill_")
                                                    and args[0].numel() == 1)
                    check_convert(v, dtype, one)
        if inner is not None:
            return inner(e, args, kwargs)
        return (mutating if e.mut else functional)(e, args, kwargs)

    # the lowered op's runtime int arguments stay runtime (``resolve``, ``value_ints``)
    handler.value_ints = inner is None
    return handler


def checked_scalar_ops() -> dict:
    """op -> the Python number arguments ATen converts with ``checked_convert``."""
    return {
        aten.fill.Scalar: ("value",), aten.fill_.Scalar: ("value",),
        aten.masked_fill.Scalar: ("value",), aten.masked_fill_.Scalar: ("value",),
        aten.index_fill.int_Scalar: ("value",), aten.index_fill_.int_Scalar: ("value",),
        aten.scatter.value: ("value",), aten.scatter_.value: ("value",),
        aten.full.default: ("fill_value",), aten.scalar_tensor.default: ("s",),
        aten.full_like.default: ("fill_value",),
        aten.clamp.default: ("min", "max"), aten.clamp_.default: ("min", "max"),
        aten.clamp_min.default: ("min",), aten.clamp_min_.default: ("min",),
        aten.clamp_max.default: ("max",), aten.clamp_max_.default: ("max",),
    }

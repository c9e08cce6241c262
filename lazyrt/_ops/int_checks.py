"""ATen's checks that XLA does not make, each of which left a value where CPU raises:

* an integer division by zero (``floor_divide``, ``remainder``, ``fmod``, ``div`` with a
  rounding mode) raises ``RuntimeError: ZeroDivisionError``. A divisor known on the host
  (a Python number, a CPU tensor) is checked at the op; one on the device by an
  asynchronous assert read at the next sync point (``_exec.asserts``; at once in debug
  mode), as an index check is;
* a Python number converted to a tensor's dtype (``fill_``, ``full``, ``full_like``,
  ``scalar_tensor``, ``masked_fill``, ``index_fill``, ``scatter``, ``clamp``) raises
  c10's ``checked_convert`` error when it overflows the dtype ("value cannot be
  converted to type uint8_t without overflow"), where XLA wrapped it (300 filled 44);
* a 0-dim tensor value (``masked_fill``, ``index_fill``; ``fill_`` from another device)
  is read as ATen reads it (``value.item()``) and converted the same checked way: a value
  on the CPU at the op, one on the device by an asynchronous assert (c10's rule:
  ``_value_fits``)."""
from __future__ import annotations

import numbers

import torch

from .checks import require
from .handlers import functional, mutating

aten = torch.ops.aten

ZERO_DIV = "ZeroDivisionError"


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
            raise RuntimeError(ZERO_DIV)
        return
    if other.dtype != common:
        other = aten._to_copy.default(other.detach(), dtype=common)
    require(e, aten.all.default(aten.ne.Scalar(other.detach(), 0)), ZERO_DIV)


def checked(check, inner=None):
    """A handler: ``check(e, args, kwargs)``, then ``inner`` (a handler; None: the op's
    plain one)."""

    def handler(e, args, kwargs):
        check(e, args, kwargs)
        if inner is not None:
            return inner(e, args, kwargs)
        return (mutating if e.mut else functional)(e, args, kwargs)

    # the lowered op's runtime int arguments stay runtime (``resolve``, ``value_ints``)
    handler.value_ints = inner is None
    return handler


def _check_division(e, args, kwargs) -> None:
    if e.op._opname != "div" or _arg(e, args, kwargs, "rounding_mode") is not None:
        self = args[0] if args else _arg(e, args, kwargs, "self")
        check_divisor(e, self, _arg(e, args, kwargs, "other"))


# an integer division: its divisor checked, then the op
division_checked = checked(_check_division)


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

    def check(e, args, kwargs):
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

    return checked(check, inner)


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


# ---- 0-dim tensor values: ``value.item()`` converted with ``checked_convert`` -------------

_MESSAGES: dict = {}


def _overflow_message(dtype) -> str:
    """CPU's own message for a value that overflows ``dtype``."""
    msg = _MESSAGES.get(dtype)
    if msg is None:
        try:
            torch.empty(2, dtype=dtype).fill_(1e300)
            msg = ""
        except RuntimeError as ex:
            msg = str(ex)
        _MESSAGES[dtype] = msg
    return msg


def _value_fits(v, dtype):
    """One bool element on ``v``'s device: whether the 0-dim tensor ``v``'s ``item()`` (an
    int64 for an integer tensor, a double for a float one) converts to ``dtype`` as c10's
    ``overflows`` allows; None where it cannot overflow. c10: an integer into an unsigned
    type may be negative down to ``-max`` (it wraps); a float into an integer type must be
    finite and within range; a float into a float type may be inf or NaN, else within
    range. (Complex and bool values, float8 targets: not checked.)"""
    vd = v.dtype
    if dtype == torch.bool or vd == torch.bool or vd.is_complex or dtype.is_complex:
        return None
    v = v.detach()
    if dtype.is_floating_point:
        if dtype not in (torch.float16, torch.bfloat16, torch.float32) or (
                not vd.is_floating_point and dtype != torch.float16):
            return None
        fi = torch.finfo(dtype)
        x = aten._to_copy.default(v, dtype=torch.float64)
        ok = aten.logical_and.default(aten.ge.Scalar(x, fi.min), aten.le.Scalar(x, fi.max))
        if vd.is_floating_point:
            ok = aten.logical_or.default(ok, aten.logical_not.default(aten.isfinite.default(x)))
        return ok
    info = torch.iinfo(dtype)
    if vd.is_floating_point:  # (NaN and inf compare False)
        x = aten._to_copy.default(v, dtype=torch.float64)
        return aten.logical_and.default(aten.ge.Scalar(x, float(info.min)),
                                        aten.le.Scalar(x, float(info.max)))
    if dtype in (torch.int64, torch.uint64):
        return None
    x = aten._to_copy.default(v, dtype=torch.int64)
    lo = -info.max if not dtype.is_signed else info.min
    return aten.logical_and.default(aten.ge.Scalar(x, lo), aten.le.Scalar(x, info.max))


def check_value_tensor(e, v, dtype) -> None:
    """``v`` (a 0-dim tensor value) converted to ``dtype`` as ATen does with ``v.item()``:
    on the CPU at once (CPU's own conversion), on the device by an asynchronous assert."""
    if not isinstance(v, torch.Tensor) or v.dim() != 0 or dtype == torch.bool:
        return
    if v.device.type == "cpu":
        check_convert(v.item(), dtype)
        return
    ok = _value_fits(v, dtype)
    if ok is not None:
        require(e, ok, _overflow_message(dtype))


def value_tensor_checked(inner):
    """``inner`` (a handler; None: the op's plain one) after the check of its 0-dim tensor
    ``value`` against ``self``'s dtype. ``fill_`` converts like ``copy_`` (wrapping) when
    the value is on ``self``'s device; only one from another device is read as a number."""

    def check(e, args, kwargs):
        self = args[0] if args else _arg(e, args, kwargs, "self")
        v = _arg(e, args, kwargs, "value")
        if isinstance(v, torch.Tensor) and (e.op._opname not in ("fill", "fill_")
                                            or v.device != self.device):
            check_value_tensor(e, v, self.dtype)

    return checked(check, inner)


def value_tensor_ops() -> list:
    """The ops that read a 0-dim tensor ``value`` as a number."""
    return [aten.masked_fill.Tensor, aten.masked_fill_.Tensor, aten.index_fill.int_Tensor,
            aten.index_fill_.int_Tensor, aten.fill.Tensor, aten.fill_.Tensor]

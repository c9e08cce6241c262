"""ATen's checks on integer math that XLA does not make: an integer division by zero
(``floor_divide``, ``remainder``, ``fmod``, ``div`` with a rounding mode) raises
``RuntimeError: ZeroDivisionError`` as CPU does, where XLA gives a value. A divisor known
on the host (a Python number, a CPU tensor) is checked at the op; one on the device by an
asynchronous assert read at the next sync point (``_exec.asserts``; at once in debug
mode), as an index check is."""
from __future__ import annotations

import numbers

import torch

from .._base import source as _source
from .._base.config import config
from .._exec import asserts as _asserts
from .._exec.values import concrete, new_tensor, value
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
    nonzero = aten.all.default(aten.ne.Scalar(other.detach(), 0))
    if nonzero.device.type == "cpu":
        if not nonzero.item():
            raise RuntimeError(_ZERO_DIV)
        return
    where = f"{e.name} at {_source.user_line(3)}"
    if config.mode == "debug":
        _asserts.check_now(concrete(nonzero), _ZERO_DIV, where)
    else:
        _asserts.add(new_tensor(value(nonzero))._st, _ZERO_DIV, where)


def division_checked(e, args, kwargs):
    """An integer division: its divisor checked, then the op."""
    if e.op._opname != "div" or _arg(e, args, kwargs, "rounding_mode") is not None:
        self = args[0] if args else _arg(e, args, kwargs, "self")
        check_divisor(e, self, _arg(e, args, kwargs, "other"))
    return (mutating if e.mut else functional)(e, args, kwargs)


def _overloads(*packets) -> list:
    return [getattr(p, n) for p in packets for n in p.overloads()]


def special_handlers() -> dict:
    """op -> handler, merged into ``special.SPECIAL``."""
    ops = _overloads(aten.floor_divide, aten.floor_divide_, aten.remainder, aten.remainder_,
                     aten.fmod, aten.fmod_)
    ops += [op for op in _overloads(aten.div, aten.div_) if "mode" in op._overloadname]
    return dict.fromkeys(ops, division_checked)

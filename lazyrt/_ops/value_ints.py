"""Value ints: a Python int that is an operand's *value* (``x * 3``, ``x.fill_(k)``,
``clamp(x, min=0)``, ``x == 7``) is a runtime int of the op's program, as a Python float
already is, so ``x * k`` over many ``k`` compiles one program, not one per ``k``.

Only ints at ``Scalar`` (schema ``number``) and ``Tensor`` positions (where PyTorch passes a
wrapped Python number: ``mul.Tensor(x, 3)``) of the ops in ``OPS`` are values: dims, sizes
and positions (``int`` arguments) never are. ``OPS`` lists elementwise ops whose lowerings
take a traced int as they take a Python int (no Python branch on the value; ``pow`` stays
out: an int exponent is an exact repeated product there, as on the CPU; so does ``div``:
XLA:CPU divides by a runtime scalar through its reciprocal, 1 ulp off PyTorch's quotient
in a third of float32 cases, where a constant divisor is divided exactly). A value beyond
2**53 stays static (a flush passes its scalars as one float64 vector), and ``bool`` is not
an int here.

The program then sees a weak-typed (strict) or int64 (defer) scalar in place of the
literal; every lowering's result is cast to the dtype PyTorch's meta kernel gives, and
integer ``+ - *`` wrap the same in either width, so results are the same.
"""
from __future__ import annotations

from .args import RuntimeInt

OPS = frozenset({
    "add", "add_", "sub", "sub_", "rsub", "mul", "mul_", "remainder",
    "remainder_", "fmod", "fmod_", "floor_divide", "floor_divide_", "fill", "fill_",
    "masked_fill", "masked_fill_", "clamp", "clamp_", "clamp_min", "clamp_min_", "clamp_max",
    "clamp_max_", "eq", "eq_", "ne", "ne_", "lt", "lt_", "le", "le_", "gt", "gt_", "ge", "ge_",
    "where", "bitwise_and", "bitwise_and_", "bitwise_or", "bitwise_or_", "bitwise_xor",
    "bitwise_xor_", "maximum", "minimum", "index_fill", "index_fill_",
})
_LIMIT = 2 ** 53


def slots(op) -> tuple:
    """``(positions, kwarg names)`` of ``op``'s value arguments (empty unless in ``OPS``)."""
    s = op._schema
    if s.name.split("::")[-1] not in OPS:
        return (), ()
    value = [a for a in s.arguments if str(a.type) in ("number", "Optional[number]", "Tensor")]
    pos = tuple(i for i, a in enumerate(s.arguments) if a in value and not a.kwarg_only)
    kw = tuple(a.name for a in value)
    return pos, kw


def _v(a):
    return RuntimeInt(a) if type(a) is int and -_LIMIT <= a <= _LIMIT else a


def convert(e, args, kwargs):
    """``args, kwargs`` with their value ints made ``RuntimeInt``s."""
    pos, kw = e.int_slots
    if any(i < len(args) and type(args[i]) is int for i in pos):
        args = tuple(_v(a) if i in pos else a for i, a in enumerate(args))
    if kwargs and any(type(kwargs.get(k)) is int for k in kw):
        kwargs = {k: (_v(v) if k in kw else v) for k, v in kwargs.items()}
    return args, kwargs

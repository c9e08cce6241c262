"""Elementwise ops: arithmetic, comparisons, unary math, activations and their
backward ops, casts and fills. In-place and out= variants are derived."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.special as jss
import numpy as np
import torch
from jax import lax

from .._base import dtypes as _dtypes
from ._registry import aten, lower, named, prims
from ._util import jdt, log1p, opmath


def _arr(x):
    return x if hasattr(x, "dtype") else jnp.asarray(x)


_E4M3FN = jnp.dtype(jnp.float8_e4m3fn)


def bool_to(x, dt):
    """Array ``x`` as dtype ``dt``; a bool one through uint8 when ``dt`` is inexact. NOTE:
    XLA's simplifier rewrites ``convert(pred) * y`` and ``convert(pred) / y`` into
    ``select(pred, y, 0)`` / ``select(pred, 1 / y, 0)``, so ``False * inf`` and
    ``False / 0`` gave 0 where IEEE (and PyTorch) give NaN (jax 0.10.2, XLA:CPU)."""
    if x.dtype == jnp.bool_ and jnp.issubdtype(dt, jnp.inexact):
        return x.astype(jnp.uint8).astype(dt)
    return x.astype(dt)


def _unbool(a, b):
    """``a`` with a bool array converted (``bool_to``) where the op's other operand is
    inexact: the promotion jnp would do, without the rewrite."""
    a = _arr(a)
    if a.dtype == jnp.bool_:
        bt = b.dtype if hasattr(b, "dtype") else None
        if bt is not None and jnp.issubdtype(bt, jnp.inexact):
            return bool_to(a, bt)
        if isinstance(b, float):
            return bool_to(a, jnp.float32)
    return a


def _float_of(x):
    """Float view of x for ops that are float-only in PyTorch (int inputs promote)."""
    x = _arr(x)
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return opmath(x)
    return bool_to(x, jnp.float32)


# ---- binary arithmetic ------------------------------------------------------------


def _reduced_alpha(self, other, alpha, sign):
    """``self + sign * alpha * other`` of float16/bfloat16 tensors as ATen's add kernel: the
    alpha rounded to their dtype, the rest in float32, rounded once; else None."""
    a, b = _arr(self), _arr(other)
    if a.dtype not in _REDUCED or b.dtype != a.dtype or jnp.iscomplexobj(alpha):
        return None
    al = jnp.asarray(alpha).astype(a.dtype).astype(jnp.float32)
    return (a.astype(jnp.float32) + sign * al * b.astype(jnp.float32)).astype(a.dtype)


def _c32_times(other, alpha):
    """``alpha * other`` as ATen computes it in complex32 (``complex<Half>``): both rounded
    to complex32 first, the product rounded to it (``_dtypes.c32_math``)."""
    if isinstance(alpha, (int, float, complex)):
        alpha = complex(alpha)
        alpha = complex(float(np.float16(alpha.real)), float(np.float16(alpha.imag)))
    else:
        alpha = _dtypes.round_narrow(jnp.asarray(alpha).astype(jnp.complex64), torch.complex32)
    other = _dtypes.round_narrow(jnp.asarray(other).astype(jnp.complex64), torch.complex32)
    return _dtypes.round_narrow(other * alpha, torch.complex32)


def _times_alpha(other, alpha):
    return _c32_times(other, alpha) if _dtypes.c32_math() else other * alpha


@lower(aten.add.Tensor, aten.add.Scalar)
def add(self, other, *, alpha=1):
    if not (isinstance(alpha, (int, bool)) and alpha == 1):
        r = _reduced_alpha(self, other, alpha, 1)
        if r is not None:
            return r
        other = _times_alpha(other, alpha)
    if _arr(self).dtype == jnp.bool_ and _arr(other).dtype == jnp.bool_:
        return jnp.logical_or(self, other)
    return self + other


@lower(aten.sub.Tensor, aten.sub.Scalar)
def sub(self, other, *, alpha=1):
    if not (isinstance(alpha, (int, bool)) and alpha == 1):
        r = _reduced_alpha(self, other, alpha, -1)
        if r is not None:
            return r
        other = _times_alpha(other, alpha)
    return self - other


@lower(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(self, other, *, alpha=1):
    return sub(other, self, alpha=alpha)


_REDUCED = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def _scalar_operand(x) -> bool:
    """A Python number, or a weak-typed 0-d value (a runtime float or int of the program)."""
    if isinstance(x, (int, float)):
        return True
    aval = getattr(x, "aval", None)
    return aval is not None and aval.ndim == 0 and bool(getattr(aval, "weak_type", False))


def _opmath_with_scalar(a, s, f):
    """``f(a, s)`` as ATen's mul and div kernels compute a float16/bfloat16 tensor with a
    scalar (CPU and CUDA alike): in float32 with the scalar unrounded (``opmath``), rounded
    once; jnp would round the scalar to the tensor's dtype first (1 ulp off in about a
    third of the elements for ``x * 1.7``). None where that rule does not apply."""
    a = _arr(a)
    if a.dtype not in _REDUCED or not _scalar_operand(s) or jnp.iscomplexobj(s):
        return None
    if hasattr(s, "dtype"):
        s = s.astype(jnp.float32)
    return f(a.astype(jnp.float32), s).astype(a.dtype)


@lower(aten.mul.Tensor, aten.mul.Scalar)
def mul(self, other):
    if _arr(self).dtype == jnp.bool_ and _arr(other).dtype == jnp.bool_:
        return jnp.logical_and(self, other)
    r = _opmath_with_scalar(self, other, jnp.multiply)
    if r is None:
        r = _opmath_with_scalar(other, self, jnp.multiply)
    if r is not None:
        return r
    return _unbool(self, other) * _unbool(other, self)


@lower(aten.div.Tensor, aten.div.Scalar)
def div(self, other):
    r = _opmath_with_scalar(self, other, jnp.true_divide)
    if r is not None:
        return r
    a, b = _arr(self), _arr(other)
    if not jnp.issubdtype(a.dtype, jnp.inexact) and not jnp.issubdtype(b.dtype, jnp.inexact):
        a = bool_to(a, jnp.float32)
    x, y = _unbool(a, b), _unbool(b, a)
    if jnp.iscomplexobj(x) or jnp.iscomplexobj(y):
        dt = jnp.result_type(x, y)
        return c10_div(jnp.asarray(x, dt), jnp.asarray(y, dt))
    return jnp.true_divide(x, y)


@lower(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(self, other, *, rounding_mode=None):
    if rounding_mode is None:
        return div(self, other)
    a, b = _arr(self), _arr(other)
    isint = not jnp.issubdtype(jnp.result_type(a, b), jnp.inexact)
    if rounding_mode == "trunc":
        if isint:
            q = lax.div(*jnp.broadcast_arrays(*(x.astype(jnp.result_type(a, b)) for x in (a, b))))
            return q
        return jnp.trunc(a / b)
    if rounding_mode == "floor":
        return jnp.floor_divide(a, b)
    raise ValueError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{rounding_mode}'")


@lower(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(self, other):
    return jnp.floor_divide(self, other)


@lower(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(self, other):
    return jnp.remainder(self, other)


@lower(prims.gcd.default)
def gcd(self, other):
    return jnp.gcd(self, other)


@lower(aten.lcm.default)
def lcm(self, other):
    """ATen: |a / gcd(a, b) * b| (wrapping), 0 when gcd is 0; int8/int16 computed in int32."""
    dt = jnp.result_type(self, other)
    wide = jnp.int32 if dt in (jnp.int8, jnp.int16) else dt
    a, b = self.astype(wide), other.astype(wide)
    g = jnp.gcd(a, b)
    safe = jnp.where(g == 0, 1, g)
    return jnp.where(g == 0, 0, jnp.abs(lax.div(a, safe) * b)).astype(dt)


@lower(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(self, other):
    return jnp.fmod(self, other)


def _int_pow(a, e):
    """Integer ``a ** e`` as ATen's ``powi``: square-and-multiply with wraparound over all
    64 exponent bits; a negative exponent gives 0, except for bases 1 and -1 (a 0-dim
    operand comes in the dimensioned one's dtype: ``_torch_int_operands``)."""
    dt = jnp.result_type(a, e)
    a, e = jnp.broadcast_arrays(a.astype(dt), e.astype(dt))

    def body(_, s):
        r, b, k = s
        r = jnp.where(k & 1 == 1, r * b, r)
        return r, b * b, k >> 1

    r, _, _ = lax.fori_loop(0, 8 * jnp.dtype(dt).itemsize, body,
                            (jnp.ones_like(a), a, jnp.maximum(e, 0)))
    if jnp.issubdtype(dt, jnp.signedinteger):
        neg = jnp.where(a == 1, 1, jnp.where(a == -1, jnp.where(e % 2 == 0, 1, -1), 0))
        r = jnp.where(e < 0, neg.astype(dt), r)
    return r


@lower(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def pow_(self, exponent):
    if isinstance(exponent, int) and not isinstance(exponent, bool):
        if exponent == 2:
            return self * self
        if exponent >= 0:
            return lax.integer_pow(_arr(self), exponent)
    a = _arr(self)
    e = _arr(exponent)
    if jnp.issubdtype(a.dtype, jnp.integer) and jnp.issubdtype(e.dtype, jnp.integer):
        return _int_pow(a, e)
    return jnp.power(opmath(a) if jnp.issubdtype(a.dtype, jnp.inexact) else a, e)


@lower(aten.float_power.Tensor_Tensor, aten.float_power.Tensor_Scalar, aten.float_power.Scalar)
def float_power(self, exponent):
    dt = jnp.complex128 if jnp.iscomplexobj(self) or jnp.iscomplexobj(exponent) else jnp.float64
    return jnp.power(jnp.asarray(self, dt), jnp.asarray(exponent, dt))


@lower(aten.maximum.default)
def maximum(self, other):
    return jnp.maximum(self, other)


@lower(aten.minimum.default)
def minimum(self, other):
    return jnp.minimum(self, other)


@lower(aten.fmax.default)
def fmax(self, other):
    return jnp.fmax(self, other)


@lower(aten.fmin.default)
def fmin(self, other):
    return jnp.fmin(self, other)


@lower(aten.atan2.default)
def atan2(self, other):
    return jnp.arctan2(_float_of(self), _float_of(other))


@lower(aten.hypot.default)
def hypot(self, other):
    return jnp.hypot(self, other)


@lower(aten.copysign.Tensor, aten.copysign.Scalar)
def copysign(self, other):
    return jnp.copysign(_float_of(self), _float_of(other))


@lower(aten.nextafter.default)
def nextafter(self, other):
    return jnp.nextafter(self, other)


@lower(aten.heaviside.default)
def heaviside(self, values):
    return jnp.heaviside(self, values)


@lower(aten.logaddexp.default)
def logaddexp(self, other):
    return jnp.logaddexp(self, other)


@lower(aten.logaddexp2.default)
def logaddexp2(self, other):
    return jnp.logaddexp2(self, other)


@lower(aten.xlogy.Tensor, aten.xlogy.Scalar_Self, aten.xlogy.Scalar_Other)
def xlogy(self, other):
    return jss.xlogy(_float_of(self), _float_of(other))


@lower(aten.special_xlog1py.default)
def xlog1py(self, other):
    return jss.xlog1py(_float_of(self), _float_of(other))


@lower(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(self, end, weight):
    return self + weight * (end - self)


@lower(aten.addcmul.default)
def addcmul(self, tensor1, tensor2, *, value=1):
    return self + value * tensor1 * tensor2


@lower(aten.addcdiv.default)
def addcdiv(self, tensor1, tensor2, *, value=1):
    return self + value * (tensor1 / tensor2)


# ---- bitwise / logical ---------------------------------------------------------------


@lower(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, aten.bitwise_and.Scalar_Tensor)
def bitwise_and(self, other):
    return jnp.bitwise_and(self, other)


@lower(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, aten.bitwise_or.Scalar_Tensor)
def bitwise_or(self, other):
    return jnp.bitwise_or(self, other)


@lower(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, aten.bitwise_xor.Scalar_Tensor)
def bitwise_xor(self, other):
    return jnp.bitwise_xor(self, other)


@lower(aten.bitwise_not.default)
def bitwise_not(self):
    return jnp.invert(self)


@lower(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
       aten.bitwise_left_shift.Scalar_Tensor, aten.__lshift__.Tensor, aten.__lshift__.Scalar)
def lshift(self, other):
    return jnp.left_shift(self, other)


@lower(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
       aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor, aten.__rshift__.Scalar)
def rshift(self, other):
    return jnp.right_shift(self, other)


@lower(aten.logical_and.default)
def logical_and(self, other):
    return jnp.logical_and(self, other)


@lower(aten.logical_or.default)
def logical_or(self, other):
    return jnp.logical_or(self, other)


@lower(aten.logical_xor.default)
def logical_xor(self, other):
    return jnp.logical_xor(self, other)


@lower(aten.logical_not.default)
def logical_not(self):
    return jnp.logical_not(self)


# ---- comparisons -------------------------------------------------------------------------

for _name, _f in (("eq", jnp.equal), ("ne", jnp.not_equal), ("lt", jnp.less),
                  ("le", jnp.less_equal), ("gt", jnp.greater), ("ge", jnp.greater_equal)):
    def _cmp(self, other, _f=_f):
        return _f(self, other)

    lower(getattr(aten, _name).Tensor, getattr(aten, _name).Scalar)(named(_cmp, _name))


@lower(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(condition, self, other):
    return jnp.where(condition, self, other)


@lower(aten.clamp.default, aten.clamp.Tensor)
def clamp(self, min=None, max=None):
    out = self
    if min is not None:
        out = jnp.maximum(out, min)
    if max is not None:
        out = jnp.minimum(out, max)
    if jnp.issubdtype(_arr(self).dtype, jnp.inexact):
        out = jnp.where(jnp.isnan(self), self, out)
    return out


@lower(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(self, min):
    return clamp(self, min=min)


@lower(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(self, max):
    return clamp(self, max=max)


@lower(aten.isnan.default)
def isnan(self):
    return jnp.isnan(self)


@lower(aten.isinf.default)
def isinf(self):
    return jnp.isinf(self)


@lower(aten.isposinf.default)
def isposinf(self):
    return jnp.isposinf(self)


@lower(aten.isneginf.default)
def isneginf(self):
    return jnp.isneginf(self)


@lower(aten.isfinite.default)
def isfinite(self):
    return jnp.isfinite(self)


@lower(aten.signbit.default)
def signbit(self):
    return jnp.signbit(self)


@lower(aten.nan_to_num.default)
def nan_to_num(self, nan=None, posinf=None, neginf=None):
    if not jnp.issubdtype(self.dtype, jnp.inexact):
        return self
    fi = jnp.finfo(self.dtype)
    out = jnp.where(jnp.isnan(self), 0.0 if nan is None else nan, self)
    out = jnp.where(jnp.isposinf(self), fi.max if posinf is None else posinf, out)
    out = jnp.where(jnp.isneginf(self), fi.min if neginf is None else neginf, out)
    return out


# ---- unary math ------------------------------------------------------------------------


def digamma(x):
    """digamma with ATen's pole at zero: -inf at +0, +inf at -0 (jax gives nan)."""
    return jnp.where(x == 0, jnp.copysign(jnp.asarray(jnp.inf, x.dtype), -x), jss.digamma(x))


def exp(x):
    """exp with C99's ``cexp`` special values for complex x (those of PyTorch off CPU and of
    NumPy; jax gives nan+nanj): a zero imaginary part stays exact (``exp(inf+0j) = inf+0j``);
    ``+inf`` real with a non-finite imaginary part is ``inf+nanj``, ``-inf`` real is ``0+0j``."""
    if not jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.exp(x)
    re, im = jnp.real(x), jnp.imag(x)
    out = jnp.exp(x)
    inf_re = jnp.isinf(re) & ~jnp.isfinite(im)
    fix_re = jnp.where(re > 0, jnp.inf, 0.0).astype(re.dtype)
    fix_im = jnp.where(re > 0, jnp.nan, 0.0).astype(re.dtype)
    out = jnp.where(inf_re, lax.complex(fix_re, fix_im), out)
    return jnp.where((im == 0) & ~jnp.isnan(re), lax.complex(jnp.exp(re), im), out)


def c10_div(a, b):
    """Complex ``a / b`` as c10::complex divides (NumPy's algorithm, Smith's): ``1 / (inf +
    inf j)`` is NaN there, where XLA's complex divide gives 0."""
    ar, ai, br, bi = jnp.real(a), jnp.imag(a), jnp.real(b), jnp.imag(b)
    big_r = jnp.abs(br) >= jnp.abs(bi)
    zero = (br == 0) & (bi == 0)
    # |re| >= |im|: rat = im / re; otherwise rat = re / im (divisions kept apart by where)
    num, den = jnp.where(big_r, bi, br), jnp.where(big_r, br, bi)
    rat = num / jnp.where(zero, 1, den)
    scl = 1 / (den + num * rat)
    re = jnp.where(big_r, ar + ai * rat, ar * rat + ai) * scl
    im = jnp.where(big_r, ai - ar * rat, ai * rat - ar) * scl
    re = jnp.where(zero, ar / jnp.abs(br), re)
    im = jnp.where(zero, ai / jnp.abs(bi), im)
    return lax.complex(re, im)


def _hyperbolic_parts(x):
    """``(|x|, exp(|x|), the large-|x| value exp(|x|) / 2)`` in at least float32. XLA's
    cosh/sinh compute ``exp(|x| - log 2)``, whose rounded subtraction costs ``|x| * eps / 2``
    relative (float32: 12.6 ulp on average over [-90, 90], 24 at most); here
    ``exp(|x|) / 2`` is rounded once, and past exp's overflow as ``(exp(|x| / 2) / 2) *
    exp(|x| / 2)`` (python -m perf.hyperbolic)."""
    wide = jnp.promote_types(x.dtype, jnp.float32)
    a = jnp.abs(x.astype(wide))
    e = jnp.exp(a)
    h = jnp.exp(0.5 * a)
    return a, e, jnp.where(a < _EXP_SAFE[wide], 0.5 * e, (0.5 * h) * h)


# |x| below which exp(|x|) is finite (float32: 88.72; float64: 709.78), kept back a little
_EXP_SAFE = {jnp.dtype(jnp.float32): 88.0, jnp.dtype(jnp.float64): 709.0}


def cosh(x):
    if jnp.iscomplexobj(x):
        return jnp.cosh(x)
    a, e, half = _hyperbolic_parts(x)
    return (half + 0.5 / e).astype(x.dtype)


def sinh(x):
    if jnp.iscomplexobj(x):
        return jnp.sinh(x)
    a, e, half = _hyperbolic_parts(x)
    m = jnp.expm1(a)  # (below 1: no cancellation)
    small = 0.5 * (m + m / (m + 1))
    r = jnp.where(a < 1, small, half - 0.5 / e)
    return jnp.copysign(r, x.astype(r.dtype)).astype(x.dtype)


def reciprocal(x):
    # complex: c10's division, as ATen's ``1 / z`` (XLA's gives 0 for ``1 / (inf + inf j)``)
    return c10_div(jnp.ones_like(x), x) if jnp.iscomplexobj(x) else jnp.reciprocal(x)


def sigmoid(x):
    if not jnp.iscomplexobj(x):
        return jax.nn.sigmoid(x)
    # ATen's complex sigmoid: 1 / (1 + exp(-x)), c10's exp and division
    return c10_div(jnp.ones_like(x), 1 + exp(-x))


_FLOAT_UNARY = {
    "exp": exp, "exp2": jnp.exp2, "expm1": jnp.expm1, "log": jnp.log, "log2": jnp.log2,
    "log10": jnp.log10, "log1p": log1p, "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt,
    "sin": jnp.sin, "cos": jnp.cos, "tan": jnp.tan, "asin": jnp.arcsin, "acos": jnp.arccos,
    "atan": jnp.arctan, "sinh": sinh, "cosh": cosh, "tanh": jnp.tanh,
    "asinh": jnp.arcsinh, "acosh": jnp.arccosh, "atanh": jnp.arctanh,
    "sigmoid": sigmoid, "erf": jss.erf, "erfc": jss.erfc, "erfinv": jss.erfinv,
    "lgamma": jss.gammaln, "digamma": digamma, "i0": jss.i0, "sinc": jnp.sinc,
    "deg2rad": jnp.deg2rad, "rad2deg": jnp.rad2deg, "reciprocal": reciprocal,
    "special_i0e": jss.i0e, "special_i1": jss.i1, "special_i1e": jss.i1e,
    "special_ndtr": jss.ndtr, "special_ndtri": jss.ndtri, "special_erfcx": jss.erfcx,
    "special_log_ndtr": jss.log_ndtr, "special_entr": jss.entr,
}

for _name, _f in _FLOAT_UNARY.items():
    _packet = getattr(aten, _name, None)
    if _packet is None:
        continue

    def _unary(self, _f=_f):
        return _f(_float_of(self))

    lower(_packet.default)(named(_unary, _name))


@lower(aten.neg.default)
def neg(self):
    return jnp.negative(self)


@lower(aten.abs.default)
def abs_(self):
    return jnp.abs(self)


@lower(aten.sign.default)
def sign(self):
    if self.dtype == jnp.bool_:
        return self
    return jnp.sign(self)


@lower(aten.sgn.default)
def sgn(self):
    if jnp.iscomplexobj(self):
        a = jnp.abs(self)
        return jnp.where(a == 0, 0, self / jnp.where(a == 0, 1, a))
    return sign(self)


@lower(aten.floor.default)
def floor(self):
    return self if not jnp.issubdtype(self.dtype, jnp.inexact) else jnp.floor(self)


@lower(aten.ceil.default)
def ceil(self):
    return self if not jnp.issubdtype(self.dtype, jnp.inexact) else jnp.ceil(self)


@lower(aten.trunc.default)
def trunc(self):
    return self if not jnp.issubdtype(self.dtype, jnp.inexact) else jnp.trunc(self)


@lower(aten.frac.default)
def frac(self):
    return self - jnp.trunc(self)


@lower(aten.round.default)
def round_(self):
    return self if not jnp.issubdtype(self.dtype, jnp.inexact) else jnp.round(self)


@lower(aten.round.decimals)
def round_decimals(self, *, decimals=0):
    return jnp.round(self, decimals)


@lower(aten.logit.default)
def logit(self, eps=None):
    x = _float_of(self)
    if eps is not None:
        x = jnp.clip(x, eps, 1 - eps)
    return jnp.log(x / (1 - x))


@lower(aten.mvlgamma.default)
def mvlgamma(self, p):
    return jss.multigammaln(_float_of(self), p)


@lower(aten.positive.default)
def positive(self):
    return self


@lower(aten.conj_physical.default, aten._conj_physical.default)
def conj_physical(self):
    return jnp.conj(self)


@lower(aten.angle.default)
def angle(self):
    if jnp.iscomplexobj(self):
        return jnp.angle(self)
    x = _float_of(self)
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.pi, 0.0))


@lower(aten.complex.default)
def complex_(real, imag):
    real, imag = jnp.broadcast_arrays(opmath(real), opmath(imag))  # float16: complex32's parts
    return lax.complex(real, imag)


@lower(aten.polar.default)
def polar(abs, angle):
    abs, angle = jnp.broadcast_arrays(opmath(abs), opmath(angle))
    return lax.complex(abs * jnp.cos(angle), abs * jnp.sin(angle))


@lower(aten.frexp.Tensor)
def frexp(self):
    m, e = jnp.frexp(self)
    finite = jnp.isfinite(self)
    return jnp.where(finite, m, self), jnp.where(finite, e, 0).astype(jnp.int32)


def _igamma_edges(a, x, value, upper: bool):
    """ATen's ``calc_igamma``/``calc_igammac`` edge cases (jax gives nan at a = 0 and at an
    infinite a or x): a negative argument is nan; a = 0 is the step at x > 0; x = 0 is the
    start; an infinite a (finite x) is 0 (upper: 1); an infinite x is 1 (upper: 0)."""
    lo, hi = (1.0, 0.0) if upper else (0.0, 1.0)
    nan = jnp.nan
    out = jnp.where(jnp.isinf(x), hi, value)
    out = jnp.where(jnp.isinf(a), jnp.where(jnp.isinf(x), nan, lo), out)
    out = jnp.where(x == 0, lo, out)
    out = jnp.where(a == 0, jnp.where(x > 0, hi, nan), out)
    return jnp.where((a < 0) | (x < 0), nan, out).astype(value.dtype)


@lower(aten.igamma.default)
def igamma(self, other):
    a, x = jnp.broadcast_arrays(_float_of(self), _float_of(other))
    return _igamma_edges(a, x, jss.gammainc(a, x), upper=False)


@lower(aten.igammac.default)
def igammac(self, other):
    a, x = jnp.broadcast_arrays(_float_of(self), _float_of(other))
    return _igamma_edges(a, x, jss.gammaincc(a, x), upper=True)


# ---- activations ---------------------------------------------------------------------------


@lower(aten.relu.default)
def relu(self):
    return jnp.maximum(self, 0)


@lower(aten.gelu.default)
def gelu(self, *, approximate="none"):
    x = opmath(self)
    if approximate == "tanh":
        return jax.nn.gelu(x, approximate=True)
    # PyTorch's own formula. jax.nn.gelu's erfc form is as exact but costs about 2.6x on
    # XLA:CPU (erfc evaluates two polynomials, an exp and two divides).
    return x * 0.5 * (1 + jss.erf(x * 0.7071067811865476))


@lower(aten.gelu_backward.default)
def gelu_backward(grad_output, self, *, approximate="none"):
    x = opmath(self)
    g = opmath(grad_output)
    if approximate == "tanh":
        k = jnp.sqrt(2.0 / jnp.pi).astype(x.dtype)
        inner = k * (x + 0.044715 * x**3)
        t = jnp.tanh(inner)
        d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)
        return g * d
    cdf = 0.5 * (1 + jss.erf(x / jnp.sqrt(2.0).astype(x.dtype)))
    pdf = jnp.exp(-0.5 * x * x) / jnp.sqrt(2 * jnp.pi).astype(x.dtype)
    return g * (cdf + x * pdf)


@lower(aten.silu.default)
def silu(self):
    x = opmath(self)
    return x * jax.nn.sigmoid(x)


@lower(aten.silu_backward.default)
def silu_backward(grad_output, self):
    x = opmath(self)
    s = jax.nn.sigmoid(x)
    return opmath(grad_output) * s * (1 + x * (1 - s))


@lower(aten.mish.default)
def mish(self):
    x = opmath(self)
    return x * jnp.tanh(jax.nn.softplus(x))


@lower(aten.mish_backward.default)
def mish_backward(grad_output, self):
    x = opmath(self)
    sp = jax.nn.softplus(x)
    t = jnp.tanh(sp)
    s = jax.nn.sigmoid(x)
    return opmath(grad_output) * (t + x * s * (1 - t * t))


@lower(aten.sigmoid_backward.default)
def sigmoid_backward(grad_output, output):
    return grad_output * output * (1 - output)


@lower(aten.tanh_backward.default)
def tanh_backward(grad_output, output):
    return grad_output * (1 - output * output)


@lower(aten.threshold.default)
def threshold(self, threshold, value):
    return jnp.where(self <= threshold, value, self)


@lower(aten.threshold_backward.default)
def threshold_backward(grad_output, self, threshold):
    return jnp.where(self <= threshold, jnp.zeros_like(grad_output), grad_output)


@lower(aten.softplus.default)
def softplus(self, beta=1, threshold=20):
    x = opmath(self)
    bx = x * beta
    return jnp.where(bx > threshold, x, log1p(jnp.exp(bx)) / beta)


@lower(aten.softplus_backward.default)
def softplus_backward(grad_output, self, beta, threshold):
    x = opmath(self)
    bx = x * beta
    z = jnp.exp(bx)
    return jnp.where(bx > threshold, grad_output, grad_output * z / (z + 1))


@lower(aten.elu.default)
def elu(self, alpha=1, scale=1, input_scale=1):
    x = opmath(self)
    return jnp.where(x > 0, x * scale, (jnp.exp(x * input_scale) - 1) * alpha * scale)


@lower(aten.elu_backward.default)
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    x = opmath(self_or_result)
    g = opmath(grad_output)
    if is_result:
        neg = g * input_scale * (x + alpha * scale)
    else:
        neg = g * input_scale * alpha * scale * jnp.exp(x * input_scale)
    return jnp.where(x > 0, g * scale, neg)


@lower(aten.leaky_relu.default)
def leaky_relu(self, negative_slope=0.01):
    return jnp.where(self > 0, self, self * negative_slope)


@lower(aten.leaky_relu_backward.default)
def leaky_relu_backward(grad_output, self, negative_slope, self_is_result):
    return jnp.where(self > 0, grad_output, grad_output * negative_slope)


@lower(aten.hardtanh.default)
def hardtanh(self, min_val=-1, max_val=1):
    return jnp.clip(self, min_val, max_val)


@lower(aten.hardtanh_backward.default)
def hardtanh_backward(grad_output, self, min_val, max_val):
    return jnp.where((self <= min_val) | (self >= max_val), 0, grad_output)


@lower(aten.hardsigmoid.default)
def hardsigmoid(self):
    return jnp.clip(self / 6 + 0.5, 0, 1)


@lower(aten.hardsigmoid_backward.default)
def hardsigmoid_backward(grad_output, self):
    return jnp.where((self > -3) & (self < 3), grad_output / 6, 0)


@lower(aten.hardswish.default)
def hardswish(self):
    return self * jnp.clip(self + 3, 0, 6) / 6


@lower(aten.hardswish_backward.default)
def hardswish_backward(grad_output, self):
    return jnp.where(self < -3, 0, jnp.where(self <= 3, grad_output * (2 * self + 3) / 6, grad_output))


@lower(aten.logit_backward.default)
def logit_backward(grad_output, self, eps=None):
    x = opmath(self)
    g = grad_output / (x * (1 - x))
    if eps is None:
        return jnp.where((x < 0) | (x > 1), jnp.nan, g)
    return jnp.where((x < eps) | (x > 1 - eps), 0, g)


# ---- casts, copies, fills ---------------------------------------------------------------------


# float -> integer conversion of values out of the target's range (and NaN): undefined in
# C++, x86's on PyTorch's CPU (and NumPy's there): the value truncated to int32 (int64 for a
# 64-bit target, and for uint8 from float64) where it fits, else that type's minimum, then
# wrapped to the target's bits (-2.0 -> uint8 is 254, float32 max -> int16 is 0). XLA
# saturates instead (32767). Unsigned 32/64-bit targets take the unsigned conversion's
# route: from 2**31 (2**63) up, x - 2**31 truncated and its top bit flipped (x >= 2**32 and
# inf give 0, NaN and x < -2**31 give 2**31). PyTorch's CPU loop gives this for uint32 in
# its vectorized body, i.e. all but the last len % 4 elements of a contiguous tensor (its
# scalar tail, a strided input and a float16 source go through int64 instead); uint64 has
# one rule on both.
_I32_VIA = {jnp.dtype(d) for d in (jnp.int8, jnp.int16, jnp.int32, jnp.uint8, jnp.uint16)}
_I64_VIA = {jnp.dtype(d) for d in (jnp.int64, jnp.uint32)}
_UNSIGNED_VIA = {jnp.dtype(jnp.uint32): jnp.int32, jnp.dtype(jnp.uint64): jnp.int64}


def _trunc(xf, via):
    """``xf`` truncated to the integer type ``via`` as x86 does: its minimum where out of range."""
    info = jnp.iinfo(via)
    ok = (xf > float(info.min) - 1) & (xf < -float(info.min))
    return jnp.where(ok, jnp.where(ok, xf, 0).astype(via), info.min)


def cast(x, jd):
    """``x.astype(jd)`` with PyTorch CPU's conversions where they differ from XLA's."""
    jd = jnp.dtype(jd)
    if jnp.issubdtype(x.dtype, jnp.floating) and jd in _UNSIGNED_VIA and not (
            jd == jnp.uint32 and x.dtype == jnp.float16):
        via = _UNSIGNED_VIA[jd]
        xf = x.astype(jnp.float64 if via == jnp.int64 else jnp.promote_types(x.dtype, jnp.float32))
        top = -float(jnp.iinfo(via).min)
        big = xf >= top
        i = _trunc(jnp.where(big, xf - top, xf), via)
        return (i ^ jnp.where(big, jnp.iinfo(via).min, 0).astype(via)).astype(jd)
    if jnp.issubdtype(x.dtype, jnp.floating) and jd in _I32_VIA | _I64_VIA:
        via = jnp.int64 if jd in _I64_VIA or (jd == jnp.uint8 and x.dtype == jnp.float64) \
            else jnp.int32
        xf = x.astype(jnp.float64) if x.dtype != jnp.float64 and via == jnp.int64 else x.astype(
            jnp.promote_types(x.dtype, jnp.float32))
        return _trunc(xf, via).astype(jd)
    if x.dtype == jnp.bool_:
        return bool_to(x, jd)
    return x.astype(jd)


@lower(aten._to_copy.default)
def _to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    if dtype is not None:
        jd = jdt(dtype)
        if jnp.iscomplexobj(self) and not jnp.issubdtype(jd, jnp.complexfloating):
            self = jnp.real(self)
        if jd == _E4M3FN and jnp.issubdtype(self.dtype, jnp.floating):
            # PyTorch saturates to +-448 (inf too); XLA's convert gives NaN
            self = jnp.clip(self, -448, 448)
        return cast(self, jd)
    return self


@lower(prims.convert_element_type.default)
def convert_element_type(a, dtype):
    return _to_copy(a, dtype=dtype)


@lower(aten.clone.default)
def clone(self, *, memory_format=None):
    return self


@lower(aten.lift_fresh_copy.default)
def lift_fresh_copy(self):
    return self


@lower(aten.copy.default)
def copy(self, src, non_blocking=False):
    if jnp.iscomplexobj(src) and not jnp.iscomplexobj(self):
        src = jnp.real(src)
    return jnp.broadcast_to(cast(src, self.dtype), self.shape)


@lower(aten.fill.Scalar, aten.fill.Tensor)
def fill(self, value):
    if hasattr(value, "dtype") and jnp.ndim(value) == 0:  # a tensor's value: as ``copy_``
        if jnp.iscomplexobj(value) and not jnp.iscomplexobj(self):
            value = jnp.real(value)
        return jnp.broadcast_to(cast(value, self.dtype), self.shape)
    return jnp.full(self.shape, value, dtype=self.dtype)


@lower(aten.zero.default)
def zero(self):
    return jnp.zeros_like(self)


@lower(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(self, mask, value):
    return jnp.where(mask, jnp.asarray(value).astype(self.dtype), self)



# ---- integer operands: PyTorch's result type ----------------------------------------------


def _torch_int_operands(fn):
    """``fn`` with its 0-dim integer operands (0-dim tensors, Python ints made runtime
    values) cast first to the integer dtype of its dimensioned operands, as PyTorch's type
    promotion does: a 0-dim operand does not widen a dimensioned one of its category. JAX
    promotes by dtype alone, so ``uint8_tensor < torch.tensor(-1)`` compared in int64
    (False everywhere) where CPU compares with 255 (True); likewise integer division,
    remainder, min/max, clamp, shifts and lcm. (Floats keep their value: ATen's kernels
    read a 0-dim float operand unrounded, in the op's math type.)"""

    def wrapped(*args, **kwargs):
        vals = [*args, *kwargs.values()]
        dims = [a.dtype for a in vals if isinstance(a, jax.Array) and a.ndim > 0
                and a.dtype != jnp.bool_]
        if not dims or not all(jnp.issubdtype(d, jnp.integer) for d in dims):
            return fn(*args, **kwargs)
        common = jnp.result_type(*dims)

        def cast(a):
            if (isinstance(a, jax.Array) and a.ndim == 0 and a.dtype != common
                    and jnp.issubdtype(a.dtype, jnp.integer)):
                return a.astype(common)
            return a

        return fn(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})

    wrapped.__module__, wrapped.__qualname__ = fn.__module__, fn.__qualname__
    wrapped.__wrapped__ = fn
    return wrapped


def _int_operands_as_torch() -> None:
    import dataclasses

    from ._registry import LOWERINGS

    for op, low in list(LOWERINGS.items()):
        name = op._opname
        if (getattr(low.fn, "__module__", None) == __name__ and name in _IN_COMMON_INT
                and (name != "div" or "mode" in op._overloadname)):
            LOWERINGS[op] = dataclasses.replace(low, fn=_torch_int_operands(low.fn))


# ops whose integer operands PyTorch converts to their common integer dtype before it
# computes (true division and float math convert each operand to float instead)
_IN_COMMON_INT = frozenset((
    "eq", "ne", "lt", "le", "gt", "ge", "floor_divide", "remainder", "fmod", "div",
    "maximum", "minimum", "fmax", "fmin", "clamp", "clamp_min", "clamp_max", "bitwise_and",
    "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "__lshift__",
    "__rshift__", "gcd", "lcm", "add", "sub", "rsub", "mul", "where", "heaviside",
    "logical_and", "logical_or", "logical_xor", "pow"))


_int_operands_as_torch()

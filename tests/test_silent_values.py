"""Cases where tpu gave a value (or no error) where PyTorch CPU eager gives another value or
raises, each checked against CPU eager in strict and defer: float -> uint32/uint64/uint8
conversions out of range, integer pow to a negative power, normal with a negative std,
complex32 add/sub with alpha, reductions over more than 64 dims."""
from __future__ import annotations

import pytest
import torch

_NAN, _INF = float("nan"), float("inf")
_UVALS = (_NAN, _INF, -_INF, -1.5, -1.0, -0.5, 0.0, 0.7, 1.5, 255.9, 3e9, 4294967295.0, 2.0**31,
          -2.0**31, -2.0**31 - 1, -3e9, 2.0**32, 2.0**33 + 7, 5e9, 1e19, 2.0**63, -2.0**63, 2.0**64,
          1e20, -1e20, -4294967301.0, -70000.0, -300.0)


@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.float16, torch.bfloat16],
                         ids=str)
@pytest.mark.parametrize("dst", [torch.uint32, torch.uint64, torch.uint8], ids=str)
def test_float_to_unsigned_out_of_range(mode, src, dst):
    """Bit for bit as PyTorch's CPU converts (x86): uint64 and uint32 through the unsigned
    route (x >= 2**31 (2**63): x - 2**31 truncated, top bit flipped; x >= 2**32 and inf give
    0, NaN and x < -2**31 give 2**31); uint8 from float64 through int64. XLA saturated.
    (CPU's uint32 loop takes that route in its vectorized body; its scalar tail - the last
    len % 4 elements, a strided input - goes through int64: the length here is a multiple
    of 16, so CPU's every element takes the vectorized one.)"""
    x = torch.tensor(_UVALS, dtype=torch.float64).to(src).repeat(16)
    t = x.to("tpu")
    got, want = t.to(dst).cpu(), x.to(dst)
    assert got.dtype == want.dtype
    bad = [(float(x[i]), int(got[i]), int(want[i])) for i in range(len(_UVALS)) if got[i] != want[i]]
    assert not bad, bad
    assert torch.equal(got, want)
    out = torch.zeros(x.numel(), dtype=dst, device="tpu").copy_(t).cpu()
    assert torch.equal(out, torch.zeros(x.numel(), dtype=dst).copy_(x))


def _same_outcome(f):
    """``f(device)`` on CPU and tpu: the same values, or the same exception and message."""
    try:
        want = f("cpu")
    except Exception as ex:  # the CPU's exception is the expectation
        with pytest.raises(type(ex)) as got:
            r = f("tpu")
            if isinstance(r, torch.Tensor):
                r.cpu()
        assert str(got.value) == str(ex)
        return
    got = f("tpu").cpu()
    assert got.dtype == want.dtype and torch.equal(got, want), (got, want)


def _ints(d, dtype=torch.int64):
    return torch.tensor([-2, -1, 0, 1, 2, 3], dtype=dtype, device=d)


_POW = {
    "uint8_scalar": lambda d: _ints(d).to(torch.uint8) ** -1,
    "int64_pow": lambda d: _ints(d).pow(-2),
    "int32_torch_pow": lambda d: torch.pow(_ints(d, torch.int32), -3),
    "int8_out": lambda d: torch.pow(_ints(d, torch.int8), -1, out=torch.empty(6, dtype=torch.int8, device=d)),
    "bool": lambda d: (_ints(d) > 0).pow(-1),
    "inplace": lambda d: _ints(d).pow_(-1),
    "ipow": lambda d: _ipow(_ints(d, torch.int16)),
    # no error on CPU: a tensor exponent, a scalar base, a float exponent, exponent 0
    "tensor_exponent": lambda d: _ints(d).pow(_ints(d).flip(0)),
    "tensor_exponent_inplace": lambda d: _ints(d).pow_(torch.tensor(-1, device=d)),
    "scalar_base": lambda d: torch.pow(2, _ints(d)),
    "rpow": lambda d: 3 ** _ints(d, torch.int32),
    "float_exponent": lambda d: _ints(d).pow(-1.0),
    "zero": lambda d: _ints(d) ** 0,
}


def _ipow(x):
    x **= -2
    return x


@pytest.mark.parametrize("case", _POW)
def test_int_pow_negative_exponent(mode, case):
    """An integer tensor to a negative integer Python scalar: PyTorch's RuntimeError at the
    op (tpu computed 0/1/-1, as for a tensor exponent, which PyTorch takes)."""
    _same_outcome(_POW[case])


_NORMAL_FLOAT = {
    "normal_": lambda d: torch.empty(3, device=d).normal_(0.0, -2.0),
    "float_float": lambda d: torch.normal(0.0, -1.0, size=(3,), device=d),
    "tensor_float": lambda d: torch.normal(torch.zeros(3, device=d), -100.0),
    "tensor_float_out": lambda d: torch.normal(torch.zeros(3, device=d), -1.23456789,
                                               out=torch.empty(3, device=d)),
    "nan": lambda d: torch.empty(3, device=d).normal_(0.0, _NAN),
}


@pytest.mark.parametrize("case", _NORMAL_FLOAT)
def test_normal_negative_float_std(mode, case):
    """A negative (or NaN) Python float std: PyTorch's error at the op, the std printed as
    C++ prints a double ("-1", not "-1.0")."""
    _same_outcome(_NORMAL_FLOAT[case])


def _std(d):
    return torch.tensor([1.0, -0.5, 2.0], device=d)


_NORMAL_TENSOR = {
    "float_tensor": lambda d: torch.normal(0.0, _std(d)),
    "tensor_tensor": lambda d: torch.normal(torch.zeros(3, device=d), _std(d)),
    "tensor_tensor_out": lambda d: torch.normal(torch.zeros(3, device=d), _std(d),
                                                out=torch.empty(3, device=d)),
    "float_tensor_out": lambda d: torch.normal(1.0, _std(d), out=torch.empty(3, device=d)),
    "nan": lambda d: torch.normal(0.0, torch.tensor([1.0, _NAN], device=d)),
    "computed": lambda d: torch.normal(0.0, torch.ones(4, device=d) - 2),
}


@pytest.mark.parametrize("case", _NORMAL_TENSOR)
def test_normal_negative_std_tensor(mode, case):
    """A std tensor with a negative (or NaN) element: CPU raises at the op; on tpu its values
    live on the device, so the check is an asynchronous assert: PyTorch's RuntimeError and
    message at the next sync point (here ``.cpu()``), and not before."""
    f = _NORMAL_TENSOR[case]
    with pytest.raises(RuntimeError) as cpu:
        f("cpu")
    r = f("tpu")
    assert r.shape == (r.numel(),)
    with pytest.raises(RuntimeError) as tpu:
        r.cpu()
    assert str(tpu.value).split("\n")[0] == str(cpu.value) == "normal expects all elements of std >= 0.0"
    torch.zeros(1, device="tpu").cpu()  # read once: nothing left to raise


def test_normal_std_tensor_ok(mode):
    """Non-negative stds (zero, -0.0 included) pass: the values are drawn, no assert fails."""
    std = torch.tensor([0.0, -0.0, 1.0, 2.0])
    torch.manual_seed(0)
    r = torch.normal(torch.zeros(4, device="tpu"), std.to("tpu")).cpu()
    assert r.shape == (4,) and r[0] == 0 and r[1] == 0
    r = torch.normal(0.0, std.to("tpu"), out=torch.empty(4, device="tpu")).cpu()
    assert r[0] == 0 and r[1] == 0


def _c32(seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(512, dtype=torch.complex64, generator=g) * 3).to(torch.complex32)


def _c32_bits(t):
    return torch.view_as_real(t.detach().cpu().to(torch.complex64))


_C32_ALPHA = {
    "add": lambda a, b: torch.add(a, b, alpha=1.7),
    "sub": lambda a, b: torch.sub(a, b, alpha=1.0001),
    "add_complex_alpha": lambda a, b: torch.add(a, b, alpha=0.3 - 1.1j),
    "sub_int_alpha": lambda a, b: torch.sub(a, b, alpha=3),
    "rsub": lambda a, b: torch.rsub(a, b, alpha=-2.3),
    "add_": lambda a, b: a.clone().add_(b, alpha=0.7),
    "sub_out": lambda a, b: torch.sub(a, b, alpha=1.3, out=torch.empty_like(a)),
    "half_other": lambda a, b: torch.add(a, b.real.to(torch.float16), alpha=1.7),
}


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("case", _C32_ALPHA)
def test_complex32_add_sub_alpha(mode, case):
    """complex32 ``add``/``sub`` with ``alpha``: ATen computes ``alpha * other`` in
    complex32 (rounded to float16 parts) before adding; bit for bit against CPU."""
    f = _C32_ALPHA[case]
    a, b = _c32(0), _c32(1)
    want = f(a, b)
    got = f(a.to("tpu"), b.to("tpu"))
    assert got.dtype == want.dtype == torch.complex32
    assert torch.equal(_c32_bits(got), _c32_bits(want))


_OVER_64 = {
    "zeros": lambda: torch.zeros([1] * 65, device="tpu"),
    "rand": lambda: torch.rand([1] * 65, device="tpu"),
    "transfer": lambda: torch.zeros([1] * 65).to("tpu"),
    "view": lambda: torch.zeros(1, device="tpu").view([1] * 65),
    "unsqueeze": lambda: torch.zeros([1] * 64, device="tpu").unsqueeze(0),
}


@pytest.mark.parametrize("case", _OVER_64)
def test_more_than_64_dims(mode, case):
    """A tensor of more than 64 dims: PyTorch's reductions over it raise RuntimeError "only
    tensors with up to 64 dims are supported"; a tpu tensor cannot hold one at all (XLA's and
    NumPy's arrays stop at 64: NumPy's ValueError came out of a later op or sync), so the op
    that would make it raises that RuntimeError, with lazyrt's reason after it."""
    with pytest.raises(RuntimeError) as cpu:
        torch.zeros([1] * 65).sum(0)
    with pytest.raises(RuntimeError) as tpu:
        _OVER_64[case]()
    assert str(tpu.value).split("\n")[0] == str(cpu.value)
    x = torch.arange(2.0).reshape([2] + [1] * 63)
    assert torch.equal(x.to("tpu").sum(0).cpu(), x.sum(0))  # 64 dims: fine
    assert torch.equal(x.to("tpu").amax().cpu(), x.amax())


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_sigmoid_extremal_values(mode, dtype):
    """ATen's complex sigmoid, ``1 / (1 + exp(-x))`` with c10's exp and division: NaN where
    ``exp(-x)`` overflows to (inf, inf) (XLA's logistic gave 0); large finite values too."""
    import itertools

    inf, nan = float("inf"), float("nan")
    re = [0.0, -0.0, 1.5, -30, 88.5, -88.5, 89.5, -89.5, 710, -710, -800, 1e30, -1e30,
          inf, -inf, nan]
    im = [0.0, -0.0, 1.0, -3.0, 1e30, inf, -inf, nan]
    x = torch.tensor([complex(a, b) for a, b in itertools.product(re, im)], dtype=dtype)
    x = torch.cat([x, torch.randn(500, dtype=dtype, generator=torch.Generator().manual_seed(0)) * 20])
    torch.testing.assert_close(torch.sigmoid(x.to("tpu")).cpu(), torch.sigmoid(x), equal_nan=True)


_CPARTS = (0.0, -0.0, 1.0, -1.0, 3.0, -4.0, float("inf"), -float("inf"), float("nan"), 1e15,
           -1e15, 0.5)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("how", ["div", "div_", "rtruediv_scalar", "div_scalar", "reciprocal"])
def test_complex_division_by_infinite_and_zero_divisors(mode, dtype, how):
    """c10's complex division (Smith's algorithm), as ATen's CPU kernels: ``1 / (inf + inf j)``
    is NaN there, where XLA's divide gave 0 (984 of 20,736 complex128 pairs of these parts
    differed in where they were NaN); every pair of parts as dividend and divisor. (Nothing
    here makes a subnormal on the way: XLA:CPU flushes them to zero, CPU keeps them.)"""
    import itertools

    z = torch.tensor([complex(a, b) for a, b in itertools.product(_CPARTS, _CPARTS)], dtype=dtype)
    x, y = z.repeat_interleave(len(z)), z.repeat(len(z))
    ops = {"div": lambda a, b: a / b, "div_": lambda a, b: a.clone().div_(b),
           "rtruediv_scalar": lambda a, b: 2.5 / b, "div_scalar": lambda a, b: a / complex(0.0, float("inf")),
           "reciprocal": lambda a, b: b.reciprocal()}
    f = ops[how]
    got, want = f(x.to("tpu"), y.to("tpu")).cpu(), f(x, y)
    assert got.dtype == want.dtype
    gr, wr = torch.view_as_real(got), torch.view_as_real(want)
    # where NaN is exactly as CPU; the rest to rounding (FMA contraction differs)
    assert torch.equal(gr.isnan(), wr.isnan())
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int32])
def test_int_pow_of_a_0_dim_tensor_exponent(mode, dtype):
    """``int_tensor ** tensor(e)``: computed in the dimensioned operand's dtype, as ATen's
    result type (``uint8 ** tensor(-1)`` wraps the exponent to 255); and the other way."""
    x = torch.tensor([0, 1, 2, 3, 7, 100], dtype=dtype)
    for e in (-1, -2, 3, 200):
        ex = torch.tensor(e)
        assert_same = torch.testing.assert_close
        assert_same(torch.pow(x.to("tpu"), ex.to("tpu")).cpu(), torch.pow(x, ex), rtol=0, atol=0)
        assert_same(torch.pow(ex.to("tpu"), x.to("tpu")).cpu(), torch.pow(ex, x), rtol=0, atol=0)


_INT_BINARY = {
    "lt": torch.lt, "ge": torch.ge, "eq": torch.eq, "floor_divide": torch.floor_divide,
    "remainder": torch.remainder, "fmod": torch.fmod,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_true": torch.div, "maximum": torch.maximum, "minimum": torch.minimum,
    "clamp": lambda a, b: torch.clamp(a, min=b), "rshift": torch.bitwise_right_shift,
    "lcm": torch.lcm, "logical_and": torch.logical_and, "add_alpha": lambda a, b: a.add(b, alpha=-1),
    "where": lambda a, b: torch.where(a > 2, a, b), "atan2": torch.atan2,
}


@pytest.mark.parametrize("name", sorted(_INT_BINARY))
def test_int_ops_with_a_0_dim_tensor_operand(mode, name):
    """An integer 0-dim tensor beside a dimensioned integer tensor is converted to the
    dimensioned one's dtype first, as PyTorch's type promotion: ``uint8 < tensor(-1)``
    compares with 255 (it compared in int64: False everywhere); true division and float
    math convert each operand to float instead."""
    f = _INT_BINARY[name]
    for dt in (torch.uint8, torch.int8, torch.int32):
        x = torch.tensor([1, 2, 3, 7, 100, 120], dtype=dt)
        for ev in (-1, -3, 300, 5, 256):
            e = torch.tensor(ev)
            for a, b in ((x, e), (e, x)):
                if name in ("clamp", "where") and a is e:
                    continue
                try:
                    want = f(a, b)
                except RuntimeError as ex:  # 256 as uint8 is 0: an integer division by 0
                    with pytest.raises(RuntimeError, match=str(ex)):
                        f(a.to("tpu"), b.to("tpu")).cpu()
                    continue
                got = f(a.to("tpu"), b.to("tpu")).cpu()
                assert got.dtype == want.dtype, (dt, ev)
                torch.testing.assert_close(got, want, rtol=1e-6, atol=0, msg=f"{dt} {ev}")


@pytest.mark.parametrize("name", ["floor_divide", "remainder", "fmod", "div_trunc", "ifloordiv"])
def test_integer_division_by_zero_raises(mode, name):
    """CPU raises ``ZeroDivisionError`` for an integer division by zero: at the op for a
    Python or CPU divisor, by the next sync for one on the device; floats divide."""
    f = {"floor_divide": torch.floor_divide, "remainder": torch.remainder, "fmod": torch.fmod,
         "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
         "ifloordiv": lambda a, b: a.clone().floor_divide_(b)}[name]
    x, z = torch.tensor([1, 2, 3]), torch.tensor([1, 0, 1])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(x, z)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(x.to("tpu"), z.to("tpu")).cpu()
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(x.to("tpu"), 0)
    assert torch.equal(f(x.to("tpu"), z.to("tpu") + 1).cpu(), f(x, z + 1))
    torch.testing.assert_close(f(x.double().to("tpu"), z.to("tpu")).cpu(), f(x.double(), z),
                               equal_nan=True)


_FILLS = {
    "fill_": lambda d, dt, v: torch.zeros(3, dtype=dt, device=d).fill_(v),
    "full": lambda d, dt, v: torch.full((3,), v, dtype=dt, device=d),
    "new_full": lambda d, dt, v: torch.zeros(3, dtype=dt, device=d).new_full((2,), v),
    "full_like": lambda d, dt, v: torch.full_like(torch.zeros(3, dtype=dt, device=d), v),
    "where": lambda d, dt, v: torch.where(torch.tensor([True, False, True], device=d),
                                          torch.zeros(3, dtype=dt, device=d), v),
    "masked_fill": lambda d, dt, v: torch.zeros(3, dtype=dt, device=d).masked_fill(
        torch.tensor([True, False, True], device=d), v),
    "index_fill_": lambda d, dt, v: torch.zeros(3, dtype=dt, device=d).index_fill_(
        0, torch.tensor([1], device=d), v),
    "clamp": lambda d, dt, v: torch.zeros(3, dtype=dt, device=d).clamp(max=v),
    "scatter": lambda d, dt, v: torch.zeros(3, dtype=dt, device=d).scatter(
        0, torch.tensor([1], device=d), v),
}


@pytest.mark.parametrize("name", sorted(_FILLS))
def test_a_python_number_that_overflows_the_dtype_raises(mode, name):
    """c10's ``checked_convert``: "value cannot be converted to type uint8_t without
    overflow" at the op, as CPU (it wrapped: 300 filled 44); values that fit (-1 in uint8
    wraps to 255, as on CPU) give CPU's result."""
    f = _FILLS[name]
    for dt, vals in ((torch.uint8, (300, -1, 255, -256, -257)), (torch.int8, (127, 128, -129)),
                     (torch.float16, (1e5, 65504.0, float("inf")))):
        for v in vals:
            try:
                want = f("cpu", dt, v)
            except RuntimeError as ex:
                with pytest.raises(RuntimeError, match="without overflow"):
                    f("tpu", dt, v)
                assert "without overflow" in str(ex)
                continue
            assert torch.equal(f("tpu", dt, v).cpu(), want), (dt, v)


def test_index_put_of_another_dtype_raises(mode):
    """ATen's ``index_put_`` (and ``x[i] = v``) does not cast: its error, not a cast value."""
    x, i = torch.zeros(3, dtype=torch.uint8), torch.tensor([1])
    for v in (torch.tensor([300]), torch.tensor([3.0])):
        with pytest.raises(RuntimeError) as cpu:
            x.clone().index_put_((i,), v)
        with pytest.raises(RuntimeError) as tpu:
            x.to("tpu").index_put_((i.to("tpu"),), v.to("tpu"))
        assert str(tpu.value) == str(cpu.value)
    y = x.to("tpu")
    y[i.to("tpu")] = torch.tensor([3], dtype=torch.uint8).to("tpu")
    assert y.cpu().tolist() == [0, 3, 0]


_VALUE_OPS = {
    "masked_fill": lambda x, v: x.masked_fill(torch.tensor([True, False, True, False], device=x.device), v),
    "masked_fill_": lambda x, v: x.masked_fill_(torch.tensor([True, False, True, False], device=x.device), v),
    "index_fill": lambda x, v: x.index_fill(0, torch.tensor([1, 3], device=x.device), v),
    "index_fill_": lambda x, v: x.index_fill_(0, torch.tensor([2], device=x.device), v),
    "fill_": lambda x, v: x.fill_(v),
}
_VALUES = ((torch.int64, (300, -3, -255, -256, 127, 128, 70000, -129)),
           (torch.float32, (300.0, -1.0, 255.5, float("nan"), float("inf"), 1e5, -70000.0)),
           (torch.float64, (1e39, 3e38, float("inf"), 65504.0, 65520.0)),
           (torch.uint8, (255, 7)), (torch.bool, (True,)))


@pytest.mark.parametrize("name", sorted(_VALUE_OPS))
@pytest.mark.parametrize("where", ["tpu", "cpu"])
def test_a_0_dim_tensor_value_that_overflows_the_dtype_raises(mode, name, where):
    """A 0-dim tensor value is read as ATen reads it (``value.item()``) and converted with
    c10's ``checked_convert``: ``masked_fill``/``index_fill`` raise "value cannot be
    converted to type uint8_t without overflow" as CPU does (tpu wrapped or saturated:
    300 filled 44, 300.0 filled 255), at the op for a CPU value and by the next sync for a
    tpu one. ``fill_`` with a value on the tensor's own device converts as ``copy_``
    (300.0 fills 44 on CPU, tpu gave 255); with one from another device it reads the
    number, as ATen's ``fill_`` (``fill_out(self, value.item())``)."""
    f = _VALUE_OPS[name]
    for dt in (torch.uint8, torch.int8, torch.int16, torch.uint32, torch.float16, torch.bfloat16,
               torch.float32):
        for vdt, vals in _VALUES:
            for v in vals:
                value = torch.tensor(v, dtype=vdt)
                x = torch.arange(4).to(dt)
                if name == "fill_" and where == "tpu" and dt == torch.uint32 and vdt.is_floating_point:
                    continue  # copy_'s float -> uint32: CPU's 4-element scalar tail (docs/conformance.md)
                try:
                    if name == "fill_" and where == "cpu":  # ATen: another device reads the number
                        want = x.clone().fill_(value.item())
                    else:
                        want = f(x.clone(), value)
                except NotImplementedError:  # (CPU's kernel lacks the dtype: index_fill uint32)
                    continue
                except RuntimeError as ex:
                    with pytest.raises(RuntimeError) as got:
                        f(x.to("tpu"), value.to(where)).cpu()
                    # (a tpu value's assert names the op and line after CPU's message)
                    msg = str(got.value)
                    assert (msg.startswith(str(ex)) if where == "tpu" else msg == str(ex)), (dt, vdt, v)
                    continue
                got = f(x.to("tpu"), value.to(where)).cpu()
                assert got.dtype == want.dtype and torch.equal(got, want) or (
                    dt.is_floating_point and torch.equal(got.isnan(), want.isnan())), (dt, vdt, v, got, want)


def test_integer_division_by_zero_in_a_compiled_graph_raises(mode):
    """A ``torch.compile`` graph's integer divisions check their tpu divisor in the graph's
    program (``_compile.checks.insert_division_checks``): ``RuntimeError: ZeroDivisionError``
    by the next sync, as CPU raises at the op; the graph still runs as one program (no
    eager fallback). A 0-dim int64 divisor of 256 is 0 in a uint8 division, as on CPU."""
    import lazyrt

    def f(x, y):
        return (x // y) + (x % y) + torch.fmod(x, y) + torch.div(x, y, rounding_mode="trunc")

    cf = torch.compile(f, backend="tpu", dynamic=False)
    x = torch.tensor([5, 7, 200], dtype=torch.uint8)
    for y in (torch.tensor([2, 3, 4], dtype=torch.uint8), torch.tensor(7)):
        assert torch.equal(cf(x.to("tpu"), y.to("tpu")).cpu(), f(x, y))
    before = lazyrt.metrics.counters().get("compiled_eager_calls", 0)
    for y in (torch.tensor([2, 0, 4], dtype=torch.uint8), torch.tensor(256)):
        with pytest.raises(RuntimeError) as cpu:
            f(x, y)
        out = cf(x.to("tpu"), y.to("tpu"))
        with pytest.raises(RuntimeError) as got:
            out.cpu()
        assert str(got.value).splitlines()[0] == str(cpu.value) == "ZeroDivisionError"
    assert lazyrt.metrics.counters().get("compiled_eager_calls", 0) == before


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int16])
@pytest.mark.parametrize("name", ["cosh", "sinh"])
def test_cosh_sinh_accuracy(mode, name, dtype):
    """``cosh``/``sinh`` within PyTorch's float tolerance of CPU's (XLA's lowering computes
    ``exp(|x| - log 2)``: 12.6 ulp on average over float32's range, 24 at most, past
    ``assert_close``'s 1.3e-6); inf, NaN and signed zeros as CPU's. (Up to |x| = 88 in
    float32: past it CPU's vectorized cosh overflows to inf before the true result does,
    where tpu gives the finite value, as NumPy does.)"""
    top = {torch.float64: 709.0, torch.int16: 88}.get(dtype, 88.0)
    x = torch.cat([torch.linspace(-top, top, 20001, dtype=torch.float64),
                   torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-30, 0.3])]).to(dtype)
    f = getattr(torch, name)
    got, want = f(x.to("tpu")).cpu(), f(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, equal_nan=True)
    num = ~want.isnan()
    assert torch.equal(got[num].signbit(), want[num].signbit())

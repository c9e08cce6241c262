"""``random_`` and ``uniform_`` on tpu against PyTorch CPU eager: ATen's errors, messages
and UserWarnings (DistributionTemplates.h), and the ranges of the values its CPU kernels
draw (the values themselves differ: another generator)."""
from __future__ import annotations

import re
import warnings

import pytest
import torch

I64_MIN, I64_MAX = torch.iinfo(torch.int64).min, torch.iinfo(torch.int64).max
_TRIGGERED = re.compile(r" \(Triggered internally at [^)]*\)$")

# (dtype, method, args): errors, warnings, or neither, each as CPU eager gives them
CALLS = [
    (torch.float32, "random_", (3, 3)),
    (torch.float32, "random_", (0, 2 ** 40)),           # warns: to - 1 beyond 2**24
    (torch.float32, "random_", (2 ** 25, 2 ** 25 + 1)),  # warns twice
    (torch.float32, "random_", (2 ** 40, None)),        # 'from' casted > to_inc
    (torch.float64, "random_", (2 ** 62 - 1, None)),
    (torch.float16, "random_", (0, 100000)),            # to - 1 out of bounds for c10::Half
    (torch.float16, "random_", (2 ** 40, None)),
    (torch.float16, "random_", (I64_MIN, None)),        # no full-range kernel for Half
    (torch.bfloat16, "random_", (0, 2 ** 40)),
    (torch.bfloat16, "random_", (300, None)),
    (torch.int8, "random_", (-129, 5)),
    (torch.int8, "random_", (0, 2 ** 40)),
    (torch.int8, "random_", (I64_MIN, None)),           # full range: int64/float/double/bf16
    (torch.int16, "random_", (0, -42)),
    (torch.int64, "random_", (42, 42)),
    (torch.uint8, "random_", (-1, 2)),
    (torch.bool, "random_", (-1, 2)),
    (torch.bool, "random_", (0, 3)),
    (torch.bool, "random_", (I64_MIN, None)),
    (torch.complex64, "random_", ()),
    (torch.complex64, "random_", (-1, 2)),
    (torch.complex64, "random_", (5, None)),
    (torch.uint16, "random_", ()),
    (torch.float32, "uniform_", (5.0, 1.0)),
    (torch.float32, "uniform_", (-3.4e38, 3.4e38)),
    (torch.float32, "uniform_", (1e39, 2e39)),
    (torch.float16, "uniform_", (-60000.0, 60000.0)),
    (torch.float16, "uniform_", (1.5, float("nan"))),
    (torch.float16, "uniform_", (0.0, 70000.0)),
    (torch.float64, "uniform_", (-1.7e308, 1.7e308)),
    (torch.complex64, "uniform_", (1e39, 2e39)),
    (torch.int32, "uniform_", (0.0, 1.0)),
]


def _outcome(t, method, args):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            getattr(t, method)(*args)
            err = None
        except Exception as ex:  # compared with CPU eager's
            err = (type(ex), str(ex))
    warns = [(x.category, _TRIGGERED.sub("", str(x.message)), x.filename) for x in w
             if x.category is UserWarning]
    return err, warns


@pytest.mark.parametrize("dtype,method,args", CALLS,
                         ids=lambda v: str(v).replace("torch.", "").replace(" ", ""))
def test_errors_and_warnings_as_cpu(mode, dtype, method, args):
    cpu = _outcome(torch.empty(5, dtype=dtype), method, args)
    tpu = _outcome(torch.empty(5, dtype=dtype, device="tpu"), method, args)
    assert tpu == cpu
    assert cpu[0] is not None or cpu[1]  # each case errs or warns


def test_empty_checks_as_cpu(mode):
    """Checks run on an empty tensor too, but a complex one's uniform_ and any dtype's
    full-range random_ return first (``CHECK_EMPTY_AND_RETURN``)."""
    for dtype, method, args in [(torch.float32, "uniform_", (5.0, 1.0)),
                                (torch.float32, "random_", (5, 1)),
                                (torch.complex64, "uniform_", (5.0, 1.0)),
                                (torch.int8, "random_", (I64_MIN, None)),
                                (torch.complex64, "random_", ())]:
        cpu = _outcome(torch.empty(0, dtype=dtype), method, args)
        tpu = _outcome(torch.empty(0, dtype=dtype, device="tpu"), method, args)
        assert tpu == cpu, (dtype, method, args)


def test_functional_ops_check_as_cpu(mode):
    for op, args in [(torch.ops.aten.random.to, (0,)),
                     (getattr(torch.ops.aten.random, "from"), (5, 3)),
                     (torch.ops.aten.uniform.default, (5.0, 3.0))]:
        with pytest.raises(RuntimeError) as cpu:
            op(torch.empty(3), *args)
        with pytest.raises(RuntimeError, match=re.escape(str(cpu.value))):
            op(torch.empty(3, device="tpu"), *args)


N = 2000
_FP_TOP = {torch.float32: 2 ** 24, torch.float64: 2 ** 53, torch.float16: 2 ** 11,
           torch.bfloat16: 2 ** 8}


def _top(dtype):
    if dtype in _FP_TOP:
        return _FP_TOP[dtype]
    return 1 if dtype == torch.bool else torch.iinfo(dtype).max


def _range_of(t):
    assert t.device.type == "tpu"
    d = t.cpu().to(torch.float64)
    return d.min().item(), d.max().item()


def _assert_spread(t, lo, hi_inc):
    """All values in [lo, hi_inc], the least within 10% of ``lo`` and the most within 10%
    of ``hi_inc`` (PyTorch's tests' bound; for 2000 draws, failing it is ~1e-90 likely)."""
    mn, mx = _range_of(t)
    delta = max(1.0, 0.1 * (float(hi_inc) - float(lo)))
    assert lo <= mn < lo + delta, (mn, lo, hi_inc)
    assert hi_inc - delta < mx <= hi_inc, (mx, lo, hi_inc)


RANDOM_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                 torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]


@pytest.mark.sweep(every=2)  # the default run: each case once, modes alternating
@pytest.mark.parametrize("dtype", RANDOM_DTYPES, ids=lambda d: str(d)[6:])
def test_random_default_range(mode, dtype):
    """``random_()``: [0, 2**digits] for floating dtypes, [0, max] for integers."""
    t = torch.empty(N, dtype=dtype, device="tpu").random_()
    assert t.dtype == dtype
    _assert_spread(t, 0, _top(dtype))


@pytest.mark.sweep(every=2)  # the default run: each case once, modes alternating
@pytest.mark.parametrize("dtype", RANDOM_DTYPES, ids=lambda d: str(d)[6:])
def test_random_from_none_range(mode, dtype):
    """``random_(from, None)``: [from, the dtype's top]; from int64's minimum: all int64
    values cast to the dtype."""
    lo = 0 if dtype in (torch.bool, torch.uint8) else -_top(dtype)
    if dtype in (torch.int64, torch.float32, torch.float64, torch.bfloat16):
        lo = I64_MIN
    t = torch.empty(N, dtype=dtype, device="tpu").random_(lo, None)
    top = I64_MAX if lo == I64_MIN else _top(dtype)
    _assert_spread(t, lo, float(top) if lo == I64_MIN else top)  # 2**63: int64's top as a float


@pytest.mark.sweep(every=2)
@pytest.mark.parametrize("dtype,lo,hi", [
    (torch.float32, -42, 42), (torch.float64, -(2 ** 40), 2 ** 40), (torch.float16, -2048, 2048),
    (torch.bfloat16, 0, 256), (torch.int64, I64_MIN, I64_MAX), (torch.int64, 1, 4),
    (torch.int8, -128, 128), (torch.uint8, 0, 256), (torch.bool, 0, 2), (torch.int32, -10, -1),
], ids=lambda v: str(v).replace("torch.", ""))
def test_random_from_to_range(mode, dtype, lo, hi):
    t = torch.empty(N, dtype=dtype, device="tpu").random_(lo, hi)
    assert t.dtype == dtype
    _assert_spread(t, lo, hi - 1)
    if lo == 0:
        _assert_spread(torch.empty(N, dtype=dtype, device="tpu").random_(hi), 0, hi - 1)


def test_random_half_to_moves_left(mode):
    """``random_(0, 65504)`` on float16: ATen moves ``to`` to 65472 so no value rounds up
    to 65504 (``update_to``; unmoved, 20000 draws reach it with odds 99%)."""
    t = torch.empty(20000, dtype=torch.float16, device="tpu")
    with pytest.warns(UserWarning, match=r"to - 1 is out of bounds \[-\(2\^11\), 2\^11\]"):
        t.random_(0, 65504)
    mn, mx = _range_of(t)
    assert 0 <= mn and mx <= 65472


@pytest.mark.sweep(every=2)  # the default run: each case once, modes alternating
@pytest.mark.parametrize("dtype,lo,hi", [
    (torch.float32, -42.0, 42.0), (torch.float64, 0.0, 1e300), (torch.float16, -42.0, 42.0),
    (torch.bfloat16, 0.0, 1.0), (torch.float32, 3.0, 3.0), (torch.complex64, -1.0, 1.0),
], ids=lambda v: str(v).replace("torch.", ""))
def test_uniform_range(mode, dtype, lo, hi):
    t = torch.empty(N, dtype=dtype, device="tpu").uniform_(lo, hi)
    assert t.dtype == dtype
    parts = torch.view_as_real(t.cpu()) if dtype.is_complex else t.cpu()
    d = parts.to(torch.float64)
    if lo == hi:
        assert (d == lo).all()
        return
    delta = 0.1 * (hi - lo)
    assert lo <= d.min().item() <= lo + delta
    top = d.max().item()
    # float16/bfloat16 round x * (to - from) + from to their dtype, so `to` itself may come
    assert hi - delta <= top and (top <= hi if dtype in (torch.float16, torch.bfloat16) else top < hi)

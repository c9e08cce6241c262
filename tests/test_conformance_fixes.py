"""Groups of failures of PyTorch's own device-generic tests on tpu (``perf.pytorch_suite``,
docs/conformance.md), each checked here against PyTorch CPU eager in strict and defer."""
from __future__ import annotations

import pytest
import torch
from _util import assert_close, to_tpu

# ---- Tensor.view(dtype): bool and complex, 0-d, across itemsizes ---------------------------

VIEW_CASES = [
    (torch.int8, torch.bool, (4, 6)),
    (torch.bool, torch.int8, (4, 6)),
    (torch.bool, torch.int16, (3, 4)),
    (torch.float32, torch.complex64, (3, 4)),
    (torch.complex64, torch.float32, (3, 4)),
    (torch.complex64, torch.int16, (2, 3)),
    (torch.int16, torch.complex64, (2, 8)),
    (torch.complex128, torch.complex64, (2, 3)),
    (torch.float64, torch.complex128, (3, 2)),
    (torch.complex64, torch.int64, ()),
    (torch.bool, torch.uint8, ()),
]


def _sample(shape, dtype):
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_complex or dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype)
    return torch.randint(0, 2 if dtype == torch.int8 else 100, shape, dtype=dtype)


@pytest.mark.parametrize("src,dst,shape", VIEW_CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_view_dtype_bool_complex(mode, src, dst, shape):
    c = _sample(shape, src)
    t = to_tpu(c)
    v = t.view(dst)
    assert v.data_ptr() == t.data_ptr()
    assert_close(v, c.view(dst), rtol=0, atol=0)
    assert_close(v.view(src), c, rtol=0, atol=0)


def test_view_dtype_complex_writes_through(mode):
    c = torch.randn(3, 4)
    t = to_tpu(c)
    t.view(torch.complex64).mul_(2j)
    c.view(torch.complex64).mul_(2j)
    assert_close(t, c)


# ---- split_copy ----------------------------------------------------------------------------


def test_split_copy(mode):
    c = torch.randn(5, 3)
    t = to_tpu(c)
    assert_close(list(torch.split_copy(t, 2)), list(torch.split_copy(c, 2)))
    assert_close(list(torch.split_copy(t, 2, dim=1)), list(torch.split_copy(c, 2, dim=1)))
    outs = [torch.empty(2, 3, device="tpu"), torch.empty(2, 3, device="tpu"), torch.empty(1, 3, device="tpu")]
    torch.split_copy(t, 2, out=outs)
    assert_close(outs, list(torch.split_copy(c, 2)))
    assert torch.split_copy(t, 2)[0]._base is None


# ---- nonzero(out=) -------------------------------------------------------------------------


def test_nonzero_out_checks(mode):
    c = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    t = to_tpu(c)
    with pytest.raises(RuntimeError, match="scalar type Long but got scalar typeFloat"):
        torch.nonzero(t, out=torch.empty([], device="tpu"))
    with pytest.raises(RuntimeError, match="on the same device"):
        torch.nonzero(t, out=torch.empty([], dtype=torch.long))
    out = torch.empty([], dtype=torch.long, device="tpu")
    torch.nonzero(t, out=out)
    assert_close(out, torch.nonzero(c))


# ---- clamp with neither bound --------------------------------------------------------------


def test_clamp_without_bounds_raises_runtime_error(mode):
    t = to_tpu(torch.randn(5))
    msg = "At least one of 'min' or 'max' must not be None"
    with pytest.raises(RuntimeError, match=msg):
        torch.clamp(torch.randn(5))  # the CPU oracle
    with pytest.raises(RuntimeError, match=msg):
        t.clamp()
    with pytest.raises(RuntimeError, match=msg):
        t.clamp_()
    with pytest.raises(RuntimeError, match=msg):
        torch.clamp(t, out=torch.empty(5, device="tpu"))
    assert_close(t.clamp(min=0.0), t.cpu().clamp(min=0.0))


# ---- sparse and quantized: strided answers, and PyTorch's no-kernel error at the op ----------


def test_sparse_dense_dim_of_strided(mode):
    for shape in [(), (2,), (2, 3)]:
        c = torch.randn(shape)
        t = to_tpu(c)
        assert t.sparse_dim() == c.sparse_dim() == 0
        assert t.dense_dim() == c.dense_dim() == len(shape)


@pytest.mark.parametrize("fn", [
    lambda t: torch.quantize_per_tensor(t, 0.1, 5, torch.quint8),
    lambda t: torch.quantize_per_channel(t, torch.ones(2), torch.zeros(2, dtype=torch.long), 0, torch.qint8),
    lambda t: t.to_sparse(),
], ids=["quantize_per_tensor", "quantize_per_channel", "to_sparse"])
def test_sparse_quantized_raise_no_kernel_error(mode, fn):
    t = to_tpu(torch.randn(2, 3))
    with pytest.raises(NotImplementedError, match="Could not run 'aten::.*' with arguments from the 'tpu' backend"):
        fn(t)


def test_bool_times_inf_and_over_zero_are_nan_as_ieee(mode):
    """XLA's simplifier turns ``convert(pred) * y`` into ``select(pred, y, 0)``: ``False *
    inf`` and ``False / 0`` were 0 on tpu, NaN on the CPU (a silent wrong value)."""
    x = torch.tensor([True, False, True])
    inf = torch.full((3,), float("inf"))
    nan = torch.full((3,), float("nan"))
    cases = [lambda b, i, n: b / 0, lambda b, i, n: b.float() / 0, lambda b, i, n: b.float() * i,
             lambda b, i, n: b * i, lambda b, i, n: i * b, lambda b, i, n: b.double() * n.double(),
             lambda b, i, n: b * float("inf"), lambda b, i, n: torch.div(b, n * 0 + 0)]
    for f in cases:
        assert_close(f(x.to("tpu"), inf.to("tpu"), nan.to("tpu")), f(x, inf, nan))


def test_prims_real_imag_conj_broadcast_in_dim(mode):
    """PyTorch's refs call ``prims.real``/``imag``/``conj``/``broadcast_in_dim`` (lazyrt's
    "no lowering" error before, in test_unary_ufuncs' ``_refs`` cases); real/imag/conj are
    views: a write through one reaches the base."""
    import torch._refs as refs

    p = torch.ops.prims
    x = torch.randn(3, 4, dtype=torch.complex64)
    t = x.to("tpu")
    for f in (p.real, p.imag, refs.conj, lambda a: p.broadcast_in_dim(a.real, [2, 3, 4], [1, 2]),
              lambda a: refs.nn.functional.prelu(a.real, torch.tensor([0.25], device=a.device))):
        assert_close(f(t), f(x).resolve_conj())
    assert_close(p.conj(t), x.conj().resolve_conj())
    p.real(t).mul_(2)
    p.imag(t).add_(1)
    assert_close(t, torch.complex(x.real * 2, x.imag + 1))


FP8 = [torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("dt", FP8, ids=str)
def test_float8_conversions_bit_for_bit(mode, dt):
    """float8 dtypes (fnuz too: refused before) from every float dtype, overflow and
    infinities included (``float8_e4m3fn`` saturates at 448 in PyTorch; XLA's convert gave
    NaN), and through ``index_select``."""
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(200, generator=g) * 50, torch.tensor(
        [0., -0., float("inf"), float("-inf"), 1e-9, 500., 1e5, -1e5, 240., 57344., 448., 465.])])
    for src in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        xs = x.to(src)
        assert torch.equal(xs.to("tpu").to(dt).cpu().view(torch.uint8), xs.to(dt).view(torch.uint8)), src
    f8 = x.to(dt)
    i = torch.tensor([3, 0, 7])
    got = torch.index_select(f8.to("tpu"), 0, i.to("tpu")).cpu()
    assert got.dtype == dt and torch.equal(got.view(torch.uint8), torch.index_select(f8, 0, i).view(torch.uint8))


# ---- in-place pointwise ops: the promoted result must cast to self (TensorIterator) --------

_INPLACE = {
    "xlogy_int8": lambda d: torch.ones(3, dtype=torch.int8, device=d).xlogy_(torch.ones(3, device=d)),
    "mul_int8_by_float": lambda d: torch.ones(3, dtype=torch.int8, device=d).mul_(torch.ones(3, device=d)),
    "add_float_scalar": lambda d: torch.ones(3, dtype=torch.int8, device=d).add_(1.5),
    "mul_float_by_complex": lambda d: torch.ones(3, device=d).mul_(torch.ones(3, dtype=torch.complex64, device=d)),
    "add_bool_by_long": lambda d: torch.ones(3, dtype=torch.bool, device=d).add_(
        torch.ones(3, dtype=torch.long, device=d)),
    "div_int": lambda d: torch.ones(3, dtype=torch.int32, device=d).div_(2),
    "sqrt_int": lambda d: torch.ones(3, dtype=torch.int32, device=d).sqrt_(),
    "heaviside_mixed": lambda d: torch.heaviside(torch.ones(3, device=d), torch.ones(3, dtype=torch.int32, device=d)),
}


@pytest.mark.parametrize("name", list(_INPLACE))
def test_inplace_result_cast_errors(mode, name):
    with pytest.raises(RuntimeError) as cpu:
        _INPLACE[name]("cpu")
    with pytest.raises(RuntimeError) as tpu:
        _INPLACE[name]("tpu")
    assert str(tpu.value) == str(cpu.value)


@pytest.mark.parametrize("name", ["fill", "masked_fill", "add_double", "floor_divide", "eq", "half_by_double"])
def test_inplace_that_casts_still_runs(mode, name):
    f = {"fill": lambda d: torch.ones(3, dtype=torch.int64, device=d).fill_(2.5),
         "masked_fill": lambda d: torch.ones(3, dtype=torch.int64, device=d).masked_fill_(
             torch.ones(3, dtype=torch.bool, device=d), 2.5),
         "add_double": lambda d: torch.ones(3, device=d).add_(torch.ones(3, dtype=torch.float64, device=d)),
         "floor_divide": lambda d: torch.full((3,), 7, dtype=torch.int32, device=d).floor_divide_(2),
         "eq": lambda d: torch.ones(3, dtype=torch.int32, device=d).eq_(2),
         "half_by_double": lambda d: torch.ones(3, dtype=torch.float16, device=d).mul_(
             torch.tensor(2.0, dtype=torch.float64, device=d))}[name]
    assert_close(f("tpu"), f("cpu"), rtol=0, atol=0)

"""Failure groups of PyTorch's ``test/test_unary_ufuncs.py`` on tpu (``perf.pytorch_suite``,
docs/conformance.md), each checked here against PyTorch CPU eager in strict and defer."""
from __future__ import annotations

import math

import pytest
import torch
from _util import assert_close, to_tpu

INF, NAN = math.inf, math.nan


def _both(fn, *args, **kwargs):
    """(CPU result, tpu result) of ``fn``, or the two exceptions (type, message)."""
    out = []
    for dev in ("cpu", "tpu"):
        a = [to_tpu(x) if dev == "tpu" and isinstance(x, torch.Tensor) else x for x in args]
        kw = {k: to_tpu(v) if dev == "tpu" and isinstance(v, torch.Tensor) else v
              for k, v in kwargs.items()}
        try:
            r = fn(*a, **kw)
            if dev == "tpu":
                r = tuple(x.cpu() for x in r) if isinstance(r, tuple) else r.cpu()
            out.append(r)
        except RuntimeError as ex:
            out.append((type(ex), str(ex)))
    return out


# ---- out= dtypes: CPU's rule (the result castable to out), not the meta kernel's exact one --


@pytest.mark.parametrize("fn", [torch.abs, torch.angle], ids=["abs", "angle"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.complex64])
def test_complex_to_float_out_dtype(mode, fn, out_dtype):
    x = torch.tensor([3 + 4j, -1 - 1j, 0.5j], dtype=torch.complex64)
    cpu_out = torch.empty(0, dtype=out_dtype)
    fn(x, out=cpu_out)
    out = torch.empty(0, dtype=out_dtype, device="tpu")
    r = fn(to_tpu(x), out=out)
    assert r is out and out.dtype == out_dtype and out.shape == cpu_out.shape
    assert_close(out, cpu_out, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fn,x,out_dtype", [
    (torch.abs, torch.tensor([3 + 4j]), torch.long),
    (torch.sin, torch.arange(3), torch.long),
    (torch.isposinf, torch.tensor([1.0, INF]), torch.float32),
    (torch.isneginf, torch.tensor([1.0, -INF]), torch.int64),
], ids=["abs_long", "sin_int_long", "isposinf_float", "isneginf_long"])
def test_out_dtype_refused_as_cpu(mode, fn, x, out_dtype):
    cpu, tpu = _both(lambda t, o: fn(t, out=o), x, torch.empty(0, dtype=out_dtype))
    assert isinstance(cpu, tuple) and tpu == cpu


def test_abs_inplace_complex_refused(mode):
    cpu, tpu = _both(torch.Tensor.abs_, torch.tensor([3 + 4j]))
    assert isinstance(cpu, tuple) and tpu == cpu
    x = torch.tensor([-1.5, 2.0, -0.0])
    r = to_tpu(x).abs_()
    assert_close(r, x.abs(), rtol=0, atol=0)


# ---- igamma / igammac edge values (ATen's calc_igamma) ---------------------------------------


@pytest.mark.parametrize("fn", [torch.igamma, torch.igammac], ids=["igamma", "igammac"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_igamma_edges(mode, fn, dtype):
    a = torch.tensor([0.0, 0.0, 1e-3, 1.0, INF, INF, 0.0, 1e3, INF, -1.0, 2.0, 0.0, NAN],
                     dtype=dtype)
    x = torch.tensor([1e-3, 1.0, 0.0, 0.0, 0.0, 1e3, INF, INF, INF, 1.0, -1.0, 0.0, 1.0],
                     dtype=dtype)
    cpu, tpu = _both(fn, a, x)
    assert_close(tpu, cpu, rtol=1e-6, atol=1e-7)
    # broadcasting against a scalar-shaped argument
    cpu, tpu = _both(fn, a, torch.tensor(0.0, dtype=dtype))
    assert_close(tpu, cpu, rtol=1e-6, atol=1e-7)


# ---- exp of complex special values (C99 cexp, PyTorch off CPU and NumPy) ----------------------


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_exp_special_values(mode, dtype):
    vals = [complex(INF, 0), complex(INF, -0.0), complex(0, INF), complex(INF, INF),
            complex(INF, NAN), complex(NAN, INF), complex(-INF, INF), complex(-INF, NAN),
            complex(NAN, 0), 1 + 2j, -3 - 0.5j]
    x = torch.tensor(vals, dtype=dtype)
    cpu, tpu = _both(torch.exp, x)
    assert_close(tpu.real, cpu.real, rtol=1e-5, atol=0)
    assert_close(tpu.imag, cpu.imag, rtol=1e-5, atol=0)
    # a zero imaginary part stays exactly zero, with its sign
    assert torch.equal(torch.signbit(tpu.imag[:2]), torch.tensor([False, True]))


# ---- frexp(out=): PyTorch's dtype checks of mantissa and exponent -----------------------------


@pytest.mark.parametrize("mant,expo", [(torch.float64, torch.int32), (torch.float32, torch.int64),
                                       (torch.float32, torch.int32)])
def test_frexp_out_checks(mode, mant, expo):
    x = torch.tensor([3.0, 0.5, -8.0, 0.0])

    def f(t, m, e):
        return torch.frexp(t, out=(m, e))

    cpu, tpu = _both(f, x, torch.empty(0, dtype=mant), torch.empty(0, dtype=expo))
    if isinstance(cpu[0], type):
        assert tpu == cpu
    else:
        assert_close(tpu[0], cpu[0], rtol=0, atol=0)
        assert torch.equal(tpu[1], cpu[1])

"""Groups of failures of PyTorch's test_tensor_creation_ops.py on tpu (docs/conformance.md),
each checked here against PyTorch CPU eager in strict and defer: float -> int conversions
out of range, torch.complex/polar dtype checks, zeros/ones/rand with out=, rand/randn draws
in their dtype, DLPack capsules of tpu tensors."""
from __future__ import annotations

import pytest
import torch
from _util import assert_close, to_tpu
from torch.utils.dlpack import to_dlpack

_F32 = torch.finfo(torch.float32)
_VALS = (_F32.min, -3e9, -40000.0, -300.0, -2.0, -1.5, -0.5, 0.0, 0.5, 1.5, 2.0, 200.0, 300.0,
         40000.0, 70000.0, 3e9, 1e19, _F32.max)


@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dst", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                                 torch.uint16, torch.bool])
def test_float_to_int_out_of_range(mode, src, dst):
    """As PyTorch's CPU converts (x86: through int32/int64, whose minimum stands for a value
    that does not fit, then wrapped); XLA saturated."""
    x = torch.tensor(_VALS, dtype=torch.float64).to(src)
    t = to_tpu(x)
    assert_close(t.to(dst), x.to(dst), rtol=0, atol=0)
    assert_close(torch.zeros(len(_VALS), dtype=dst, device="tpu").copy_(t),
                 torch.zeros(len(_VALS), dtype=dst).copy_(x), rtol=0, atol=0)


def _raises_same(f):
    with pytest.raises(RuntimeError) as cpu:
        f("cpu")
    with pytest.raises(RuntimeError) as tpu:
        f("tpu")
    assert str(tpu.value) == str(cpu.value)


@pytest.mark.parametrize("case", ["bool", "int", "mixed", "out", "polar_out", "polar_int"])
def test_complex_dtype_errors(mode, case):
    a = {"bool": torch.bool, "int": torch.int32}.get(case, torch.float32)
    fs = {
        "bool": lambda d: torch.complex(torch.ones(2, dtype=a, device=d), torch.ones(2, dtype=a, device=d)),
        "int": lambda d: torch.complex(torch.ones(2, dtype=a, device=d), torch.ones(2, dtype=a, device=d)),
        "mixed": lambda d: torch.complex(torch.ones(2, device=d), torch.ones(2, dtype=torch.float64, device=d)),
        "out": lambda d: torch.complex(torch.ones(2, device=d), torch.ones(2, device=d), out=torch.empty(2, device=d)),
        "polar_out": lambda d: torch.polar(torch.ones(2, device=d), torch.ones(2, device=d),
                                           out=torch.empty(2, dtype=torch.complex128, device=d)),
        "polar_int": lambda d: torch.polar(torch.ones(2, dtype=torch.int64, device=d),
                                           torch.ones(2, dtype=torch.int64, device=d)),
    }
    _raises_same(fs[case])


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_complex_and_polar_values(mode, dtype):
    r, i = torch.randn(5, dtype=torch.float32).to(dtype), torch.randn(5, dtype=torch.float32).to(dtype)
    assert_close(torch.complex(to_tpu(r), to_tpu(i)), torch.complex(r, i), rtol=0, atol=0)
    if dtype != torch.float16:  # CPU: "polar_cpu" not implemented for 'Half'
        assert_close(torch.polar(to_tpu(r.abs()), to_tpu(i)), torch.polar(r.abs(), i), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["zeros", "ones"])
def test_zeros_ones_out(mode, name):
    f = getattr(torch, name)
    for make in (lambda d: torch.empty(5, dtype=torch.int32, device=d), lambda d: torch.empty(0, device=d),
                 lambda d: torch.empty(2, 3, device=d).t()):
        o_c, o_t = make("cpu"), make("tpu")
        r = f((3, 2), out=o_t)
        assert r is o_t
        assert o_t.stride() == f((3, 2), out=o_c).stride()
        assert_close(o_t, o_c, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.complex64, torch.complex128, torch.complex32])
@pytest.mark.parametrize("name", ["rand", "randn"])
def test_rand_out_draws_as_rand(mode, name, dtype):
    """PyTorch's test_rand/test_randn: ``rand(size, out=t)`` gives ``rand(size,
    dtype=t.dtype)``'s values for the same seed (also after ``t`` is resized)."""
    f = getattr(torch, name)
    torch.manual_seed(123456)
    a = f(20, 20, dtype=dtype, device="tpu")
    torch.manual_seed(123456)
    b = torch.tensor([], dtype=dtype, device="tpu")
    f(20, 20, out=b)
    assert b.dtype == dtype and b.shape == (20, 20)
    ar, br = a.cpu(), b.cpu()
    if dtype.is_complex:
        ar, br = torch.view_as_real(ar.to(torch.complex128)), torch.view_as_real(br.to(torch.complex128))
    assert torch.equal(ar, br)


def test_rand_randn_draw_in_their_dtype(mode):
    """float64 draws carry float64's bits; complex draws have both parts (variance 1/2 each
    for randn, each part uniform in [0, 1) for rand), as PyTorch's; they were float32 draws
    cast (a zero imaginary part)."""
    x = torch.randn(20000, dtype=torch.float64, device="tpu").cpu()
    assert bool((x.float().double() != x).any())
    assert abs(float(x.std()) - 1) < 0.05
    z = torch.randn(20000, dtype=torch.complex64, device="tpu").cpu()
    assert abs(float(z.real.var()) - 0.5) < 0.05 and abs(float(z.imag.var()) - 0.5) < 0.05
    u = torch.rand(20000, dtype=torch.complex128, device="tpu").cpu()
    assert 0 <= float(u.imag.min()) and float(u.imag.max()) < 1 and abs(float(u.imag.mean()) - 0.5) < 0.05
    n = torch.normal(torch.zeros(20000, dtype=torch.float64, device="tpu"), 1.0).cpu()
    assert n.dtype == torch.float64 and bool((n.float().double() != n).any())


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.complex64, torch.bool])
def test_dlpack_capsule_of_a_tpu_tensor(mode, dtype):
    """``torch.asarray``/``torch.from_dlpack`` of a tpu tensor's capsule alias it (same
    ``data_ptr``, writes seen), ``copy=True`` copies; PyTorch's fromDLPack made a plain
    tensor at the tpu address that no op could read."""
    c = torch.arange(6).to(dtype).reshape(2, 3)
    t = to_tpu(c)
    a = torch.asarray(to_dlpack(t))
    assert a.device.type == "tpu" and a.data_ptr() == t.data_ptr()
    assert_close(a, c, rtol=0, atol=0)
    k = torch.asarray(to_dlpack(t), copy=True)
    assert k.data_ptr() != t.data_ptr()
    assert_close(k, c, rtol=0, atol=0)
    s = torch.from_dlpack(to_dlpack(t[1]))
    assert s.data_ptr() == t[1].data_ptr()
    assert_close(s, c[1], rtol=0, atol=0)
    if dtype != torch.bool:
        a.add_(1)
        assert_close(t, c + 1, rtol=0, atol=0)


def test_asarray_under_default_device(mode):
    o = torch.arange(5)
    with torch.device("tpu"):
        for x in (3, o, o.numpy()):
            r = torch.asarray(x)
            assert r.device.type == "tpu"


@pytest.mark.parametrize("case", ["negative", "negative_out", "half", "float", "uint8"])
def test_randperm_limits(mode, case):
    f = {"negative": lambda d: torch.randperm(-1, device=d),
         "negative_out": lambda d: torch.randperm(-1, out=torch.empty(0, dtype=torch.long, device=d)),
         "half": lambda d: torch.randperm(2**11 + 2, out=torch.empty(0, dtype=torch.half, device=d)),
         "float": lambda d: torch.randperm(2**24 + 2, dtype=torch.float, device=d),
         "uint8": lambda d: torch.randperm(2**8 + 1, out=torch.empty(0, dtype=torch.uint8, device=d))}[case]
    with pytest.raises(RuntimeError):
        f("cpu")
    with pytest.raises(RuntimeError) as tpu:
        f("tpu")
    if case != "uint8":  # (CPU words the uint8 case as scalar_tensor's overflow)
        with pytest.raises(RuntimeError) as cpu:
            f("cpu")
        assert str(tpu.value) == str(cpu.value)


def test_randperm_out(mode):
    torch.manual_seed(3)
    r = torch.randperm(10, dtype=torch.long, device="tpu")
    torch.manual_seed(3)
    o = torch.zeros((2, 5), dtype=torch.long, device="tpu").t()
    torch.randperm(10, out=o)
    assert o.shape == (10,)
    assert torch.equal(o.cpu(), r.cpu())
    assert torch.equal(r.cpu().sort().values, torch.arange(10))
    e = torch.tensor(5, dtype=torch.float32, device="tpu")
    torch.randperm(0, out=e)
    assert e.numel() == 0


@pytest.mark.parametrize("name", ["linspace", "logspace"])
def test_one_step_complex_space(mode, name):
    f = getattr(torch, name)
    for kw in ({"dtype": torch.complex64}, {}):
        assert_close(f(0.5 + 1j, 2 - 1j, 1, device="tpu", **kw), f(0.5 + 1j, 2 - 1j, 1, **kw))

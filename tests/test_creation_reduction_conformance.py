"""Groups of failures of PyTorch's own ``test_tensor_creation_ops.py`` on tpu
(``perf.pytorch_suite``, docs/conformance.md), each checked here against PyTorch CPU eager
in strict and defer."""
from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from _util import assert_close, to_tpu

OVERLAP = "unsupported operation: more than one element of the written-to tensor"


def _both(fn):
    """``fn(device)`` on CPU and on tpu."""
    return fn("cpu"), fn("tpu")


# ---- torch.tensor of 0-d tpu tensors (item() with the Python key excluded) ---------------


def test_tensor_from_list_of_0d_tpu_tensors(mode):
    def make(d):
        b = torch.tensor([1, 2, 3], device=d)
        c = torch.tensor([4, 5], device=d)
        return torch.tensor(list(itertools.product(b, c)), device=d)

    cpu, tpu = _both(make)
    assert tpu.device.type == "tpu"
    assert_close(tpu, cpu, rtol=0, atol=0)


def test_cartesian_prod(mode):
    args = [torch.tensor([1]), torch.tensor([1, 2, 3]), torch.tensor([1, 2])]
    assert_close(torch.cartesian_prod(*map(to_tpu, args)), torch.cartesian_prod(*args))


# ---- block_diag: ATen's checks ---------------------------------------------------------


def test_block_diag_values_and_device_check(mode):
    a, b = torch.randn(2, 3), torch.randn(4)
    assert_close(torch.block_diag(to_tpu(a), to_tpu(b)), torch.block_diag(a, b))
    with pytest.raises(RuntimeError, match="^torch.block_diag: input tensors must all be on the same "
                                           "device. Input 0 is on device cpu and input 1 is on device tpu"):
        torch.block_diag(torch.ones(2, 2), torch.ones(2, 2, device="tpu"))
    with pytest.raises(RuntimeError, match="^torch.block_diag: Input tensors must have 2 or fewer "
                                           "dimensions. Input 1 has 3 dimensions"):
        torch.block_diag(torch.ones(2, 2, device="tpu"), torch.ones(1, 1, 1, device="tpu"))


# ---- arange/range/linspace/logspace with out= ---------------------------------------------

RANGE_OUTS = {
    "arange": lambda out: torch.arange(0, 4, out=out),
    "range": lambda out: torch.range(0, 3, out=out),
    "linspace": lambda out: torch.linspace(0, 3, 4, out=out),
    "logspace": lambda out: torch.logspace(0, 3, 4, base=2, out=out),
}


@pytest.mark.parametrize("name", sorted(RANGE_OUTS))
def test_range_factory_into_noncontiguous_out(mode, name):
    """An out with as many elements as the result keeps its shape and strides."""
    fn = RANGE_OUTS[name]

    def run(d):
        x = torch.zeros(2, 3, device=d)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.range's deprecation
            y = fn(x.narrow(1, 1, 2))
        return x, y

    (xc, yc), (xt, yt) = _both(run)
    assert_close(xt, xc, rtol=0, atol=0)
    assert yt.shape == yc.shape and yt.stride() == yc.stride()


def test_arange_out_resize_warns_and_permuted_out(mode):
    def run(d):
        line = torch.zeros(1, 49, device=d)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            torch.arange(-1, 1, 2.0 / 49, dtype=torch.float32, out=line)
        res = torch.zeros(3, 3, 40, device=d, dtype=torch.int64).permute(2, 0, 1)
        torch.arange(0, 360, out=res)
        empty = torch.tensor([], device=d)
        torch.arange(10, out=empty)
        return line, [str(m.message) for m in w], res, empty

    (lc, wc, rc, ec), (lt, wt, rt, et) = _both(run)
    assert_close(lt, lc)
    assert any("The out tensor will be resized" in m for m in wt)
    assert_close(rt, rc, rtol=0, atol=0)
    assert rt.stride() == rc.stride()
    assert_close(et, ec, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["linspace", "logspace", "cat"])
def test_expanded_out_is_internal_overlap(mode, name):
    out = torch.rand(1, device="tpu").expand(10) if name != "cat" else torch.rand(1, 3, device="tpu").expand(6, 3)
    with pytest.raises(RuntimeError, match=OVERLAP):
        if name == "linspace":
            torch.linspace(1, 10, 10, out=out)
        elif name == "logspace":
            torch.logspace(1, 10, 10, out=out)
        else:
            y = torch.rand(3, 3, device="tpu")
            torch.cat([y, y], out=out)


def test_cat_out_into_slice(mode):
    def run(d):
        w = torch.arange(24.0, device=d)
        torch.cat([w[:2], w[4:6]], out=w[6:10])
        return w

    cpu, tpu = _both(run)
    assert_close(tpu, cpu, rtol=0, atol=0)


# ---- all/any with out=: Bool or Byte results only -------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.uint8], ids=str)
def test_all_any_out_dtype(mode, dtype):
    c = (torch.rand(3, 4) > 0.5).to(dtype)
    t = to_tpu(c)
    for fn in (torch.all, torch.any):
        if dtype in (torch.bool, torch.uint8):
            oc, ot = torch.empty(3, dtype=dtype), torch.empty(3, dtype=dtype, device="tpu")
            fn(c, 1, out=oc)
            fn(t, 1, out=ot)
            assert_close(ot, oc, rtol=0, atol=0)
        else:
            name = fn.__name__
            with pytest.raises(RuntimeError, match=f"^{name} only supports bool tensor for result, got: "):
                fn(t, 1, out=torch.empty_like(t))


# ---- arange: ATen's bound checks, in ATen's order -------------------------------------------


@pytest.mark.parametrize("args", [(-5, float("nan")), (0, float("-inf"), -1), (float("inf"),),
                                  (1.175494351e-38, 3.402823466e38), (5, 0), (0, 5, 0)], ids=str)
def test_arange_bound_errors(mode, args):
    with pytest.raises(RuntimeError) as cpu:
        torch.arange(*args)
    with pytest.raises(RuntimeError) as tpu:
        torch.arange(*args, device="tpu")
    assert str(tpu.value) == str(cpu.value)


def test_arange_values(mode):
    for args in [(5,), (1, 10, 0.3), (0.6, 0.89, 0.1), (10, -1, -1), (-4.0, 4.0, 0.01), (True,)]:
        assert_close(torch.arange(*args, device="tpu"), torch.arange(*args))


def test_linspace_logspace_complex_endpoint_with_real_dtype(mode):
    """ATen's error and message (``torch.linspace(): inferred dtype ...``), which PyTorch's
    own test matches by its prefix."""
    for fn in (torch.linspace, torch.logspace):
        for a, b in ((0, 1j), (0j, 1), (0j, 1j)):
            for dt in (torch.float32, torch.float64):
                with pytest.raises(RuntimeError) as cpu:
                    fn(a, b, 5, dtype=dt)
                with pytest.raises(RuntimeError) as tpu:
                    fn(a, b, 5, dtype=dt, device="tpu")
                assert str(tpu.value) == str(cpu.value)
        assert_close(fn(0j, 1j, 3, device="tpu"), fn(0j, 1j, 3))

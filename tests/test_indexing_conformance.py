"""Failure groups of PyTorch's ``test/test_indexing.py`` on tpu (``perf.pytorch_suite``,
docs/conformance.md), each checked here against PyTorch CPU eager in strict and defer:
exception types and messages at the op, warnings, values."""
from __future__ import annotations

import warnings

import pytest
import torch
from _util import assert_close


def _outcome(fn, device):
    """``("ok", value on the CPU)`` or ``(exception type, message)``."""
    try:
        out = fn(device)
    except Exception as e:  # (compared with the CPU's)
        return type(e), str(e)
    return "ok", out.cpu() if isinstance(out, torch.Tensor) else out


def _same_as_cpu(fn):
    cpu, tpu = _outcome(fn, "cpu"), _outcome(fn, "tpu")
    assert cpu[0] == tpu[0], (cpu, tpu)
    if cpu[0] == "ok":
        assert_close(tpu[1], cpu[1], rtol=0, atol=0)
    else:
        assert tpu[1] == cpu[1]


# ---- x[uint8 mask]: one deprecation warning per call, at the caller's line ----------------


def test_uint8_mask_warns_at_each_line(mode):
    counts = {}
    for d in ("cpu", "tpu"):
        v = torch.tensor([True, False, True], device=d)
        m = torch.tensor([1, 0, 0], dtype=torch.uint8, device=d)
        with warnings.catch_warnings(record=True) as w:
            first = v[m]
            second = v[m]
            counts[d] = [(x.category, str(x.message), x.filename) for x in w]
        assert_close(first, torch.tensor([True]))
        assert_close(second, torch.tensor([True]))
    assert len(counts["cpu"]) == 2
    assert len(counts["tpu"]) == 2
    for (tc, tm, tf), (cc, cm, cf) in zip(counts["tpu"], counts["cpu"]):
        # (the CPU's message adds "(Triggered internally at <ATen file>)")
        assert (tc, tf) == (cc, cf) == (UserWarning, __file__) and cm.startswith(tm)


# ---- index dtypes: IndexError, as ATen's TORCH_CHECK_INDEX ---------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.int8])
def test_index_dtype_is_index_error(mode, dtype):
    _same_as_cpu(lambda d: torch.arange(3, device=d)[torch.tensor([1], dtype=dtype, device=d)])
    _same_as_cpu(lambda d: torch.arange(3, device=d)[torch.tensor([], dtype=dtype, device=d)])


# ---- index_copy_: ATen's IndexErrors (the decomposition's meta raises RuntimeError) --------

INDEX_COPY = [
    ((3, 2), 0, [0, 1], (3, 2)),  # number of indices != source.size(dim)
    ((3, 2), 0, [0, 1], (3, 3)),  # slice shapes differ: RuntimeError first
    ((3, 2), 0, [[0]], (1, 2)),  # a 2-d index
    ((3, 2), 0, [0, 1], ()),  # a scalar source with two indices
    ((3, 2), 0, 1, (2,)),  # dimensionalities differ
    ((3, 2), 1, 1, (3, 1)),  # a 0-d index
    ((), 0, [0], (1,)),
    ((), 0, 0, ()),
]


@pytest.mark.parametrize("shape,dim,index,src", INDEX_COPY, ids=lambda v: str(v).replace(" ", ""))
def test_index_copy_checks(mode, shape, dim, index, src):
    _same_as_cpu(lambda d: torch.zeros(shape, device=d).index_copy_(
        dim, torch.tensor(index, device=d), torch.arange(1., 1. + torch.Size(src).numel(),
                                                         device=d).reshape(src)))


# ---- index values made on the device from constants and edited: checked at the op ---------


@pytest.mark.parametrize("factory", ["ones", "zeros", "full"])
def test_edited_constant_index_raises_at_op(mode, factory):
    def make(d):
        if factory == "full":
            return torch.full((20,), 3, dtype=torch.int64, device=d)
        return getattr(torch, factory)(20, dtype=torch.int64, device=d)

    def get(d, where, value):
        ind = make(d)
        ind[where] = value
        return torch.zeros(5, device=d)[ind]

    def put(d, where, value):
        ind = make(d)
        ind[where] = value
        a = torch.zeros(5, device=d)
        a[ind] = 1.0
        return a

    for where, value in ((-1, 10), (0, 11), (slice(3, 5), -6), (4, 2)):
        _same_as_cpu(lambda d, w=where, v=value: get(d, w, v))
        _same_as_cpu(lambda d, w=where, v=value: put(d, w, v))


def test_edited_index_with_tensor_value(mode):
    def f(d):
        ind = torch.ones(6, dtype=torch.int64, device=d)
        ind[1:3] = torch.tensor([4, 2], device=d)
        return torch.arange(10., 15., device=d)[ind]

    _same_as_cpu(f)

    def g(d):
        ind = torch.ones(6, dtype=torch.int64, device=d)
        ind[1:3] = torch.tensor([4, 7], device=d)
        return torch.arange(10., 15., device=d)[ind]

    _same_as_cpu(g)


def test_index_computed_on_device_still_checked(mode):
    """An index edited by a device computation is not known on the host: its check stays
    on the device (read at the next sync point, lazyrt's default), its values are right."""
    ind = torch.ones(4, dtype=torch.int64, device="tpu")
    ind.add_(torch.tensor([0, 1, 2, 3], device="tpu"))
    ind[0] = 0
    out = torch.arange(10., 15., device="tpu")[ind]
    assert_close(out, torch.tensor([10., 12., 13., 14.]))

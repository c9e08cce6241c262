"""Tensors grown by ``torch.cat`` appends (``lazyrt/_append.py``): the same values, shapes
and dtypes as CPU, views and writes that alias as PyTorch's, and programs that do not
change with the length."""
from __future__ import annotations

import pytest
import torch

import lazyrt
from lazyrt import metrics

MODES = ["strict", "defer"]


@pytest.fixture(params=MODES)
def mode(request):
    with lazyrt.set_mode(request.param):
        yield request.param


def _grow(x, pieces, dim):
    for p in pieces:
        x = torch.cat([x, p], dim)
    return x


@pytest.mark.parametrize("shape,dim,dtype", [((3, 5), -1, torch.int64), ((1, 4), 1, torch.int32),
                                             ((2, 3, 4), 1, torch.bool), ((5,), 0, torch.int64)])
def test_values_and_ends_match_cpu(mode, shape, dim, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 9, shape, generator=g).to(dtype)
    piece = list(shape)
    pieces = []
    for i in range(70):  # past the first bucket (64)
        piece[dim] = 1 + i % 3
        pieces.append(torch.randint(0, 9, piece, generator=g).to(dtype))
    xt = x.to("tpu")
    for i, p in enumerate(pieces):
        x = torch.cat([x, p], dim)
        xt = torch.cat([xt, p.to("tpu")], dim)
        if i % 23 == 0 or i == len(pieces) - 1:
            assert xt.shape == x.shape and xt.dtype == x.dtype
            for k in (1, 2):
                assert torch.equal(xt.narrow(dim, xt.shape[dim] - k, k).cpu(),
                                   x.narrow(dim, x.shape[dim] - k, k))
            assert torch.equal(xt.select(dim, -1).cpu(), x.select(dim, -1))
            assert torch.equal(xt.select(dim, 0).cpu(), x.select(dim, 0))
            assert torch.equal(xt.cpu(), x)
    # every other read of the whole tensor
    assert torch.equal(xt.sum(dim).cpu(), x.sum(dim))
    assert torch.equal(xt.reshape(-1).cpu(), x.reshape(-1))
    assert torch.equal(xt.contiguous().cpu(), x)


def test_slices_and_selects_like_python_indexing(mode):
    x = torch.arange(12).reshape(2, 6)
    xt = x.to("tpu")
    for _ in range(3):
        x = torch.cat([x, x[:, -1:] + 1], -1)
        xt = torch.cat([xt, xt[:, -1:] + 1], -1)
    for idx in [(slice(None), slice(-3, None)), (slice(None), slice(2, None)),
                (slice(None), slice(-1, None)), (slice(None), slice(-4, -1)),
                (slice(None), slice(None, None, 2)), (slice(None), -2), (slice(None), 0),
                (slice(None), slice(100, None)), (slice(None), slice(-100, None))]:
        assert torch.equal(xt[idx].cpu(), x[idx]), idx
        assert xt[idx].shape == x[idx].shape
    with pytest.raises(IndexError) as cpu:
        x[:, 9]
    with pytest.raises(IndexError, match=str(cpu.value)):
        xt[:, 9]


def test_appends_are_independent_and_views_alias(mode):
    x = torch.tensor([[1, 2, 3]])
    xt = x.to("tpu")
    for v in (4, 5, 6):
        x = torch.cat([x, torch.tensor([[v]])], 1)
        xt = torch.cat([xt, torch.tensor([[v]]).to("tpu")], 1)
    # two appends to the same tensor (beam search): neither sees the other's piece
    a, b = torch.cat([xt, torch.tensor([[7]], device="tpu")], 1), torch.cat(
        [xt, torch.tensor([[8, 9]], device="tpu")], 1)
    assert a.cpu().tolist() == [[1, 2, 3, 4, 5, 6, 7]]
    assert b.cpu().tolist() == [[1, 2, 3, 4, 5, 6, 8, 9]]
    assert xt.cpu().tolist() == x.tolist()
    # a write through the end window is a write into the tensor, and back
    tail = xt[:, -2:]
    tail[0, 1] = 60
    x[:, -2:][0, 1] = 60
    assert xt.cpu().tolist() == x.tolist()
    xt[0, 0] = 10
    x[0, 0] = 10
    assert tail.cpu().tolist() == x[:, -2:].tolist()
    assert xt.cpu().tolist() == x.tolist()
    xt.add_(1)
    x.add_(1)
    assert tail.cpu().tolist() == x[:, -2:].tolist() and xt.cpu().tolist() == x.tolist()
    # the tensors appended to earlier are untouched
    assert a.cpu().tolist() == [[1, 2, 3, 4, 5, 6, 7]]


def test_cat_errors_and_other_cats_unchanged(mode):
    x = torch.ones(2, 3, dtype=torch.int64, device="tpu")
    x = torch.cat([x, x[:, :1]], 1)
    x = torch.cat([x, x[:, :1]], 1)
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        torch.cat([x, torch.ones(3, 1, dtype=torch.int64, device="tpu")], 1)
    # a promoting cat is an ordinary cat (PyTorch's promotion)
    y = torch.cat([x, torch.ones(2, 1, dtype=torch.int32, device="tpu")], 1)
    assert y.dtype == torch.int64 and y.shape == (2, 6) and y.is_contiguous()
    # floating tensors keep exact, contiguous storage
    f = torch.zeros(2, 3, device="tpu")
    for _ in range(3):
        f = torch.cat([f, torch.ones(2, 1, device="tpu")], 1)
    assert f.is_contiguous() and f.stride() == (6, 1) and f.storage_offset() == 0
    assert torch.equal(f.cpu(), torch.cat([torch.zeros(2, 3), torch.ones(2, 3)], 1))


def test_programs_do_not_change_with_the_length(mode):
    """The generation loop's bookkeeping: append a token, read the last one, compare it.
    Past the first appends, no step compiles anything until the buffer is full."""
    ids = torch.randint(0, 100, (3, 7)).to("tpu")
    pos = torch.arange(7).expand(3, 7).contiguous().to("tpu")
    compiles = []
    for _ in range(50):
        metrics.reset()
        nxt = (ids[:, -1] * 7 + 3) % 100
        ids = torch.cat([ids, nxt[:, None]], dim=-1)
        pos = torch.cat([pos, pos[:, -1:] + 1], dim=-1)
        done = bool((ids[:, -1:] == 5).any())
        assert isinstance(done, bool)
        compiles.append(metrics.counters()["cache_misses"])
    assert sum(compiles[4:]) == 0, compiles
    ref_ids = ids.cpu()
    assert torch.equal(pos.cpu(), torch.arange(57).expand(3, 57))
    assert torch.equal(ref_ids[:, 8:], (ref_ids[:, 7:-1] * 7 + 3) % 100)

"""Tensors grown by ``torch.cat`` appends (``lazyrt/_ops/append.py``): the same values, shapes
and dtypes as CPU, views and writes that alias as PyTorch's, and programs that do not
change with the length."""
from __future__ import annotations

import pytest
import torch

import lazyrt
from lazyrt import metrics

pytestmark = [pytest.mark.sweep(every=2), pytest.mark.usefixtures("compile_at_first_run")]

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
            assert xt.stride() == x.stride() and xt.storage_offset() == 0
            assert xt.is_contiguous()
            for k in (1, 2):
                assert torch.equal(xt.narrow(dim, xt.shape[dim] - k, k).cpu(),
                                   x.narrow(dim, x.shape[dim] - k, k))
            assert torch.equal(xt.select(dim, -1).cpu(), x.select(dim, -1))
            assert torch.equal(xt.select(dim, 0).cpu(), x.select(dim, 0))
            assert torch.equal(xt.cpu(), x)
    # every other read of the whole tensor, and views as of a fresh contiguous tensor
    assert torch.equal(xt.sum(dim).cpu(), x.sum(dim))
    assert torch.equal(xt.view(-1).cpu(), x.view(-1))
    assert torch.equal(xt.as_strided((2, 2), (1, 2), 1).cpu(), x.as_strided((2, 2), (1, 2), 1))
    with pytest.raises(RuntimeError, match="out of bounds for storage"):
        xt.as_strided((x.numel() + 1,), (1,))
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
    # ops that address storage see the tensor's own elements, writes included
    flat = xt.as_strided((3,), (2,), 1)
    flat.mul_(10)
    x.as_strided((3,), (2,), 1).mul_(10)
    assert xt.cpu().tolist() == x.tolist() and tail.cpu().tolist() == x[:, -2:].tolist()
    xt.resize_(2, 3)
    x.resize_(2, 3)
    assert xt.cpu().tolist() == x.tolist()
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


def _grown_pair(dtype=torch.int64, rows=2, n=9):
    x = torch.arange(rows * 3).reshape(rows, 3).to(dtype)
    xt = x.to("tpu")
    for i in range(n - 3):
        p = torch.full((rows, 1), i % 2).to(dtype)
        x = torch.cat([x, p], 1)
        xt = torch.cat([xt, p.to("tpu")], 1)
    return x, xt


def test_casts_and_right_pads_of_a_grown_tensor(mode):
    x, xt = _grown_pair()
    for dt in (torch.bool, torch.float32, torch.int32):
        c, ct = x.to(dt), xt.to(dt)
        assert ct.dtype == dt and torch.equal(ct.cpu(), c)
        assert torch.equal(ct[:, -2:].cpu(), c[:, -2:])
    m, mt = x.to(torch.bool), xt.to(torch.bool)
    for pad, value in [((0, 5), 0), ((0, 1), 1), ((0, 0), 0), ((2, 3), 0), ((0, 4, 1, 0), 0),
                       ((0, 3), -7)]:
        for a, at in ((x, xt), (m, mt)):
            if a.dtype == torch.bool and value not in (0, 1):
                continue
            ref = torch.nn.functional.pad(a, pad, value=value)
            got = torch.nn.functional.pad(at, pad, value=value)
            assert got.dtype == ref.dtype and got.shape == ref.shape
            assert torch.equal(got.cpu(), ref), (pad, value, a.dtype)
    # a negative pad crops, as on CPU
    assert torch.equal(torch.nn.functional.pad(xt, (0, -2)).cpu(),
                       torch.nn.functional.pad(x, (0, -2)))


def test_a_padding_mask_is_one_program_at_every_length(mode):
    """transformers' static-cache mask: the 2-D mask grows a step at a time, and each step
    casts it to bool and pads it to the cache's length."""
    mask = torch.ones(2, 5, dtype=torch.int64)
    mask[1, :2] = 0
    mt = mask.to("tpu")
    compiles = []
    for _ in range(30):
        mask = torch.cat([mask, mask.new_ones((2, 1))], -1)
        mt = torch.cat([mt, mt.new_ones((2, 1))], -1)
        metrics.reset()
        got = torch.nn.functional.pad(mt.to(torch.bool), (0, 40 - mt.shape[-1]))
        ref = torch.nn.functional.pad(mask.to(torch.bool), (0, 40 - mask.shape[-1]))
        assert torch.equal(got.cpu(), ref)
        compiles.append(metrics.counters()["cache_misses"])
    assert sum(compiles[4:]) == 0, compiles


@pytest.mark.parametrize("op,args", [("new_zeros", ((2, 3),)), ("new_ones", ((4,),)),
                                     ("new_full", ((2, 2), 7)), ("new_empty", ((0, 2),)),
                                     ("new_empty_strided", ((2, 3), (1, 2)))])
def test_new_factories_follow_dtype_and_device_only(mode, op, args):
    for kw in ({}, {"dtype": torch.float64}, {"device": "cpu"}, {"dtype": torch.bool}):
        if op == "new_full" and kw.get("dtype") == torch.bool:
            continue
        for shape in ((3,), (2, 5)):
            c = torch.arange(3 if shape == (3,) else 10, dtype=torch.int32).reshape(shape)
            ref = getattr(c, op)(*args, **kw)
            got = getattr(c.to("tpu"), op)(*args, **kw)
            assert got.device.type == ("cpu" if kw.get("device") == "cpu" else "tpu")
            assert got.dtype == ref.dtype and got.shape == ref.shape
            assert got.stride() == ref.stride()
            if op not in ("new_empty", "new_empty_strided"):
                assert torch.equal(got.cpu(), ref)
    # the same op on tensors of other shapes runs one program
    x = torch.zeros(3, dtype=torch.int32, device="tpu")
    getattr(x, op)(*args).cpu()
    metrics.reset()
    for n in (4, 5, 6):
        getattr(torch.zeros(n, 2, dtype=torch.int32, device="tpu")[:, :1], op)(*args).cpu()
    assert metrics.counters()["cache_misses"] <= 3  # the three zeros, not the new_*


@pytest.mark.parametrize("heads,gqa", [(2, False), (4, True)])
def test_attention_over_a_grown_kv_cache(mode, heads, gqa):
    """Decoding with a KV cache grown by cat: with gradients off, keys and values live in
    buffers and SDPA reads the whole buffers with a mask of the length, one program for
    every length; the outputs are SDPA's on the exact tensors (CPU)."""
    g = torch.Generator().manual_seed(1)
    F = torch.nn.functional
    k = torch.randn(2, 2, 3, 8, generator=g)
    v = torch.randn(2, 2, 3, 8, generator=g)
    kt, vt = k.to("tpu"), v.to("tpu")
    compiles = []
    with torch.no_grad():
        for _ in range(24):
            kn, vn = torch.randn(2, 2, 1, 8, generator=g), torch.randn(2, 2, 1, 8, generator=g)
            q = torch.randn(2, heads, 1, 8, generator=g)
            k, v = torch.cat([k, kn], 2), torch.cat([v, vn], 2)
            metrics.reset()
            kt, vt = torch.cat([kt, kn.to("tpu")], 2), torch.cat([vt, vn.to("tpu")], 2)
            got = F.scaled_dot_product_attention(q.to("tpu"), kt, vt, enable_gqa=gqa).cpu()
            compiles.append(metrics.counters()["cache_misses"])
            ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        assert kt.is_contiguous() and kt.shape == k.shape and torch.equal(kt.cpu(), k)
    assert sum(compiles[4:]) == 0, compiles


def test_grown_floats_keep_exact_storage_under_autograd(mode):
    x = torch.zeros(2, 3, device="tpu")
    for _ in range(3):
        x = torch.cat([x, torch.ones(2, 1, device="tpu")], 1)
    from lazyrt._ops import append as _append

    assert _append.whole(x) is None  # gradients on: an ordinary cat
    with torch.no_grad():
        y = torch.cat([x, x[:, :1]], 1)
        assert _append.whole(y).chain is None  # marked, exact
        z = torch.cat([y, x[:, :1]], 1)
        assert _append.whole(z).chain is not None  # buffered
    assert torch.equal(z.cpu(), torch.cat([torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 2)], 1))
    w = torch.zeros(2, 3, device="tpu", requires_grad=True)
    h = torch.cat([torch.cat([w, w], 1), w], 1)
    assert _append.whole(h) is None or _append.whole(h).chain is None
    h.sum().backward()
    assert torch.equal(w.grad.cpu(), torch.full((2, 3), 3.0))

"""Out-of-range indices raise PyTorch's own error on tpu, never a clamped, dropped or NaN
value: at the op when the index is known on the host (a Python list, a CPU tensor, a tensor
just moved to tpu), at the next sync point when it is a device value (as CUDA's device-side
assert), in strict, defer, debug and compiled code. In-range indices, negative ones
included, still give CPU's values."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from _util import assert_close

import lazyrt


def _x(dev):
    return torch.arange(5.0).to(dev)


def _i(v, dev):
    return torch.tensor([1, v]).to(dev)


def _dev(v, dev):
    """The index as a device value (computed on tpu, not known on the host)."""
    t = torch.tensor([1, v]).to(dev)
    return t * 1 if dev == "tpu" else t


# name -> f(index) on tensors of device `dev` (index made by `mk(v, dev)`)
FORMS = {
    "getitem": lambda d, i: _x(d)[i],
    "getitem_2d": lambda d, i: torch.zeros(3, 5).to(d)[torch.tensor([0, 2]).to(d), i],
    "setitem": lambda d, i: _x(d).index_put_((i,), torch.tensor(1.0).to(d)),
    "index_put_acc": lambda d, i: _x(d).index_put_((i,), torch.ones(2).to(d), accumulate=True),
    "index_select": lambda d, i: _x(d).index_select(0, i),
    "index_select_dim1": lambda d, i: torch.zeros(3, 5).to(d).index_select(1, i),
    "gather": lambda d, i: _x(d).gather(0, i),
    "take": lambda d, i: _x(d).take(i),
    "take_along_dim": lambda d, i: _x(d).take_along_dim(i),
    "put_": lambda d, i: _x(d).put_(i, torch.ones(2).to(d)),
    "scatter_": lambda d, i: _x(d).scatter_(0, i, torch.ones(2).to(d)),
    "scatter_value": lambda d, i: _x(d).scatter(0, i, 2.0),
    "scatter_add_": lambda d, i: _x(d).scatter_add_(0, i, torch.ones(2).to(d)),
    "scatter_reduce_": lambda d, i: _x(d).scatter_reduce_(0, i, torch.ones(2).to(d), "amax"),
    "index_add_": lambda d, i: _x(d).index_add_(0, i, torch.ones(2).to(d)),
    "index_add_2d": lambda d, i: torch.zeros(3, 5).to(d).index_add_(1, i, torch.ones(3, 2).to(d)),
    "index_copy_": lambda d, i: _x(d).index_copy_(0, i, torch.ones(2).to(d)),
    "index_fill_": lambda d, i: _x(d).index_fill_(0, i, -1.0),
    "index_reduce_": lambda d, i: _x(d).index_reduce_(0, i, torch.ones(2).to(d), "prod"),
    "embedding": lambda d, i: F.embedding(i, torch.arange(15.0).view(5, 3).to(d)),
    "cross_entropy": lambda d, i: F.cross_entropy(torch.arange(10.0).view(2, 5).to(d), i),
}
# negative indices in range wrap around for these (the others reject them, as on the CPU)
WRAPS = {"getitem", "getitem_2d", "setitem", "index_put_acc", "take", "put_", "index_fill_"}


def _cpu_error(name, v):
    with pytest.raises(Exception) as ei:
        FORMS[name]("cpu", _i(v, "cpu"))
    return ei.value


@pytest.mark.parametrize("v", [7, -6])
@pytest.mark.parametrize("name", sorted(FORMS))
def test_host_known_index_raises_at_the_op(mode, name, v):
    """A CPU index, or one moved to tpu from the host: PyTorch's error at the op."""
    expected = _cpu_error(name, v)
    mk = (lambda v, d: torch.tensor([1, v])) if name in ("getitem", "setitem") else _i
    with pytest.raises(type(expected)) as ei:
        FORMS[name]("tpu", mk(v, "tpu"))
    assert str(ei.value) == str(expected)


@pytest.mark.parametrize("name", sorted(FORMS))
def test_device_index_raises_at_the_next_sync(mode, name):
    expected = _cpu_error(name, 7)
    out = FORMS[name]("tpu", _dev(7, "tpu"))  # no error at the op
    with pytest.raises(type(expected)) as ei:
        out.cpu()
    msg = str(ei.value)
    assert msg.splitlines()[0] == str(expected)
    assert "test_index_bounds.py" in msg and "asynchronous assert" in msg  # the user's line
    lazyrt.sync()  # read once: the next sync is clean


@pytest.mark.parametrize("name", sorted(FORMS))
def test_in_range_indices_equal_cpu(mode, name):
    for v in ([-1, -5] if name in WRAPS else []) + [0, 4]:
        for mk in (_i, _dev):
            expected = FORMS[name]("cpu", _i(v, "cpu"))
            assert_close(FORMS[name]("tpu", mk(v, "tpu")), expected)
    lazyrt.sync()


def test_python_list_and_negative_list(mode):
    x = torch.arange(5.0)
    t = x.to("tpu")
    for idx in ([1, 7], [-6], [5, 0]):
        with pytest.raises(IndexError) as e_cpu:
            x[idx]
        with pytest.raises(IndexError) as e_tpu:
            t[idx]
        assert str(e_tpu.value) == str(e_cpu.value)
    assert_close(t[[-1, -5, 2]], x[[-1, -5, 2]])
    t[[1, -1]] = 9.0
    x[[1, -1]] = 9.0
    assert_close(t, x)


def test_nll_loss_ignore_index_is_not_out_of_range(mode):
    logits = torch.arange(10.0).view(2, 5)
    tgt = torch.tensor([3, -100])
    expected = F.cross_entropy(logits, tgt)
    assert_close(F.cross_entropy(logits.to("tpu"), tgt.to("tpu")), expected)
    assert_close(F.cross_entropy(logits.to("tpu"), tgt.to("tpu") * 1), expected)
    lazyrt.sync()


def test_wrong_shape_bool_mask(mode):
    for shape, mask in (((5,), [True, False]), ((2, 3), [True, False, True])):
        x = torch.zeros(shape)
        m = torch.tensor(mask)
        with pytest.raises(IndexError) as e_cpu:
            x[m]
        for mm in (m, m.to("tpu")):
            with pytest.raises(IndexError) as e_tpu:
                x.to("tpu")[mm]
            assert str(e_tpu.value) == str(e_cpu.value)
            with pytest.raises(IndexError) as e_tpu:
                x.to("tpu")[mm] = 1.0
            assert str(e_tpu.value) == str(e_cpu.value)


def test_uint8_mask_warns_as_cpu(mode):
    x = torch.arange(3.0)
    m = torch.tensor([1, 0, 1], dtype=torch.uint8)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = x.to("tpu")[m.to("tpu")]
    assert any("indexing with dtype torch.uint8 is now deprecated" in str(a.message) for a in w)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_close(out, x[m])


def test_trivial_fancy_out_of_bounds_sync_mode(monkeypatch, mode):
    """PyTorch's ``test_trivial_fancy_out_of_bounds`` (device indices, IndexError at the op)
    passes with ``LAZYRT_INDEX_CHECKS=sync``."""
    monkeypatch.setattr(lazyrt.config, "index_checks", "sync")
    a = torch.zeros(5, device="tpu")
    ind = torch.ones(20, dtype=torch.int64, device="tpu")
    ind[-1] = 10
    with pytest.raises(IndexError):
        a[ind]
    with pytest.raises(IndexError):
        a[ind] = 0
    ind = torch.ones(20, dtype=torch.int64, device="tpu")
    ind[0] = 11
    with pytest.raises(IndexError):
        a[ind]


def test_debug_mode_raises_at_the_op():
    with lazyrt.set_mode("debug"):
        i = _dev(7, "tpu")
        with pytest.raises(RuntimeError, match="index 7 is out of bounds") as ei:
            _x("tpu").gather(0, i)
        assert "debug mode" in str(ei.value)


def test_checks_off_leaves_device_indices_unchecked(monkeypatch, mode):
    monkeypatch.setattr(lazyrt.config, "index_checks", "off")
    _x("tpu").index_select(0, _dev(7, "tpu")).cpu()  # no error: XLA's value
    with pytest.raises(IndexError):  # host-known: always checked
        _x("tpu").index_select(0, _i(7, "tpu"))


def test_device_check_is_part_of_the_ops_program(mode):
    """No extra program and no sync: the check is one more output of the op's own."""
    w = torch.arange(15.0).view(5, 3).to("tpu")
    i = _dev(2, "tpu")
    F.embedding(i, w)
    lazyrt.sync()
    c = lazyrt.metrics.counters()
    before = (c["executions"], c.get("transfers_to_host", 0))
    out = F.embedding(i, w)
    c = lazyrt.metrics.counters()
    assert c.get("transfers_to_host", 0) == before[1]
    if mode == "strict":
        assert c["executions"] == before[0] + 1
    assert_close(out, F.embedding(torch.tensor([1, 2]), torch.arange(15.0).view(5, 3)))


def test_compiled_graph_checks_device_indices(mode):
    def f(x, i):
        return torch.index_select(x, 0, i) * 2

    cf = torch.compile(f, backend="tpu")
    x = torch.arange(5.0)
    expected = _cpu_error("index_select", 7)
    assert_close(cf(x.to("tpu"), _dev(3, "tpu")), f(x, torch.tensor([1, 3])))
    before = lazyrt.metrics.counters().get("compiled_eager_calls", 0)
    out = cf(x.to("tpu"), _dev(7, "tpu"))
    assert lazyrt.metrics.counters().get("compiled_eager_calls", 0) == before
    with pytest.raises(type(expected)) as ei:
        out.cpu()
    assert str(ei.value).splitlines()[0] == str(expected)


# ---- issue 41's other indexing groups ---------------------------------------------------------


def _same_error(fn, *args_cpu, args_tpu):
    with pytest.raises(Exception) as e_cpu:
        fn(*args_cpu)
    with pytest.raises(type(e_cpu.value)) as e_tpu:
        fn(*args_tpu)
    assert str(e_tpu.value).splitlines()[0] == str(e_cpu.value).splitlines()[0]


def test_index_copy_scalar_shapes(mode):
    """PyTorch's ``test_index_copy_scalars``: every mix of () and (1,) for target, index
    and source."""
    import itertools

    for st, si, ss in itertools.product([(), (1,)], repeat=3):
        target, idx, src = torch.zeros(st), torch.zeros(si, dtype=torch.int64), torch.full(ss, 3.0)
        t = target.to("tpu")
        t.index_copy_(0, idx.to("tpu"), src.to("tpu"))
        target.index_copy_(0, idx, src)
        assert_close(t, target)


@pytest.mark.parametrize("self_shape,dim,src_shape,idx", [
    ((5,), 0, (), [1]), ((5,), 0, (), 1), ((3, 4), 0, (3,), [0]), ((3, 4), 0, (2, 5), [0, 1]),
    ((3, 4), 1, (3, 2), [0, 1]), ((), 0, (1,), [0]), ((3, 4), -1, (3, 2), [0, 3])])
def test_index_add_source_shape(mode, self_shape, dim, src_shape, idx):
    """ATen's shape checks of ``index_add`` (a 0-d source into a 1-d tensor raised nothing);
    the shapes that fit add as on CPU."""
    x, s, i = torch.zeros(self_shape), torch.arange(1.0, 1.0 + s_numel(src_shape)).reshape(src_shape), \
        torch.tensor(idx)
    try:
        want = x.clone().index_add_(dim, i, s)
    except RuntimeError:
        _same_error(lambda t, j, v: t.index_add_(dim, j, v), x, i, s,
                    args_tpu=(x.to("tpu"), i.to("tpu"), s.to("tpu")))
        return
    assert_close(x.to("tpu").index_add_(dim, i.to("tpu"), s.to("tpu")), want)


def s_numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def test_bool_index_put_accumulate(mode):
    x = torch.tensor([False, True, False, False])
    idx = torch.tensor([0, 0, 2])
    v = torch.tensor([True, False, False])
    out = x.to("tpu").index_put_((idx.to("tpu"),), v.to("tpu"), accumulate=True)
    assert_close(out, x.clone().index_put_((idx,), v, accumulate=True))


def test_indices_that_do_not_broadcast(mode):
    """PyTorch's ``test_broaderrors_indexing``."""
    a = torch.zeros(5, 5)
    for fn in (lambda t: t[[0, 1], [0, 1, 2]], lambda t: t.__setitem__(([0, 1], [0, 1, 2]), 0)):
        _same_error(fn, a.clone(), args_tpu=(a.to("tpu"),))


def test_index_fill_complex_value_on_a_real_tensor(mode):
    for dt in (torch.float32, torch.int64):
        x = torch.zeros(3, dtype=dt)
        i = torch.tensor([1])
        _same_error(lambda t, j: t.index_fill_(0, j, 1 + 1j), x, i, args_tpu=(x.to("tpu"), i.to("tpu")))


def test_empty_indices_and_empty_dims(mode):
    e = torch.tensor([], dtype=torch.int64)
    cases = [
        lambda d: torch.zeros(0, 3).to(d)[e.to(d)],
        lambda d: torch.zeros(3, 0).to(d).index_select(0, torch.tensor([1]).to(d)),
        lambda d: torch.zeros(0, 3).to(d).index_select(0, e.to(d)),
        lambda d: torch.zeros(0, 3).to(d).gather(0, torch.zeros(0, 3, dtype=torch.int64).to(d)),
        lambda d: torch.zeros(3, 0).to(d)[torch.tensor([1, 2]).to(d)],
        lambda d: torch.zeros(3, 0).to(d)[:, e.to(d)],
    ]
    for f in cases:
        assert_close(f("tpu"), f("cpu"))


def test_values_that_do_not_broadcast_to_the_indexing_result(mode):
    i, j = torch.tensor([0, 1]), torch.tensor([2, 0])
    cases = [((i,), (3,)), ((i,), (2, 5, 2)), ((None, i), (2,)), ((i, None, j), (5, 3)),
             ((i,), (1, 2, 5)), ((i,), (5,)), ((i,), (2, 1)), ((None, i), (5, 1)),
             ((i, None, j), (2, 5)), ((i, j), (1,))]
    for idx, vshape in cases:
        x = torch.zeros(5, 5, 5)
        v = torch.arange(float(torch.Size(vshape).numel())).view(vshape)

        def put(t, vals, idx=idx):
            t[tuple(slice(None) if a is None else a.to(t.device) for a in idx)] = vals
            return t

        try:
            expected = put(x, v)
        except RuntimeError:
            _same_error(put, x, v, args_tpu=(x.to("tpu"), v.to("tpu")))
            continue
        assert_close(put(torch.zeros(5, 5, 5).to("tpu"), v.to("tpu")), expected)


def test_empty_ndim_index(mode):
    """PyTorch's ``test_empty_ndim_index``: an index into a dim of size 0 is out of range."""
    x = torch.randn(2, 3, 4, 5)
    e = torch.empty(0, 6, dtype=torch.int64)
    assert_close(x.to("tpu")[:, e.to("tpu")], x[:, e])
    x = torch.empty(10, 0)
    t = x.to("tpu")
    assert t[[1, 2]].shape == (2, 0) and t[[], []].shape == (0,)
    with pytest.raises(IndexError) as e_cpu:
        x[:, [0, 1]]
    with pytest.raises(IndexError) as e_tpu:
        t[:, [0, 1]]
    assert str(e_tpu.value) == str(e_cpu.value)


def test_unread_checks_stay_bounded_without_a_sync(monkeypatch):
    """A strict loop that never reads a value does not hold every check it made."""
    from lazyrt._exec import asserts

    monkeypatch.setattr(asserts, "_DRAIN", 8)
    w = torch.arange(15.0).view(5, 3).to("tpu")
    i = _dev(2, "tpu")
    lazyrt.sync()
    for _ in range(30):
        F.embedding(i, w)
    assert asserts.count() < 30
    lazyrt.sync()


MASK_CASES = [((4, 5), (4, 5), ()), ((4, 5), (4,), (5,)), ((4, 5), (4,), (1, 5)), ((4, 5), (4,), (1,)),
              ((2, 3, 4), (2, 3), (4,)), ((4, 5), (4, 5), (1, 1, 1)), ((4,), (4,), (1, 1)),
              ((3, 4), (3,), (1, 1)), ((3, 4), (3,), (3, 4)), ((4, 5), (4, 5), (2,)), ((3, 4), (3,), (1, 1, 4))]


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("xs,ms,vs", MASK_CASES, ids=str)
def test_mask_index_put_values_and_errors(mode, xs, ms, vs, accumulate):
    """``index_put_(x, (mask,), v)`` with a bool mask (on the CPU or on tpu): the values, or
    ATen's error (one value without accumulate is its masked_fill_ path, any shape)."""
    g = torch.Generator().manual_seed(len(xs) * 10 + len(vs))
    x, v = torch.randn(xs, generator=g), torch.randn(vs, generator=g)
    m = torch.rand(ms, generator=g) > 0.5
    try:
        want = x.clone().index_put_((m,), v, accumulate=accumulate)
    except RuntimeError:
        for mdev in ("cpu", "tpu"):
            _same_error(lambda t, i, w: t.index_put_((i,), w, accumulate=accumulate), x.clone(), m, v,
                        args_tpu=(x.to("tpu"), m.to(mdev), v.to("tpu")))
        return
    for mdev in ("cpu", "tpu"):
        assert_close(x.to("tpu").index_put_((m.to(mdev),), v.to("tpu"), accumulate=accumulate), want,
                     rtol=0, atol=0)


@pytest.mark.usefixtures("compile_at_first_run")
def test_mask_assignment_compiles_once_per_shape(mode):
    """``x[mask] = 0`` with masks of different counts: one program per shape, not per count."""
    from lazyrt import metrics

    x = torch.randn(6, 5)
    t = x.to("tpu")
    masks = [torch.arange(30).reshape(6, 5) % k == 0 for k in (2, 3, 4, 5, 7)]
    t[masks[0]] = 0
    t.cpu()
    metrics.reset()
    x[masks[0]] = 0
    for m in masks[1:]:
        t[m] = 0
        t.cpu()  # (defer: a flush a step, the same program each time)
        x[m] = 0
    assert metrics.counters()["cache_misses"] == 0
    assert_close(t, x)


def test_index_put_values_of_more_dims_raise_as_aten(mode):
    """ATen's index_put_ drops no leading 1s of the values (Python's setitem does)."""
    x = torch.randn(4, 5)
    i = torch.tensor([0, 1])
    for v in (torch.ones(1, 1, 1), torch.ones(1, 1, 5)):
        _same_error(lambda t, j, w: torch.ops.aten.index_put_(t, [j], w), x.clone(), i, v,
                    args_tpu=(x.to("tpu"), i.to("tpu"), v.to("tpu")))
        y, yt = x.clone(), x.to("tpu")
        y[i] = v
        yt[i.to("tpu")] = v.to("tpu")
        assert_close(yt, y)

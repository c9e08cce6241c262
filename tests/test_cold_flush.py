"""Cold flushes on the CPU platform (``lazyrt._exec.coldflush``): a defer trace not flushed
before, with few new programs, runs op by op through strict's programs; from its 5th flush
on it is compiled as one program. Values against CPU eager and against strict mode, bit
for bit where the ops are the same programs."""
from __future__ import annotations

import pytest
import torch

import lazyrt
from lazyrt._base.metrics import COMPILES_BY_OP, COUNTERS
from lazyrt._exec import coldflush, consts
from lazyrt._exec import defer as _defer


@pytest.fixture
def fresh(monkeypatch):
    """Defer mode from empty flush and strict caches (so the traces here are new)."""
    monkeypatch.setattr(consts, "COLD_ENABLED", True)
    with lazyrt.set_mode("defer"):
        lazyrt.sync()
        _defer.clear_cache()
        lazyrt.metrics.reset()
        yield
        lazyrt.sync()


def _check(x, w):
    # a test's check of a result: isclose's few ops, then a host read
    y = torch.sigmoid(x @ w) * 3 - 1
    ok = torch.isclose(y, y + 0.0).all()
    return y, bool(ok)


def test_a_new_trace_runs_op_by_op_then_compiles_at_its_5th_flush(fresh):
    torch.manual_seed(0)
    x, w = torch.randn(5, 7), torch.randn(7, 3)
    tx, tw = x.to("tpu"), w.to("tpu")
    ref = torch.sigmoid(x @ w) * 3 - 1
    outs = []
    for i in range(6):
        y, ok = _check(tx, tw)
        assert ok
        outs.append(y.cpu())
        # the first COLD_CALLS flushes of each trace run op by op: no flush program
        assert COMPILES_BY_OP["flush"] == (0 if i < consts.COLD_CALLS else 1), i
    assert COUNTERS["cold_flushes"] == consts.COLD_CALLS
    for o in outs:
        torch.testing.assert_close(o, ref)


def test_op_by_op_values_are_strict_modes_bit_for_bit(fresh):
    torch.manual_seed(1)
    a = torch.randn(64, dtype=torch.float32).to("tpu")
    b = torch.randn(64, dtype=torch.float32).to("tpu")
    lazyrt.sync()
    deferred = (a * b + a).cpu()  # a multiply and an add: FMA-contracted when fused
    assert COUNTERS["cold_flushes"] == 1
    with lazyrt.set_mode("strict"):
        strict = (a * b + a).cpu()
    assert torch.equal(deferred, strict)
    torch.testing.assert_close(deferred, a.cpu() * b.cpu() + a.cpu())


def test_random_values_do_not_depend_on_how_the_flush_runs(fresh, monkeypatch):
    def draw():
        torch.manual_seed(7)
        r = torch.randn(6, 4, device="tpu") * 2 + torch.rand(6, 4, device="tpu")
        return r.cpu()

    cold = draw()
    assert COUNTERS["cold_flushes"] == 1
    monkeypatch.setattr(consts, "COLD_ENABLED", False)
    _defer.clear_cache()
    fused = draw()
    assert COMPILES_BY_OP["flush"] == 1
    torch.testing.assert_close(cold, fused, rtol=1e-6, atol=1e-6)


def test_in_place_updates_and_views_land_in_their_tensors(fresh):
    base = torch.arange(12.0).reshape(3, 4)
    t = base.to("tpu")
    v = t[1]
    v.mul_(10)
    t.add_(1)
    col = t[:, 2].clone()
    assert COUNTERS["cold_flushes"] == 0  # nothing flushed yet
    base[1].mul_(10)
    base.add_(1)
    torch.testing.assert_close(t.cpu(), base)
    torch.testing.assert_close(col.cpu(), base[:, 2])
    torch.testing.assert_close(v.cpu(), base[1])
    assert COUNTERS["cold_flushes"] >= 1


def test_an_out_of_range_index_raises_at_the_sync(fresh):
    x = torch.arange(5.0).to("tpu")
    idx = torch.tensor([0, 3]).to("tpu") * 2 + 1  # [1, 7], computed on the device
    y = x[idx] + 1
    with pytest.raises(IndexError, match="index 7 is out of bounds for dimension 0 with size 5"):
        y.cpu()
    assert COUNTERS["cold_flushes"] >= 1
    torch.testing.assert_close((x[idx.clamp(max=4)] + 1).cpu(), torch.tensor([2.0, 5.0]))


def test_a_trace_with_many_new_programs_is_compiled_at_once(fresh):
    x = torch.randn(8, 8).to("tpu")
    ref = x.cpu()
    fns = [torch.sin, torch.cos, torch.tanh, torch.exp, torch.sigmoid, torch.atan,
           torch.erf, torch.expm1, torch.log1p, torch.sinh, torch.cosh, torch.asinh,
           torch.relu, torch.square, torch.abs, torch.neg, torch.floor, torch.ceil,
           torch.round, torch.trunc]
    assert len(fns) > coldflush.NEW_PROGRAMS
    y, r = x, ref
    for f in fns:
        y, r = f(y) * 0.5, f(r) * 0.5
    torch.testing.assert_close(y.cpu(), r)
    assert COUNTERS["cold_flushes"] == 0 and COMPILES_BY_OP["flush"] == 1


def test_a_failing_op_leaves_the_trace_pending_and_a_retry_works(fresh, monkeypatch):
    from lazyrt._exec import strict

    x = torch.randn(4).to("tpu")
    lazyrt.sync()
    good = x + 1
    bad = torch.cosh(x)
    real = strict.run

    def failing(prog, arrays, scalars, log=None):
        if prog.name == "cosh":
            raise ValueError("cosh exploded")
        return real(prog, arrays, scalars, log)

    monkeypatch.setattr(strict, "run", failing)
    with pytest.raises(RuntimeError, match=r"cosh.*exploded") as ei:
        bad.cpu()
    assert "pending tensors are intact" in str(ei.value)
    monkeypatch.setattr(strict, "run", real)
    torch.testing.assert_close(bad.cpu(), torch.cosh(x.cpu()))
    torch.testing.assert_close(good.cpu(), x.cpu() + 1)


def test_off_with_host_runs(fresh, monkeypatch):
    monkeypatch.setattr(consts, "COLD_ENABLED", False)
    x = torch.randn(3, 3).to("tpu")
    torch.testing.assert_close((x * 2 + 1).cpu(), x.cpu() * 2 + 1)
    assert COUNTERS["cold_flushes"] == 0 and COMPILES_BY_OP["flush"] == 1

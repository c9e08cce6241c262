"""DeferAndFuse behaviour: what runs when, what is materialized, what is cached."""
from __future__ import annotations

import contextlib
import gc
import threading

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lazyrt
from lazyrt._base.ir import Pending
from lazyrt._exec import defer as _defer

pytestmark = pytest.mark.usefixtures("defer_mode")


def _counters():
    return lazyrt.metrics.counters()


def _is_pending(t):
    from lazyrt._exec.values import value

    return type(value(t)) is Pending


def test_nothing_runs_before_a_sync_point():
    x = torch.randn(8, 8, device="tpu")
    lazyrt.sync()
    lazyrt.metrics.reset()
    y = (x @ x).relu() + 1
    z = y.sum(0) * 2
    c = _counters()
    assert c["executions"] == 0 and c["flushes"] == 0
    assert c["ops_recorded"] >= 4 and c["pending_ops"] >= 4
    assert _is_pending(y) and _is_pending(z)
    # Reading one tensor materializes every live pending tensor in the same flush.
    z_cpu = z.cpu()
    c = _counters()
    assert c["flushes"] == 1
    assert not _is_pending(y) and not _is_pending(z)
    ref = ((x.cpu() @ x.cpu()).relu() + 1).sum(0) * 2
    torch.testing.assert_close(z_cpu, ref)


def test_dead_intermediates_are_not_outputs():
    x = torch.randn(1000, device="tpu")
    lazyrt.sync()
    y = x
    for _ in range(10):
        y = y * 1.5 + 0.25
    out, refs = _defer._live_outputs(_defer.current())
    assert len(refs) == 1  # only y; the 19 intermediates are dead
    lazyrt.sync()
    rec = lazyrt.memory.flush_log()[-1]
    assert rec.output_bytes == 4000


@pytest.mark.parametrize("sync", ["item", "cpu", "tolist", "repr", "bool", "nonzero", "sync",
                                  "synchronize"])
def test_sync_points(sync):
    x = torch.randn(4, device="tpu")
    lazyrt.sync()
    lazyrt.metrics.reset()
    y = x * 2
    assert _counters()["flushes"] == 0
    {
        "item": lambda: y[0].item(), "cpu": lambda: y.cpu(), "tolist": lambda: y.tolist(),
        "repr": lambda: repr(y), "bool": lambda: bool(y.sum() > -1e9),
        "nonzero": lambda: torch.nonzero(y), "sync": lazyrt.sync,
        "synchronize": torch.tpu.synchronize,
    }[sync]()
    assert _counters()["flushes"] >= 1
    assert not _is_pending(y)


def test_pending_op_budget():
    prev = lazyrt.config.max_pending_ops
    lazyrt.config.max_pending_ops = 50
    try:
        x = torch.ones(4, device="tpu")
        lazyrt.sync()
        lazyrt.metrics.reset()
        for _ in range(500):
            x = x + 1
        c = _counters()
        assert c["flushes"] >= 9 and c["max_trace_ops"] <= 51
        assert x.cpu().tolist() == [501.0] * 4
    finally:
        lazyrt.config.max_pending_ops = prev


def _steps(model, opt, x, y, steps, sched=None):
    """``steps`` training steps (cross-entropy, then ``loss.item()``); returns each step's
    loss and counters."""
    losses, stats = [], []
    for _ in range(steps):
        lazyrt.metrics.reset()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
        stats.append(_counters())
    return losses, stats


def _train_loop(steps, opt_kwargs=None, dropout=0.1):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(dropout), nn.Linear(32, 4)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, **(opt_kwargs or {}))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    x = torch.randn(8, 16, device="tpu")
    y = torch.randint(0, 4, (8,), device="tpu")
    return _steps(model, opt, x, y, steps, sched)[1]


@pytest.mark.parametrize("opt_kwargs", [{}, {"foreach": False}, {"fused": True}],
                         ids=["foreach", "forloop", "fused"])
def test_training_loop_one_flush_per_step_and_no_recompiles(opt_kwargs):
    stats = _train_loop(20, opt_kwargs)
    for s in stats[3:]:
        assert s["flushes"] == 1, s
        assert s["cache_misses"] == 0, s
        assert s["cache_hits"] == 1, s


def test_random_ops_in_a_loop_compile_once(compile_at_first_run):
    x = torch.ones(16, device="tpu")
    lazyrt.sync()
    _defer.clear_cache()  # it counts compiles: from an empty cache
    lazyrt.metrics.reset()
    outs = []
    for _ in range(10):
        r = torch.randn(16, device="tpu") + F.dropout(x, 0.5)
        outs.append(r.sum().item())
    c = _counters()
    assert c["cache_misses"] == 1 and c["cache_hits"] == 9
    assert len(set(outs)) == 10  # fresh randomness every step


def test_changing_python_scalars_compile_once(compile_at_first_run):
    x = torch.ones(16, device="tpu")
    lazyrt.sync()
    lazyrt.metrics.reset()
    for i in range(6):
        y = (x * (0.5 + i)).add(x, alpha=0.1 * i)
        assert y[0].item() == pytest.approx((0.5 + i) + 0.1 * i)
        if i == 0:
            lazyrt.metrics.reset()
    assert _counters()["cache_misses"] == 0


def test_donation_only_when_no_alias_reads_old_value(compile_at_first_run):
    p = torch.randn(1000, device="tpu")
    lazyrt.sync()
    p.mul_(2)
    lazyrt.sync()
    assert lazyrt.memory.flush_log()[-1].alias_bytes == 4000  # donated and reused
    keep = p.detach()  # an alias: shares storage, must see the update
    view = p[:10]
    p.add_(1)
    lazyrt.sync()
    torch.testing.assert_close(keep.cpu(), p.cpu())
    torch.testing.assert_close(view.cpu(), p.cpu()[:10])
    # an old value captured by another tensor is never donated away
    q = torch.randn(100, device="tpu")
    lazyrt.sync()
    snapshot = q.clone()
    lazyrt.sync()
    q.mul_(3)
    lazyrt.sync()
    torch.testing.assert_close(q.cpu(), snapshot.cpu() * 3)


@contextlib.contextmanager
def _cosh_fails_at_compile():
    """Within: ``cosh``'s lowering passes the abstract check at the op, then raises when
    a flush compiles it. Its plans are dropped on the way in and out."""
    from lazyrt._ops import resolve as _resolve

    entry = _resolve.resolve(torch.ops.aten.cosh.default)
    real = entry.fn
    calls = {"n": 0}

    def flaky(a):
        calls["n"] += 1
        if calls["n"] > 1:
            raise ValueError("lowering exploded")
        return real(a)

    entry.fn = flaky
    entry.plans.clear()
    try:
        yield
    finally:
        entry.fn = real
        entry.plans.clear()


def test_failing_flush_names_op_and_leaves_tensors_usable(compile_at_first_run):
    x = torch.randn(4, device="tpu")
    lazyrt.sync()
    good = x + 1
    with _cosh_fails_at_compile():
        bad = torch.cosh(x)
        with pytest.raises(RuntimeError, match=r"cosh.*lowering exploded") as ei:
            bad.cpu()
        assert "pending tensors are intact" in str(ei.value)
        assert _is_pending(bad) and _is_pending(good)
    # new work is unaffected, and a retry of the fixed trace works
    torch.testing.assert_close((x * 3).cpu(), x.cpu() * 3)
    torch.testing.assert_close(bad.cpu(), torch.cosh(x.cpu()))
    torch.testing.assert_close(good.cpu(), x.cpu() + 1)


def test_graph_and_hlo_inspection():
    x = torch.randn(4, 4, device="tpu")
    lazyrt.sync()
    y = torch.tanh(x @ x) + 1
    text = lazyrt.graph(y)
    assert "mm" in text and "tanh" in text and "(4, 4)" in text
    hlo = lazyrt.hlo(y)
    assert "stablehlo" in hlo or "mhlo" in hlo or "func.func" in hlo
    assert "tanh" in hlo
    assert _is_pending(y)  # inspection does not flush


def test_explain_recompile(capsys):
    prev = lazyrt.config.explain_recompile
    lazyrt.config.explain_recompile = True
    try:
        for n in (4, 4, 8, 4, 16):
            x = torch.ones(n, device="tpu")
            (x * 2).sum().item()
        err = capsys.readouterr().err
        assert "recompiling" in err and "closest cached trace" in err
        assert "16" in err
    finally:
        lazyrt.config.explain_recompile = prev


def test_threads_record_safely():
    errors = []

    def work(k):
        try:
            t = torch.full((64,), float(k), device="tpu")
            for _ in range(50):
                t = t * 1.0 + 1
            assert t.cpu().tolist() == [k + 50.0] * 64
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors


def test_strict_and_defer_agree_on_a_model():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.LazyLinear(5))
    m(torch.randn(2, 3, 8, 8))
    x = torch.randn(2, 3, 8, 8)
    outs = {}
    mt = None
    for mode in ("strict", "defer"):
        with lazyrt.set_mode(mode):
            mt = m.to("tpu") if mt is None else mt
            out = mt(x.to("tpu"))
            out.sum().backward()
            outs[mode] = (out.detach().cpu(), mt[0].weight.grad.cpu().clone())
            mt.zero_grad()
    torch.testing.assert_close(outs["strict"][0], outs["defer"][0])
    torch.testing.assert_close(outs["strict"][1], outs["defer"][1])
    gc.collect()


@pytest.mark.subprocess
def test_persistent_cache_dir(tmp_path):
    import os
    import subprocess
    import sys

    script = ("import torch, lazyrt; lazyrt.set_mode('defer'); x = torch.ones(64, device='tpu');"
              "print((x.sin() * 3).sum().item())")
    env = dict(os.environ, LAZYRT_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.split()[-1]) == pytest.approx(64 * 3 * 0.8414709848, rel=1e-5)
    assert any(tmp_path.iterdir())  # executables were written to the cache directory


def _mlp_steps(steps, window):
    """A small training loop (constant lr) with ``lazyrt.config.fusion_window = window``;
    returns the losses, the final parameters and each step's counters."""
    prev = lazyrt.config.fusion_window
    lazyrt.config.fusion_window = window
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(),
                              nn.Linear(32, 4)).to("tpu")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        x = torch.randn(8, 16).to("tpu")
        y = torch.randint(0, 4, (8,)).to("tpu")
        losses, stats = _steps(model, opt, x, y, steps)
        return losses, [p.detach().cpu() for p in model.parameters()], stats
    finally:
        lazyrt.config.fusion_window = prev


def test_fusion_window_cuts_each_step_at_the_same_places(compile_at_first_run):
    whole_losses, whole_params, whole = _mlp_steps(6, 0)
    losses, params, stats = _mlp_steps(6, 7)
    # the same step as one program: the first step already (the tensors moved to tpu
    # before the loop are not part of it)
    assert [s["flushes"] for s in whole] == [1] * 6
    assert whole[1]["cache_misses"] == 0
    # cut into segments of 7 ops: the same cuts every step, each segment a cache hit
    n = stats[1]["flushes"]
    assert n >= 3 and stats[1]["window_flushes"] == n - 1
    for s in stats[1:]:
        assert s["flushes"] == n and s["cache_misses"] == 0 and s["cache_hits"] == n, s
        assert s["max_trace_ops"] <= 7
    torch.testing.assert_close(losses, whole_losses, rtol=1e-5, atol=1e-6)
    for a, b in zip(params, whole_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_fusion_window_segment_failure_loses_nothing(compile_at_first_run):
    """A segment that fails to compile is not cut: recording goes on in the same trace
    and the error is raised at the sync point, as without a window."""
    x = torch.randn(4).to("tpu")
    prev = lazyrt.config.fusion_window
    lazyrt.config.fusion_window = 2
    try:
        with _cosh_fails_at_compile():
            a = torch.cosh(x)
            b = a + 1  # the window is full here: the cut fails, b is recorded all the same
            c = b * 2
            assert _counters()["window_cut_failures"] == 1
            assert _is_pending(a) and _is_pending(b) and _is_pending(c)
            with pytest.raises(RuntimeError, match=r"cosh.*lowering exploded") as ei:
                c.cpu()
            assert "pending tensors are intact" in str(ei.value)
    finally:
        lazyrt.config.fusion_window = prev
    ref = torch.cosh(x.cpu())
    torch.testing.assert_close(c.cpu(), (ref + 1) * 2)
    torch.testing.assert_close(a.cpu(), ref)


def test_host_to_device_transfers_record_nothing():
    lazyrt.sync()
    before = _counters()["pending_ops"]
    src = torch.randn(3, 5)
    a = src.to("tpu")
    b = torch.tensor([[1, 2], [3, 4]], device="tpu")
    c = src.t().to("tpu")  # a non-contiguous CPU source
    assert _counters()["pending_ops"] == before == 0
    assert not _is_pending(a) and not _is_pending(b)
    torch.testing.assert_close(a.cpu(), src)
    torch.testing.assert_close(c.cpu(), src.t())
    assert c.stride() == src.t().stride()
    assert b.dtype == torch.int64 and b.cpu().tolist() == [[1, 2], [3, 4]]
    # a copy into part of a tensor, or with a cast, is still an op of the trace
    z = torch.zeros(4, 5, device="tpu")
    lazyrt.sync()
    z[1:].copy_(torch.ones(3, 5))
    w = torch.zeros(2, device="tpu", dtype=torch.float64)
    w.copy_(torch.tensor([1, 2]))
    assert _counters()["pending_ops"] >= 2
    expect = torch.zeros(4, 5)
    expect[1:] = 1
    torch.testing.assert_close(z.cpu(), expect)
    assert w.cpu().tolist() == [1.0, 2.0] and w.dtype == torch.float64
    # views of a tensor overwritten whole from the host see the new values
    v = z[0]
    z.copy_(torch.full((4, 5), 7.0))
    assert v.cpu().tolist() == [7.0] * 5


def test_reading_a_view_records_nothing():
    # ``.cpu()`` of a view derives it with a strict execution; a view node left in the
    # pending trace would make the next flush a different program (one more compile)
    with lazyrt.set_mode("defer"):
        x = torch.arange(12.0).reshape(3, 4).to("tpu")
        lazyrt.sync()
        y = (x * 2)[:, 1:]
        assert torch.equal(y.cpu(), (torch.arange(12.0).reshape(3, 4) * 2)[:, 1:])
        assert _defer.pending_count() == 0
        t = x.t()
        assert torch.equal(t.cpu(), torch.arange(12.0).reshape(3, 4).t())
        assert _defer.pending_count() == 0

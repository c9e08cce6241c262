"""The core's guarantees: verified defer cache hits, bounded caches, one invalidation
path, views on the common execution path, readable trace text, op coverage names."""
from __future__ import annotations

import pytest
import torch

import lazyrt
from lazyrt._base import memory
from lazyrt._base.config import config
from lazyrt._exec import defer as _defer
from lazyrt._exec import exes as _exes
from lazyrt._exec import strict as _strict
from lazyrt._exec import views as _views
from lazyrt._ops import plan as _plan
from lazyrt._ops import resolve as _resolve
from lazyrt.lowering._registry import LOWERINGS


@pytest.fixture
def defer():
    with lazyrt.set_mode("defer"):
        yield
        lazyrt.sync()


# ---- defer cache hits are checked against the trace ----------------------------------------


def test_colliding_traces_never_share_an_executable(defer, monkeypatch, compile_at_first_run):
    """Force trace B onto trace A's structure hash (same length, outputs, donation): the
    cache must not run A's executable for B."""
    monkeypatch.setattr(_defer, "structure_hash", lambda tr: 12345)  # every trace collides
    x = torch.arange(6.0, device="tpu")
    lazyrt.sync()
    a = x * 2 + 1  # trace A: mul, add
    tr_a = _defer.current()
    lazyrt.sync()
    torch.testing.assert_close(a.cpu(), torch.arange(6.0) * 2 + 1)
    misses = lazyrt.metrics.counters()["cache_misses"]

    b = x * 3 - 5  # trace B: same shape of trace (2 ops, one leaf, one output)
    tr_b = _defer.current()
    assert tr_b is not tr_a and len(tr_b.nodes) == len(tr_a.nodes)
    collisions = lazyrt.metrics.counters()["hash_collisions"]
    torch.testing.assert_close(b.cpu(), torch.arange(6.0) * 3 - 5)
    c = lazyrt.metrics.counters()
    assert c["hash_collisions"] == collisions + 1
    assert c["cache_misses"] == misses + 1  # B compiled its own executable
    # both stay cached under the one key, each found for its own trace
    a2 = x * 2 + 1
    b2 = x * 3 - 5
    lazyrt.sync()
    torch.testing.assert_close(a2.cpu(), torch.arange(6.0) * 2 + 1)
    torch.testing.assert_close(b2.cpu(), torch.arange(6.0) * 3 - 5)


def test_a_cache_hit_needs_the_same_leaf_avals(defer, compile_at_first_run):
    x = torch.ones(4, device="tpu")
    y = torch.ones(4, dtype=torch.float64, device="tpu")
    lazyrt.sync()
    exe_checks = []
    r1 = x.sum()
    tr = _defer.current()
    lazyrt.sync()
    key_exe = [e for e in _exes.all_exes() if e.leaf_avals == tr.leaf_avals]
    exe_checks.append(bool(key_exe))
    r2 = y.sum()
    tr2 = _defer.current()
    assert not key_exe[0].matches(tr2)
    lazyrt.sync()
    assert r1.item() == 4.0 and r2.item() == 4.0 and r2.dtype == torch.float64
    assert all(exe_checks)


# ---- bounded caches ---------------------------------------------------------------------------


def test_strict_executables_and_plans_stay_bounded(monkeypatch):
    monkeypatch.setattr(config, "strict_cache_size", 8)
    monkeypatch.setattr(config, "plan_cache_size", 5)
    # NOTE: the bounds apply from the next insertion on: start from empty caches, or a
    # cache filled by earlier tests whose entries this loop hits stays above them.
    _views.clear()
    for op in (torch.ops.aten.exp.default, torch.ops.aten.mul.Tensor):
        _resolve.resolve(op).plans.clear()
    with lazyrt.set_mode("strict"):
        for n in range(1, 30):
            x = torch.ones(n, device="tpu")
            y = (x * 2).exp()
            v = x.view(n, 1)[:, 0]  # a view chain, materialized on its own below
            v.add_(1)  # a write through the view
            assert y.cpu()[0] == pytest.approx(7.389056, rel=1e-5)
            assert x.cpu()[0] == 2.0
            assert _strict.cache_info()["executables"] <= 8
            assert len(_resolve.resolve(torch.ops.aten.exp.default).plans) <= 5
            assert len(_resolve.resolve(torch.ops.aten.mul.Tensor).plans) <= 5
            info = _views.cache_info()
            assert info["view_programs"] <= 5 and info["write_programs"] <= 5


def test_evicted_executable_recompiles_and_still_agrees(monkeypatch):
    monkeypatch.setattr(config, "strict_cache_size", 2)
    with lazyrt.set_mode("strict"):
        x = torch.arange(5.0, device="tpu")
        first = (x.sin() + x.cos()).cpu()
        for n in (2, 3, 4):
            torch.ones(n, device="tpu").tanh().cpu()
        again = (x.sin() + x.cos()).cpu()
    torch.testing.assert_close(first, again)
    torch.testing.assert_close(first, torch.arange(5.0).sin() + torch.arange(5.0).cos())


# ---- one invalidation path -------------------------------------------------------------------


def test_matmul_precision_change_flushes_pending_work_first(defer):
    prev = torch.get_float32_matmul_precision()
    a = torch.randn(64, 64, device="tpu")
    b = torch.randn(64, 64, device="tpu")
    lazyrt.sync()
    flushes = lazyrt.metrics.counters()["flushes"]
    try:
        torch.set_float32_matmul_precision("highest")
        c = a @ b  # recorded under "highest"
        torch.set_float32_matmul_precision("medium")
        # the change flushed c's trace, so it was traced at full precision
        assert lazyrt.metrics.counters()["flushes"] == flushes + 1
        assert torch.get_float32_matmul_precision() == "medium"
        ref = a.cpu().double() @ b.cpu().double()
        err = (c.cpu().double() - ref).abs().max().item()
        assert err < 1e-3
    finally:
        torch.set_float32_matmul_precision(prev)


def test_pallas_policy_change_flushes_pending_work_first(defer):
    prev = lazyrt.config.pallas
    x = torch.ones(4, 4, device="tpu")
    lazyrt.sync()
    y = x @ x
    try:
        lazyrt.set_pallas("off" if prev != "off" else "auto")
        assert lazyrt.metrics.counters()["pending_ops"] == 0
    finally:
        lazyrt.set_pallas(prev)
    assert y.cpu()[0, 0] == 4.0


# ---- views run like every other op ------------------------------------------------------------


def test_view_materialized_alone_goes_through_the_strict_executor(defer):
    """A live view read after its base was flushed is derived by ``_strict.run``, the
    path every op takes (logged, counted, debug-checked)."""
    base = torch.arange(12.0, device="tpu").reshape(3, 4)
    lazyrt.sync()
    base.mul_(2)
    v = base.t()[1]  # a view chain on a pending base
    memory.LOG_STRICT[0] = True
    try:
        memory.clear_log()
        got = v.cpu()
        names = [r.name for r in memory.flush_log()]
    finally:
        memory.LOG_STRICT[0] = False
    torch.testing.assert_close(got, (torch.arange(12.0).reshape(3, 4) * 2).t()[1])
    assert "view" in names


def test_debug_mode_checks_view_execution():
    with lazyrt.set_mode("debug"):
        x = torch.tensor([[1.0, float("inf")], [2.0, 3.0]], device="tpu")
        # reading a view of an input that has an Inf is not an error
        assert x.t()[1].cpu().tolist() == [float("inf"), 3.0]
        with pytest.raises(FloatingPointError, match=r"aten\.div\.Tensor produced"):
            torch.zeros(2, device="tpu") / torch.zeros(2, device="tpu")


# ---- readable text -----------------------------------------------------------------------------


def test_explain_recompile_shows_view_arguments_readably(defer, capsys):
    prev = lazyrt.config.explain_recompile
    lazyrt.config.explain_recompile = True
    try:
        w = torch.ones(4, 4, device="tpu")
        lazyrt.sync()
        for fn in (lambda: w.t() @ w, lambda: w.t() @ w, lambda: w[1:] @ w, lambda: w.t() @ w,
                   lambda: w[:, :2].sum()):
            fn().cpu()
        err = capsys.readouterr().err
    finally:
        lazyrt.config.explain_recompile = prev
    assert "recompiling" in err
    assert "object at 0x" not in err
    assert "<view " in err


def test_graph_text_names_ops_and_inputs(defer):
    x = torch.ones(3, 2, device="tpu")
    lazyrt.sync()
    y = (x.t() * 2).sum(0)
    text = lazyrt.graph(y)
    assert "in0: (3, 2) float32" in text
    assert "mul[<view t()>" in text and "sum" in text


# ---- op coverage says which function lowers an op ---------------------------------------------


@pytest.mark.parametrize("op,fn_name,path", [
    ("aten.exp.default", "exp", "lowering/pointwise.py"),
    ("aten.eq.Tensor", "eq", "lowering/pointwise.py"),
    ("aten._foreach_add.List", "_foreach_add", "lowering/foreach.py"),
    ("aten.upsample_nearest2d_backward.default", "upsample_nearest2d_backward",
     "lowering/nn.py"),
    ("aten.special_airy_ai.default", "airy_ai", "lowering/special.py"),
    ("aten.copy_.default", "copy_", "_ops/special.py"),
])
def test_coverage_names_the_lowering(op, fn_name, path):
    c = lazyrt.coverage(op)
    assert c.status in ("lowered", "special")
    assert f".{fn_name} (" in c.by and path in c.by


def test_every_lowering_has_a_findable_name():
    generic = {"fn", "lowering", "both", "_unary", "_cmp", "_fe", "_fu", "wrapper", "inner"}
    bad = [str(op) for op, low in LOWERINGS.items() if low.fn.__name__ in generic]
    assert bad == []


def test_coverage_agrees_with_the_dispatcher():
    for name in ("aten.nonzero.out", "aten.masked_select.out", "aten.add_.Tensor",
                 "aten.squeeze_.default", "aten.mm.default", "aten.index.Tensor"):
        op = lazyrt._ops.coverage._op_of(name)
        assert lazyrt.coverage(name).how == _resolve.resolve(op).resolution.how


# ---- ops --------------------------------------------------------------------------------------


def test_vdot_conjugates_its_first_argument(mode):
    a = torch.tensor([1 + 2j, 3 - 1j, -2j], dtype=torch.complex64)
    b = torch.tensor([2 - 1j, 1j, 4 + 4j], dtype=torch.complex64)
    got = torch.vdot(a.to("tpu"), b.to("tpu")).cpu()
    torch.testing.assert_close(got, torch.vdot(a, b))
    torch.testing.assert_close(torch.dot(a.to("tpu"), b.to("tpu")).cpu(), torch.dot(a, b))


def test_plan_cache_eviction_keeps_recent_plans():
    plans: dict = {}
    limit = config.plan_cache_size
    for k in range(limit + 3):
        _plan.remember(plans, k, object())
    assert len(plans) == limit and (limit + 2) in plans and 0 not in plans


def test_a_tpu_copy_never_aliases_the_cpu_tensor(mode):
    c = torch.zeros(4096)
    t = c.to("tpu")
    c.add_(1)  # an in-place write to the CPU source after the copy
    u = torch.tensor([1.0, 2.0]).to("tpu") * 1
    assert t.cpu().abs().sum().item() == 0.0
    assert u.cpu().tolist() == [1.0, 2.0]

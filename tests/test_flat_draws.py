"""Cold random draws of a new shape made by a flat draw of a bucketed length
(``lazyrt._exec.flatdraw``): bit for bit the draw of that shape's own program, one
compile per length."""
import pytest
import torch

import lazyrt
from lazyrt._exec import consts, flatdraw
from lazyrt._ops import control

SHAPES = [(5, 7), (2, 3, 4), (65,), (0, 4)]
F32, F64, BF16, F16, C64 = torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.complex64


def _draws(gen=None):
    """Draws of several shapes and dtypes, each read at once (in defer, each its own trace:
    a cold one runs op by op, through strict's programs)."""
    out = []
    torch.manual_seed(0)
    for sh in SHAPES:
        for dt in (F32, F64, BF16, C64):
            out.append(torch.randn(*sh, dtype=dt, device="tpu", generator=gen).cpu())
        for dt in (F32, F16):
            out.append(torch.rand(*sh, dtype=dt, device="tpu").cpu())
        for dt in (F32, F64, C64):
            out.append(torch.empty(sh, dtype=dt, device="tpu").uniform_(-3, 7).cpu())
        for dt in (F32, BF16):
            out.append(torch.empty(sh, dtype=dt, device="tpu").normal_(2, 3).cpu())
        for dt in (torch.int64, torch.uint8):
            out.append(torch.randint(0, 100, sh, dtype=dt, device="tpu").cpu())
        out.append(torch.normal(1.0, 2.0, sh, device="tpu").cpu())
        if sh != SHAPES[0]:
            continue  # the other draws, one shape (each compiles its own program below)
        e = torch.empty(sh, device="tpu")
        for t in (e.clone().bernoulli_(0.3), e.clone().exponential_(2.0), e.clone().geometric_(0.2),
                  e.clone().log_normal_(), e.clone().cauchy_(), torch.rand_like(e),
                  torch.randn_like(e), torch.randint_like(e, 7), torch.randint_like(e, -3, 7),
                  torch.empty(sh, dtype=torch.int32, device="tpu").random_(),
                  torch.empty(sh, dtype=torch.int64, device="tpu").random_(9),
                  torch.empty(sh, dtype=F64, device="tpu").random_(-4, 1000)):
            out.append(t.cpu())
    return out


@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_flat_draws_equal_each_shapes_own_program(mode, monkeypatch):
    control.invalidate_compiled()
    lazyrt.metrics.reset()
    with lazyrt.set_mode(mode):
        flat = _draws(torch.Generator(device="tpu").manual_seed(5))
        assert lazyrt.metrics.counters()["flat_draws"] > 0
        # every draw compiled at its first run (no flat draws, no host runs)
        monkeypatch.setattr(consts, "COLD_ENABLED", False)
        control.invalidate_compiled()
        lazyrt.metrics.reset()
        own = _draws(torch.Generator(device="tpu").manual_seed(5))
        assert lazyrt.metrics.counters()["flat_draws"] == 0
    assert len(flat) == len(own)
    for a, b in zip(flat, own):
        assert (a.dtype, a.shape) == (b.dtype, b.shape)
        if a.is_complex():
            a, b = torch.view_as_real(a), torch.view_as_real(b)
        assert torch.equal(a, b)


def test_one_compile_per_length_and_the_fifth_call_compiles_its_own(monkeypatch):
    """Strict (defer's cold flushes run these programs too, and compile a trace's own at
    its 5th flush: ``test_cold_flush.py``)."""
    monkeypatch.setattr(consts, "COLD_SECONDS", 1e9)  # calls decide, not the load
    control.invalidate_compiled()
    lazyrt.metrics.reset()
    cpu = []
    torch.manual_seed(3)
    for sh in [(3, 5), (5, 3), (15,), (2, 2, 2), (40,), (8, 8)]:  # all within 64 elements
        cpu.append(torch.randn(sh, device="tpu").cpu())
    c = lazyrt.metrics.counters()
    assert c["flat_draws"] == 6
    assert c["compiles_by_op"] == {"randn": 1}
    assert all(t.isfinite().all() for t in cpu) and len({t.sum().item() for t in cpu}) == 6
    for _ in range(consts.COLD_CALLS + 3):
        torch.randn(4, 9, device="tpu").cpu()
    c = lazyrt.metrics.counters()
    assert c["flat_draws"] == 6 + consts.COLD_CALLS
    assert c["compiles_by_op"] == {"randn": 2}  # (4, 9)'s own program, at its 5th call


def test_a_draw_into_a_view_is_right():
    torch.manual_seed(1)
    z = torch.empty(6, 5, dtype=torch.complex64, device="tpu")
    torch.view_as_real(z).uniform_(-1, 1)
    r = torch.view_as_real(z.cpu())
    assert r.shape == (6, 5, 2) and (r >= -1).all() and (r < 1).all()
    assert len(torch.unique(r)) > 50


def test_off_draws_compile_each_shape(monkeypatch):
    monkeypatch.setattr(flatdraw, "ENABLED", False)
    control.invalidate_compiled()
    lazyrt.metrics.reset()
    for sh in [(3, 5), (5, 3)]:
        torch.randn(sh, device="tpu").cpu()
    c = lazyrt.metrics.counters()
    assert c["flat_draws"] == 0 and c["compiles_by_op"] == {"randn": 2}

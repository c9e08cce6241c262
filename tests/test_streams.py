"""``torch.tpu.synchronize`` / streams / events wait for real work (and time it)."""
import time

import pytest
import torch
import torch.nn.functional as F

import lazyrt
from lazyrt._exec.values import concrete

pytestmark = pytest.mark.sweep(every=2)


def _attention_step(q, k, v):
    for t in (q, k, v):
        t.grad = None
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    (o * o).mean().backward()


@pytest.mark.parametrize("wait", ["synchronize", "accelerator", "lazyrt.sync", "stream",
                                  "event"])
def test_synchronize_waits_for_every_live_value(mode, wait):
    # An SDPA backward dispatched before the sync: XLA:CPU runs a fresh computation beside
    # it, so waiting on one (lazyrt's old barrier) returned with the gradients unfinished
    # on every try of this loop.
    torch.manual_seed(0)
    q, k, v = (torch.randn(8, 4, 128, 64, device="tpu").requires_grad_() for _ in range(3))
    for _ in range(5):
        _attention_step(q, k, v)
        if wait == "synchronize":
            torch.tpu.synchronize()
        elif wait == "accelerator":
            torch.accelerator.synchronize()
        elif wait == "lazyrt.sync":
            lazyrt.sync()
        elif wait == "stream":
            torch.tpu.current_stream().synchronize()
        else:
            ev = torch.tpu.Event()
            ev.record()
            ev.synchronize()
        grads = [concrete(t.grad) for t in (q, k, v)]
        assert all(g.is_ready() for g in grads)
        assert torch.tpu.current_stream().query()


def test_query_is_false_while_work_is_pending_in_defer():
    with lazyrt.set_mode("defer"):
        x = torch.randn(4, 4, device="tpu")
        lazyrt.sync()
        y = x * 2
        assert not torch.tpu.current_stream().query()
        ev = torch.tpu.Event()
        ev.record()
        assert not ev.query()
        ev.synchronize()
        assert torch.tpu.current_stream().query()
        torch.testing.assert_close(y.cpu(), x.cpu() * 2)


def test_event_elapsed_time_measures_the_work_between(mode):
    x = torch.randn(512, 512, device="tpu")
    y = x @ x
    lazyrt.sync()  # compiled and warm
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    for _ in range(20):
        y = torch.tanh(y @ x) / 512
    end.record()
    wall = (time.perf_counter() - t0) * 1e3
    end.synchronize()
    ms = start.elapsed_time(end)
    assert concrete(y).is_ready()
    # the host clock read after the work finished, within the caller's own wall time
    assert 0.0 < ms <= wall + 1.0


def test_event_elapsed_time_errors_are_pytorchs():
    timed = torch.tpu.Event(enable_timing=True)
    timed.record()
    with pytest.raises(ValueError, match="created with argument 'enable_timing=True'"):
        torch.tpu.Event().elapsed_time(timed)
    with pytest.raises(ValueError, match="created with argument 'enable_timing=True'"):
        timed.elapsed_time(torch.tpu.Event())
    with pytest.raises(ValueError, match="must be recorded before calculating elapsed time"):
        torch.tpu.Event(enable_timing=True).elapsed_time(timed)
    with pytest.raises(ValueError, match="must be recorded before calculating elapsed time"):
        timed.elapsed_time(torch.tpu.Event(enable_timing=True))

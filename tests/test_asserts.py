"""``torch._assert_async`` on tpu: the condition stays on the device and is read at the
next sync point (debug mode: at the op), raising PyTorch's own error, eager and compiled."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import lazyrt

aten = torch.ops.aten
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cpu_error(fn, *args) -> str:
    with pytest.raises(RuntimeError) as ei:
        fn(*args)
    return str(ei.value)


def _assert_msg(x):
    torch._assert_async(torch.all(x < 0), "x has positive values")


def _assert_default(x):
    torch._assert_async(x.sum() - x.sum())


def _functional(x):
    return aten._functional_assert_async.msg(torch.all(x < 0), "functional", torch.ones(2, device=x.device))


@pytest.mark.parametrize("fn", [_assert_msg, _assert_default, _functional])
def test_failed_assert_raises_at_the_next_sync(mode, fn):
    x = torch.arange(1.0, 4.0)
    expected = _cpu_error(fn, x)
    t = x.to("tpu")
    fn(t)  # no sync, no error yet
    y = t * 2
    with pytest.raises(RuntimeError) as ei:
        y.sum().item()
    msg = str(ei.value)
    assert msg.splitlines()[0] == expected
    assert "aten._" in msg and "test_asserts.py" in msg  # the op and the user's line
    assert y.sum().item() == 12.0  # read once: the next sync is clean


def test_passing_asserts_and_what_functional_returns(mode):
    t = torch.arange(1.0, 4.0, device="tpu")
    torch._assert_async(torch.all(t > 0), "never")
    torch._assert_async(t[0])
    token = torch.arange(3.0, device="tpu")
    out = aten._functional_assert_async.msg(torch.all(t > 0), "never", token)
    lazyrt.sync()
    assert torch.equal(out.cpu(), torch.arange(3.0))
    token.add_(1)  # a copy, as on the CPU
    assert torch.equal(out.cpu(), torch.arange(3.0))


@pytest.mark.parametrize("n", [0, 2])
def test_element_count_checked_at_the_op(mode, n):
    expected = _cpu_error(torch._assert_async, torch.ones(n), "m")
    with pytest.raises(RuntimeError) as ei:
        torch._assert_async(torch.ones(n, device="tpu"), "m")
    assert str(ei.value) == expected


def test_sync_raises_the_first_and_counts_the_rest(mode):
    t = torch.zeros(3, device="tpu")
    torch._assert_async(t[0], "first")
    torch._assert_async(t[1] + 1, "passes")
    torch._assert_async(t[2], "third")
    with pytest.raises(RuntimeError, match="1 more asynchronous assert") as ei:
        lazyrt.sync()
    assert str(ei.value).startswith("first\n")


def test_condition_is_a_snapshot(mode):
    """A later in-place write does not change what the assert checks."""
    t = torch.zeros(1, device="tpu")
    torch._assert_async(t, "zero at the assert")
    t.fill_(1)
    with pytest.raises(RuntimeError, match="zero at the assert"):
        t.item()


def test_debug_mode_raises_at_the_op():
    t = torch.arange(3.0, device="tpu")
    expected = _cpu_error(_assert_msg, torch.arange(3.0))
    with lazyrt.set_mode("debug"):
        with pytest.raises(RuntimeError) as ei:
            _assert_msg(t)
    assert str(ei.value).splitlines()[0] == expected
    assert "debug mode" in str(ei.value)


def test_a_fusion_window_segment_is_no_sync_point(monkeypatch):
    """A segment runs asynchronously: its asserts are read at the next real sync."""
    monkeypatch.setattr(lazyrt.config, "fusion_window", 4)
    with lazyrt.set_mode("defer"):
        t = torch.arange(3.0, device="tpu")
        torch._assert_async(t[0], "in a segment")
        for _ in range(10):
            t = t + 1
        with pytest.raises(RuntimeError, match="in a segment"):
            lazyrt.sync()


def test_compiled_assert_is_part_of_the_program(mode):
    def f(x, lim):
        torch._assert_async(torch.all(x < lim), "x too big")
        return x * 2

    cf = torch.compile(f, backend="tpu")
    x = torch.arange(3.0)
    expected = _cpu_error(f, x, 0)
    before = lazyrt.metrics.counters().get("compiled_eager_calls", 0)
    t = x.to("tpu")
    assert torch.equal(cf(t, 5).cpu(), x * 2)
    y = cf(t, 0)
    assert lazyrt.metrics.counters().get("compiled_eager_calls", 0) == before
    with pytest.raises(RuntimeError) as ei:
        y.cpu()
    assert str(ei.value).splitlines()[0] == expected


@pytest.mark.subprocess
@pytest.mark.parametrize("mode_name", ["strict", "defer"])
def test_an_assert_no_sync_read_is_reported_at_exit(mode_name):
    code = ("import torch, lazyrt\n"
            "t = torch.zeros(1, device='tpu')\n"
            "torch._assert_async(t, 'never read')\n")
    env = dict(os.environ, TORCH_TPU_MODE=mode_name, JAX_PLATFORMS="cpu",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=300)
    assert "lazyrt: at exit: RuntimeError: never read" in r.stderr, r.stderr[-2000:]

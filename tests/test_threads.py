"""Several threads using tpu tensors at once, in defer mode: recording, in-place writes
(through views too), syncs from any thread. The rule (docs/modes.md, Threads): one pending
trace per process, one lock; every op is atomic with respect to flushes."""
from __future__ import annotations

import os
import sys
import threading
import time

import pytest
import torch

import lazyrt


def _stress(rounds: int, n_threads: int, steps: int) -> list:
    errors: list = []
    barrier = threading.Barrier(n_threads)

    def work(k: int) -> None:
        try:
            barrier.wait(timeout=60)
            t = torch.full((33,), float(k), device="tpu")
            acc = torch.zeros(1, device="tpu")
            tail = t[1:]  # a view: writes through it scatter into t
            for i in range(steps):
                t.mul_(1.0).add_(1)
                tail.add_(0.5)
                acc += t[:1].sum()
                if (i + k) % 5 == 0:
                    lazyrt.sync()
            head = k + steps
            got = t.cpu().tolist()
            want = [float(head)] + [head + 0.5 * steps] * 32
            if got != want:
                errors.append(f"thread {k}: t = {got[:2]}..., expected {want[:2]}...")
            # acc = sum over i of t[0] after step i = sum(k + i + 1)
            want_acc = float(sum(k + i + 1 for i in range(steps)))
            if acc.item() != want_acc:
                errors.append(f"thread {k}: acc = {acc.item()}, expected {want_acc}")
        except Exception as e:
            errors.append(f"thread {k}: {type(e).__name__}: {e}")

    # NOTE: switch threads every few microseconds (CPython's default is 5 ms), so the
    # interleavings a busy machine produces now and then happen in every round.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        _rounds(work, rounds, n_threads)
    finally:
        sys.setswitchinterval(interval)
    return errors


def _rounds(work, rounds: int, n_threads: int) -> None:
    with lazyrt.set_mode("defer"):
        for _ in range(rounds):
            threads = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(timeout=300)
                assert not th.is_alive(), "a recording thread hung"
        lazyrt.sync()


def test_threads_record_write_and_sync_safely():
    assert _stress(rounds=4, n_threads=4, steps=10) == []


@pytest.mark.slow
def test_threads_stress_long():
    rounds = int(os.environ.get("LAZYRT_STRESS_ROUNDS", "40"))
    assert _stress(rounds=rounds, n_threads=8, steps=20) == []


def test_strict_threads_keep_memory_accounting_exact():
    """Strict mode: threads running ops at once leave the live-byte count exact."""
    lazyrt.sync()
    base = lazyrt.memory.live_bytes()

    def work():
        for _ in range(200):
            x = torch.ones(256, device="tpu")
            y = (x * 2 + 1).sum()
            del x, y

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    lazyrt.sync()
    assert lazyrt.memory.live_bytes() == base


def test_two_threads_each_get_their_own_backward_error():
    """An op that raises inside ``backward()`` is held until ``backward()`` returns
    (PyTorch would abort the process otherwise); with two threads in ``backward()`` at
    once, each gets the error of its own backward, and neither loses it. Both backwards
    run on autograd's one tpu device thread: B's backward waits there until A has
    entered ``backward()`` (whose start used to clear every held error)."""
    a_entered = threading.Event()

    class Fails(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k):
            ctx.k = k
            return x * 1

        @staticmethod
        def backward(ctx, g):
            # a shape error naming this thread's size: (2,) @ (k,)
            torch.ones(2, device="tpu") @ torch.ones(ctx.k, device="tpu")
            if ctx.k == 3:  # thread B: hold the device thread until A has started
                a_entered.wait(timeout=30)
                time.sleep(0.2)
            return g, None

    results: dict = {}

    def run(k: int) -> None:
        x = torch.ones(2, device="tpu", requires_grad=True)
        y = Fails.apply(x, k).sum()
        if k == 5:
            b_started.wait(timeout=30)
            a_entered.set()
        try:
            y.backward()
            results[k] = None
        except RuntimeError as e:
            results[k] = str(e)

    for _ in range(3):
        a_entered.clear()
        b_started = threading.Event()
        results.clear()
        tb = threading.Thread(target=run, args=(3,))
        ta = threading.Thread(target=run, args=(5,))
        tb.start()
        time.sleep(0.05)
        b_started.set()
        ta.start()
        tb.join(60)
        ta.join(60)
        assert results[3] is not None and "src [3]" in results[3], results
        assert results[5] is not None and "src [5]" in results[5], results


@pytest.mark.subprocess
def test_fused_collectives_from_one_thread_while_another_records_and_syncs():
    """The c10d path (a fused all_reduce: record, then write its result) takes the
    pending trace's lock like any op, so another thread's flush never splits it
    (2 ranks, defer, fused collectives; tests/dist_worker.py::fused_threads)."""
    from _dist_launch import check_items, launch

    res = launch(["fused_threads"], timeout=240)
    check_items(res)


def test_mode_switches_in_one_thread_while_another_runs_ops():
    """An op runs in the mode it started in: one thread switches strict <-> defer while
    another runs in-place ops and reads; no op records into the pending trace without
    its lock (which raised an internal error), and every value is right."""
    errors: list = []
    stop = threading.Event()

    def switch() -> None:
        try:
            while not stop.is_set():
                with lazyrt.set_mode("defer"):
                    time.sleep(1e-4)
                time.sleep(1e-4)
        except Exception as e:
            errors.append(f"switcher: {type(e).__name__}: {e}")

    def ops() -> None:
        try:
            t = torch.zeros(8, device="tpu")
            for i in range(1000):
                t.add_(1).mul_(1.0)
                if i % 100 == 99 and t.cpu().tolist() != [float(i + 1)] * 8:
                    errors.append(f"step {i}: {t.cpu().tolist()}")
        except Exception as e:
            errors.append(f"ops: {type(e).__name__}: {e}")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        sw, op = threading.Thread(target=switch), threading.Thread(target=ops)
        sw.start()
        op.start()
        op.join(timeout=300)
        stop.set()
        sw.join(timeout=60)
    finally:
        sys.setswitchinterval(interval)
    assert not op.is_alive() and not sw.is_alive()
    assert errors == []

"""defer's loop cut (``config.loop_cut``): a Python loop of small ops is recorded in
segments, each one program, with the values of one fused trace (checked against CPU)."""
from __future__ import annotations

import torch
from _util import assert_close

import lazyrt


def test_row_loop_is_cut_into_repeating_segments():
    lazyrt.config.mode, old = "defer", lazyrt.config.mode
    try:
        c = torch.randn(300, 8)
        x = c.to("tpu")
        lazyrt.metrics.reset()
        rows = [torch.cos(s) * 2 for s in x]  # period 3: select, cos, mul
        out = torch.stack(rows)
        n = lazyrt.metrics.counters()
        assert_close(out, torch.stack([torch.cos(s) * 2 for s in c]))
        assert n["window_flushes"] >= 3  # 900 ops in segments of about 64
        assert n["max_trace_ops"] < 100
        assert n["cache_misses"] <= 4  # the first segment, the steady one, the rest
    finally:
        lazyrt.config.mode = old


def test_loop_cut_off_keeps_one_trace():
    lazyrt.config.mode, old = "defer", lazyrt.config.mode
    lazyrt.config.loop_cut, old_cut = 0, lazyrt.config.loop_cut
    try:
        c = torch.randn(100, 4)
        x = c.to("tpu")
        lazyrt.metrics.reset()
        out = torch.stack([s + 1 for s in x])
        assert_close(out, c + 1)
        assert lazyrt.metrics.counters()["window_flushes"] == 0
    finally:
        lazyrt.config.mode, lazyrt.config.loop_cut = old, old_cut

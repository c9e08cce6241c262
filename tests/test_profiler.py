"""``torch.profiler`` around tpu work: lazyrt's ranges in ``key_averages()``, a device track
and lazyrt's args in the exported Chrome trace, ``schedule`` + ``tensorboard_trace_handler``,
memory events with ``profile_memory=True`` (docs/profiling.md)."""
from __future__ import annotations

import gzip
import json
import os

import pytest
import torch
from _util import assert_close
from conftest import MODES
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

import lazyrt
from lazyrt import mem as _mem
from lazyrt._base import memory as _memory
from lazyrt._base.config import config
from lazyrt._exec import profile as _profile
from lazyrt._memcli import profiler_trace
from lazyrt._torch import profiler as _tprof

DEVICE_PID = _tprof.DEVICE_PID


def _work(x, w):
    """Three ops and a host read: one flush in defer mode (its ops recorded here)."""
    y = (x + 1.0) * w  # RECORDED-HERE
    z = y @ w
    return z, z.sum().item()


def _inputs(n=8):
    x = torch.arange(n * n, dtype=torch.float32).reshape(n, n) / 10
    w = torch.full((n, n), 0.5)
    return x, w


def _names(prof) -> dict:
    return {e.key: e.count for e in prof.key_averages()}


@pytest.mark.parametrize("mode", MODES)
def test_ranges_in_key_averages(mode, compile_at_first_run):
    """Strict: each op's execution is a ``lazyrt::op[NAME]`` range; defer: each flush is a
    ``lazyrt::flush[N ops, hit|miss]`` range, with the compile (a miss) and the
    execution nested; the host read is ``lazyrt::to_host``. The results are CPU eager's."""
    x, w = _inputs(8)
    ref = _work(x, w)
    with lazyrt.set_mode(mode):
        tx, tw = x.to("tpu"), w.to("tpu")
        _work(tx, tw)  # compiled before the profiler
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            got = [_work(tx, tw) for _ in range(2)]
            new = _work(*(t.to("tpu") for t in _inputs(6)))  # new shapes: compiles
    for z, s in got:
        assert_close(z.cpu(), ref[0])
        assert s == pytest.approx(ref[1], rel=1e-5)
    assert_close(new[0].cpu(), _work(*_inputs(6))[0])
    names = _names(prof)
    assert names["lazyrt::to_host"] == 3
    assert names["lazyrt::to_device"] == 2
    assert names["lazyrt::compile"] >= 1
    if mode == "strict":
        assert names["lazyrt::op[add]"] == 3
        assert names["lazyrt::op[mul]"] == 3
        assert names["lazyrt::op[mm]"] == 3
        assert not any(k.startswith("lazyrt::flush") for k in names)
    else:
        flushes = {k: n for k, n in names.items() if k.startswith("lazyrt::flush")}
        hit = [k for k in flushes if k.startswith("lazyrt::flush[4 ops, hit]")]
        miss = [k for k in flushes if k.startswith("lazyrt::flush[4 ops, miss]")]
        assert len(hit) == 1 and flushes[hit[0]] == 2, flushes
        assert len(miss) == 1 and flushes[miss[0]] == 1, flushes
        assert names["lazyrt::execute"] == 3
        assert not any(k.startswith("lazyrt::op[") for k in names)
    # off again: nothing of the profiler is left on
    assert not _profile.ACTIVE[0] and _memory.EVENTS is None
    assert not config.record_source and not _memory.LOG_STRICT[0]


def _line(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, s in enumerate(f, 1) if s.rstrip().endswith(marker))


def test_flush_range_names_the_lines_that_recorded_its_ops(tmp_path):
    """A flush's range names the user's lines that recorded its ops; the exported trace has
    every line with its op count, the sync point and lazyrt's record (compile and execute
    seconds, HBM peak)."""
    x, w = _inputs(8)
    with lazyrt.set_mode("defer"):
        tx, tw = x.to("tpu"), w.to("tpu")
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            _work(tx, tw)
    line = _line("# RECORDED-HERE")
    (name,) = [k for k in _names(prof) if k.startswith("lazyrt::flush")]
    assert f"test_profiler.py:{line}" in name
    path = str(tmp_path / "t.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    (ev,) = [e for e in events if e.get("name") == name]
    a = ev["args"]
    assert a["num_ops"] == 4 and a["mode"] == "defer" and a["cache"] in ("hit", "miss")
    assert any(r.startswith(f"{__file__}:{line} in _work (2 ops)") for r in a["recorded_at"])
    assert a["sync_at"].startswith(f"{__file__}:{line + 2} in _work")
    assert a["hbm_peak_bytes"] >= a["live_bytes_before"] > 0
    assert a["execute_seconds"] > 0


@pytest.mark.parametrize("mode", MODES)
def test_chrome_trace_has_a_device_track_aligned_with_the_cpu_ops(mode, tmp_path):
    """The exported trace parses and has the device track: XLA's executions from JAX's
    profiler (on the CPU: the executing threads, one interval per program run), inside
    the profiled window, after the CPU op that launched them."""
    x, w = _inputs(8)
    with lazyrt.set_mode(mode):
        tx, tw = x.to("tpu"), w.to("tpu")
        _work(tx, tw)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            _work(tx, tw)
    assert prof.use_device == "tpu"  # torch takes PrivateUse1 for the Python backend
    path = str(tmp_path / "trace.json.gz")
    prof.export_chrome_trace(path)  # (torch.profiler gzips through a temporary .json)
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    assert doc["lazyrt"]["device_track"] is True
    ev = doc["traceEvents"]
    procs = [e for e in ev if e.get("pid") == DEVICE_PID and e.get("name") == "process_name"]
    assert len(procs) == 1 and "XLA executions" in procs[0]["args"]["name"]
    runs = [e for e in ev if e.get("pid") == DEVICE_PID and e.get("ph") == "X"
            and "run_id" in e.get("args", {})]
    lazy = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "cpu_op"
            and e["name"].startswith(("lazyrt::op[", "lazyrt::execute"))]
    assert len(lazy) == (4 if mode == "strict" else 1)
    assert len(runs) >= len(lazy)
    first = min(float(e["ts"]) for e in lazy)
    last = max(float(e["ts"]) + float(e["dur"]) for e in ev if e.get("cat") == "cpu_op")
    # (a microsecond of slack: the two clocks are tied by one annotation)
    assert all(first - 5 <= float(r["ts"]) <= last for r in runs), (first, last, runs)
    # a program run that began inside a lazyrt range is named by it
    programs = [r for r in runs if "hlo_op" not in r["args"]]
    launched = {"strict": {"lazyrt::op[add]", "lazyrt::op[mul]", "lazyrt::op[mm]",
                           "lazyrt::op[sum]"}, "defer": {"lazyrt::execute"}}[mode]
    named = {r["args"]["launched_by"] for r in programs if "launched_by" in r["args"]}
    assert named <= launched


def test_schedule_and_tensorboard_trace_handler(tmp_path):
    """``schedule`` + ``tensorboard_trace_handler`` as on CUDA: the recorded steps' trace
    is written, with lazyrt's ranges and the device track; ``lazyrt-mem read`` reads the
    folder."""
    x, w = _inputs(8)
    d = str(tmp_path / "tb")
    with lazyrt.set_mode("defer"):
        tx, tw = x.to("tpu"), w.to("tpu")
        with profile(activities=[ProfilerActivity.CPU],
                     schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                     on_trace_ready=tensorboard_trace_handler(d)) as prof:
            for _ in range(5):
                _work(tx, tw)
                prof.step()
    (f,) = os.listdir(d)
    with open(os.path.join(d, f)) as fh:
        doc = json.load(fh)
    names = [e.get("name", "") for e in doc["traceEvents"]]
    assert sum(n.startswith("lazyrt::flush[4 ops, hit]") for n in names) == 2
    assert doc["lazyrt"]["device_track"] is True
    summary, records = profiler_trace.load(d)
    assert [r["num_ops"] for r in records] == [4, 4]
    assert summary["cache_hits"] == 2 and summary["mode"] == "defer"


@pytest.mark.parametrize("mode", MODES)
def test_profile_memory_shows_lazyrt_memory_events(mode, tmp_path, capsys):
    """With ``profile_memory=True`` each of lazyrt's allocations and releases is a
    ``[memory]`` event of device type PrivateUse1 (its bytes and the live total), each
    computation's HBM peak a counter; ``lazyrt-mem read`` prints the report of the trace."""
    x, w = _inputs(16)  # 1 KiB per tensor
    with lazyrt.set_mode(mode):
        tx, tw = x.to("tpu"), w.to("tpu")
        _work(tx, tw)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            z, _ = _work(tx, tw)
            del z
    path = str(tmp_path / "m.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        ev = json.load(f)["traceEvents"]
    mem = [e["args"] for e in ev if e.get("name") == "[memory]"
           and e["args"].get("Device Type") == 20]
    nb = 16 * 16 * 4
    assert any(m["Bytes"] == nb for m in mem)  # z (and, strict, y and x + 1) allocated
    assert any(m["Bytes"] == -nb for m in mem)  # and released
    assert all(m["Total Allocated"] >= 2 * nb for m in mem)  # tx and tw stay live
    peaks = [e for e in ev if e.get("name") == "lazyrt HBM peak"]
    assert len(peaks) == 2 * (4 if mode == "strict" else 1)
    ops = [e for e in ev if e.get("cat") == "cpu_op"]
    lo = min(float(e["ts"]) for e in ops)
    hi = max(float(e["ts"]) + float(e["dur"]) for e in ops)
    assert all(lo <= float(e["ts"]) <= hi for e in peaks)  # on the CPU ops' timeline
    assert max(e["args"]["bytes"] for e in peaks) >= 3 * nb
    assert _mem.main(["read", path]) == 0
    out = capsys.readouterr().out
    assert f"computations:        {4 if mode == 'strict' else 1} (4 ops" in out
    assert "process HBM peak" in out

"""The persistent compile cache, tiered compiles and constants made without compiling.

Reference: PyTorch CPU eager for values; a program compiled at full optimization for what
a tiered program switches to (bit for bit); separate processes for what is shared on disk.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import warnings

import jax
import numpy as np
import pytest
import torch
from torch import nn

import lazyrt
from lazyrt._exec import defer as _defer
from lazyrt._exec import diskcache, tiers
from lazyrt._exec import exes as _exes
from lazyrt._exec import strict as _strict
from lazyrt._exec import xla as _xla

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def _compile_mode(mode: str, cache_dir=None):
    prev = lazyrt.config.compile, lazyrt.config.cache_dir
    lazyrt.config.compile = mode
    if cache_dir is not None:
        lazyrt.config.cache_dir = cache_dir
    try:
        yield
    finally:
        tiers.drain()
        lazyrt.config.compile, lazyrt.config.cache_dir = prev


def _c():
    return lazyrt.metrics.counters()


def _strict_progs(name):
    return [p for p in list(_strict._compiled) if p.name == name]


# ---------------------------------------------------------------------------
# tiered compiles


def _bn_step(x, w, b):
    """Reductions (the values a lower optimization level may round differently) and an
    elementwise chain."""
    y = torch.nn.functional.batch_norm(x, None, None, w, b, training=True)
    return torch.tanh(y) * 0.5 + y.sum(dim=(0, 2, 3), keepdim=True)


def test_tiered_strict_program_switches_to_the_optimized_one(tmp_path):
    torch.manual_seed(0)
    xs = torch.randn(4, 6, 9, 9)
    ws, bs = torch.randn(6), torch.randn(6)
    ref = _bn_step(xs, ws, bs)
    x, w, b = xs.to("tpu"), ws.to("tpu"), bs.to("tpu")
    with lazyrt.set_mode("strict"), _compile_mode("tiered", str(tmp_path)):
        swaps0 = _c()["tier_swaps"]
        first = _bn_step(x, w, b).cpu()  # every program at the first tier
        prog = _strict_progs("native_batch_norm")[-1]
        assert isinstance(prog.exe, _xla.FirstTier)
        first_exe = prog.exe
        second = _bn_step(x, w, b).cpu()  # a second run queues the optimized builds
        tiers.drain()
        assert _c()["tier_swaps"] > swaps0
        assert prog.exe is not first_exe and not isinstance(prog.exe, _xla.FirstTier)
        third = _bn_step(x, w, b).cpu()
    # the optimized executables give what programs compiled fully give, bit for bit
    with lazyrt.set_mode("strict"), _compile_mode("full", "off"):
        _strict.drop(list(_strict._compiled))
        full = _bn_step(x, w, b).cpu()
    assert torch.equal(third, full)
    for got in (first, second, third):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(first, third)


def _flush_step(x):
    y = (x * 1.5).sin().sum(dim=1) + x.mean()
    return y.cpu()


def test_tiered_flush_switches_to_the_optimized_one(tmp_path, compile_at_first_run):
    xs = torch.randn(33, 65)
    ref = (xs * 1.5).sin().sum(dim=1) + xs.mean()
    x = xs.to("tpu")
    with lazyrt.set_mode("defer"), _compile_mode("tiered", str(tmp_path)):
        lazyrt.sync()
        first = _flush_step(x)
        exe = _exes.all_exes()[-1]
        assert isinstance(exe.compiled, _xla.FirstTier)
        second = _flush_step(x)
        tiers.drain()
        assert not isinstance(exe.compiled, _xla.FirstTier)
        misses = _c()["cache_misses"]
        third = _flush_step(x)
        assert _c()["cache_misses"] == misses  # the swap is no recompile
    with lazyrt.set_mode("defer"), _compile_mode("full", "off"):
        _defer.clear_cache()
        full = _flush_step(x)
    assert torch.equal(third, full)  # the optimized program's results, bit for bit
    torch.testing.assert_close(first, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(first, third)
    assert torch.equal(first, second)


def test_full_compiles_have_no_first_tier(tmp_path):
    x = torch.randn(5, 7).to("tpu")
    with lazyrt.set_mode("strict"), _compile_mode("full", str(tmp_path)):
        swaps = _c()["tier_swaps"]
        y = (x.cos() * 3).cpu()
        assert not any(isinstance(p.exe, _xla.FirstTier) for p in _strict_progs("cos"))
        assert _c()["tier_swaps"] == swaps
    torch.testing.assert_close(y, x.cpu().cos() * 3)


def test_a_failing_compile_raises_the_same_in_both_tiers(compile_at_first_run):
    """A flush whose program fails to build raises the same error, tiered or not."""
    from lazyrt._ops import resolve as _resolve

    entry = _resolve.resolve(torch.ops.aten.cosh.default)
    real = entry.fn
    errors = {}
    x = torch.randn(3).to("tpu")
    try:
        for mode in ("full", "tiered"):
            calls = {"n": 0}

            def flaky(a, calls=calls):
                calls["n"] += 1
                if calls["n"] > 1:  # the abstract check at the op passes, the flush fails
                    raise ValueError("lowering exploded")
                return real(a)

            entry.fn = flaky
            entry.plans.clear()
            with lazyrt.set_mode("defer"), _compile_mode(mode, "off"):
                y = torch.cosh(x)
                with pytest.raises(RuntimeError) as ei:
                    y.cpu()
                errors[mode] = str(ei.value)
                entry.fn = real
                torch.testing.assert_close(y.cpu(), torch.cosh(x.cpu()))  # the retry works
    finally:
        entry.fn = real
        entry.plans.clear()
    assert errors["full"] == errors["tiered"] and "lowering exploded" in errors["full"]


# ---------------------------------------------------------------------------
# the persistent cache


def test_entries_are_checked_and_a_damaged_one_is_a_miss(tmp_path):
    x = torch.randn(17).to("tpu")
    with lazyrt.set_mode("strict"), _compile_mode("full", str(tmp_path)):
        torch.sinh(x * 0.5).cpu()
        tiers.drain()
        d = diskcache.directory()
        assert os.path.basename(d) == "xla-" + diskcache.environment_key()
        files = [f for f in os.listdir(d) if f.endswith(".exe")]
        assert files
        for f in files:
            with open(os.path.join(d, f), "r+b") as fh:
                fh.seek(-3, os.SEEK_END)
                fh.write(b"\xff\x00\xff")
        _strict.drop(list(_strict._compiled))
        damaged, hits = _c()["disk_cache_damaged"], _c()["disk_cache_hits"]
        y = torch.sinh(x * 0.5).cpu()
        assert _c()["disk_cache_damaged"] > damaged and _c()["disk_cache_hits"] == hits
    torch.testing.assert_close(y, torch.sinh(x.cpu() * 0.5))


@pytest.mark.parametrize("compile_mode", ["full", "tiered"])
def test_a_sort_is_stored_though_it_ran_before_the_write(tmp_path, compile_mode):
    """XLA:CPU refuses to serialize a sort's executable once it has run (jaxlib 0.10.2:
    "`LessThan` is not serializable"; a background job failed with a warning). Each
    executable is serialized before its first run, so the write (held back here behind a
    busy worker) stores it, and a second lookup loads it. (A shape per mode: JAX hands back
    the executable it already built, and ran, for a program compiled twice in a process.)"""
    xs = torch.randn(13, 11 if compile_mode == "full" else 7)
    x = xs.to("tpu")
    ref = torch.sort(xs, dim=1)
    with lazyrt.set_mode("strict"), _compile_mode(compile_mode, str(tmp_path)):
        _strict.drop(list(_strict._compiled))
        before = _c()
        busy = threading.Event()
        assert tiers.submit(tiers.WRITE, busy.wait)  # the worker writes nothing until set
        try:
            got = [torch.sort(x, dim=1) for _ in range(3)]
            got = [(v.cpu(), i.cpu()) for v, i in got]
        finally:
            busy.set()
        tiers.drain()
        after = _c()
        assert after["tier_failures"] == before["tier_failures"]
        assert after["disk_cache_unstorable"] == before["disk_cache_unstorable"]
        assert after["disk_cache_writes"] > before["disk_cache_writes"]
        _strict.drop(list(_strict._compiled))
        v, i = torch.sort(x, dim=1)
        got.append((v.cpu(), i.cpu()))
        assert _c()["disk_cache_hits"] > after["disk_cache_hits"]  # loaded, not compiled
    for v, i in got:
        assert torch.equal(v, ref.values) and torch.equal(i, ref.indices)


def test_the_report_tells_programs_loaded_from_disk_from_compiled_ones(tmp_path):
    """A program loaded from the compile cache is a miss of this process's memory, not a
    compile: ``metrics.report()`` splits the misses into compiled and loaded."""
    x = torch.randn(19).to("tpu")
    with lazyrt.set_mode("strict"), _compile_mode("full", str(tmp_path)):
        _strict.drop(list(_strict._compiled))
        lazyrt.metrics.reset()
        first = torch.cosh(x * 0.25).cpu()
        tiers.drain()
        _strict.drop(list(_strict._compiled))
        second = torch.cosh(x * 0.25).cpu()  # every program of the first, from the disk
    rep = lazyrt.metrics.report()
    c = _c()

    def row(name):
        return int(re.search(rf"^  {name}\s+(\d+)", rep, re.M).group(1))

    assert row("cache_misses_loaded") == c["disk_cache_hits"] > 0
    assert row("cache_misses_compiled") == row("cache_misses_loaded")  # the first's, only
    assert row("cache_misses_compiled") + row("cache_misses_loaded") == c["cache_misses"]
    assert torch.equal(first, second)
    torch.testing.assert_close(first, torch.cosh(x.cpu() * 0.25))


def test_programs_that_drop_an_unused_argument_are_apart_by_its_shape(tmp_path):
    """``pdist`` of one row reads none of its input: jit drops the argument, so the programs
    for a [1, 1] and a [1, 5] input have the same text. Each keeps its own entry (the second
    once ran the first's executable: "Argument types differ")."""
    with lazyrt.set_mode("defer"), _compile_mode("full", str(tmp_path)):
        for n in (1, 5):
            x = torch.randn(1, n)
            got = torch.nn.functional.pdist(x.to("tpu")).cpu()
            torch.testing.assert_close(got, torch.nn.functional.pdist(x))
        tiers.drain()
        assert len([f for f in os.listdir(diskcache.directory()) if f.endswith(".exe")]) >= 2


def test_a_plan_takes_its_output_specs_from_an_earlier_meta_kernel(tmp_path):
    """A warm process does not run the meta kernel of a plan an earlier process built: the
    output specs (strides and out= resizes included) come from the disk, keyed by what the
    meta kernel read. Different strides are a different entry; bad input still raises
    the meta kernel's error at the op."""
    from lazyrt._ops import resolve as _resolve

    x = torch.randn(2, 3, 4, 5)
    cl = x.contiguous(memory_format=torch.channels_last)
    out = torch.empty(0)
    entries = [_resolve.resolve(op) for op in (torch.ops.aten.mul.Tensor,
                                               torch.ops.aten.sin.out)]

    def run():
        for e in entries:
            e.plans.clear()
        a, b = x.to("tpu"), cl.to("tpu")
        o = out.to("tpu")
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            torch.sin(a, out=o)
        return [(t.shape, t.stride(), t.dtype, t.cpu()) for t in (a * 2, b * 2, o)]

    with lazyrt.set_mode("strict"), _compile_mode("full", str(tmp_path)):
        first = run()
        hits = _c()["disk_cache_meta_hits"]
        second = run()
        assert _c()["disk_cache_meta_hits"] >= hits + 3
        with pytest.raises(RuntimeError, match="broadcast"):  # the meta kernel's error
            x.to("tpu") * torch.randn(7).to("tpu")
    assert [r[:3] for r in first] == [r[:3] for r in second] == [
        ((2, 3, 4, 5), s, torch.float32) for s in (x.stride(), cl.stride(), x.stride())]
    for (_, _, _, v1), (_, _, _, v2), ref in zip(first, second, (x * 2, cl * 2, x.sin())):
        assert torch.equal(v1, v2)
        torch.testing.assert_close(v1, ref)


def test_a_loaded_executable_reads_its_memory_analysis_from_its_entry(tmp_path):
    """A signature entry carries its executable's memory analysis: the loaded executable's
    equals what XLA computes for it (and for the compiled one)."""
    from lazyrt._base.memory import MemoryAnalysis

    x = torch.randn(23, 5).to("tpu")
    with lazyrt.set_mode("strict"), _compile_mode("full", str(tmp_path)):
        _strict.drop(list(_strict._compiled))
        first = torch.atan(x @ x.t()).cpu()
        tiers.drain()
        compiled = {p.sig: MemoryAnalysis.of(p.exe) for p in _strict._compiled if p.exe}
        _strict.drop(list(_strict._compiled))
        hits = _c()["disk_cache_signed_hits"]
        second = torch.atan(x @ x.t()).cpu()
        assert _c()["disk_cache_signed_hits"] > hits
        loaded = [p for p in _strict._compiled if p.exe in diskcache._analyses]
        assert loaded
        for p in loaded:
            assert diskcache.analysis_of(p.exe) == MemoryAnalysis.of(p.exe) == compiled[p.sig]
    assert torch.equal(first, second)


def test_meta_text_is_none_without_a_stable_text():
    from lazyrt._ops.args import SliceEnd, meta_text

    x = torch.randn(2, 3).to("tpu")
    assert meta_text([x, 2, 0.5, None, torch.float16]) is not None
    assert meta_text([x]) != meta_text([x.t()])  # the strides are in it
    assert meta_text([x, SliceEnd(3, 1)]) is None
    assert meta_text([x, object()]) is None


def test_a_cache_dir_that_cannot_be_made_warns_and_runs_without(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    x = torch.randn(9)
    with lazyrt.set_mode("strict"), _compile_mode("full", str(blocker / "cache")):
        with pytest.warns(RuntimeWarning, match="cannot be created"):
            got = torch.cosh(x.to("tpu") * 0.25).cpu()
        assert diskcache.directory() is None
    torch.testing.assert_close(got, torch.cosh(x * 0.25))


def test_the_cache_is_bounded_least_recently_used_first(tmp_path):
    prev = lazyrt.config.cache_dir, lazyrt.config.cache_max_mb
    lazyrt.config.cache_dir, lazyrt.config.cache_max_mb = str(tmp_path), 0.25  # 256 KiB
    try:
        blob = bytes(range(256)) * 200  # 50 KiB each
        for i in range(4):
            assert diskcache.put(f"entry{i}", blob)
        os.utime(os.path.join(diskcache.directory(), "entry0.exe"), (1, 1))
        assert diskcache.get("entry1") == blob  # a read makes entry1 recent
        os.utime(os.path.join(diskcache.directory(), "entry2.exe"), (2, 2))
        for i in range(4, 8):
            diskcache.put(f"entry{i}", blob)
        diskcache.evict()
        names = sorted(os.listdir(diskcache.directory()))
        total = sum(os.path.getsize(os.path.join(diskcache.directory(), n))
                    for n in names if n.endswith(".exe"))
        assert total <= 0.25 * 2**20
        assert "entry0.exe" not in names and "entry2.exe" not in names
        assert "entry7.exe" in names
        assert diskcache.get("entry7") == blob
    finally:
        lazyrt.config.cache_dir, lazyrt.config.cache_max_mb = prev


_SCRIPT = textwrap.dedent("""
    import json, sys, torch, lazyrt
    from torch import nn
    from lazyrt._exec import tiers
    out = {}
    for mode in ("strict", "defer"):
        lazyrt.set_mode(mode)
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 3))
        m = m.to("tpu")
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        x = torch.randn(6, 8).to("tpu")
        y = torch.randint(0, 3, (6,)).to("tpu")
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        out[mode] = losses
    tiers.drain()
    c = lazyrt.metrics.counters()
    out["compiled"] = c["cache_misses"] - c["disk_cache_hits"]
    out["loaded"] = c["disk_cache_hits"]
    json.dump(out, sys.stdout)
""")


def _cpu_losses():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 3))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    x = torch.randn(6, 8)
    y = torch.randint(0, 3, (6,))
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _env(**kv):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TORCH_TPU_MODE", None)
    env.update(kv)
    return env


@pytest.mark.subprocess
def test_two_processes_fill_one_cache_dir_at_once(tmp_path):
    cache = str(tmp_path / "cache")
    env = _env(LAZYRT_CACHE_DIR=cache)
    procs = [subprocess.Popen([sys.executable, "-c", _SCRIPT], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out))
    ref = _cpu_losses()
    for r in results:
        for mode in ("strict", "defer"):
            np.testing.assert_allclose(r[mode], ref, rtol=1e-4, atol=1e-5)
    entries = [f for d, _, fs in os.walk(cache) for f in fs if f.endswith(".exe")]
    assert entries and not [f for d, _, fs in os.walk(cache) for f in fs if f.startswith(".tmp")]
    # a third process finds every program on disk: it compiles nothing
    warm = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600)
    assert warm.returncode == 0, warm.stderr[-3000:]
    w = json.loads(warm.stdout)
    assert w["compiled"] == 0 and w["loaded"] > 0
    for mode in ("strict", "defer"):
        np.testing.assert_allclose(w[mode], ref, rtol=1e-4, atol=1e-5)


@pytest.mark.subprocess
@pytest.mark.parametrize("how", ["env", "code"])
def test_cache_dir_off_writes_nothing(tmp_path, how):
    """``LAZYRT_CACHE_DIR=off`` (or ``lazyrt.config.cache_dir = "off"`` in code) writes
    nothing anywhere: not in the working directory, the user's cache directory or TMPDIR
    (an "off" set in code used to be taken for a directory named ``off`` in the cwd)."""
    home, xdg, tmp, cwd = (tmp_path / n for n in ("home", "xdg", "tmp", "cwd"))
    for d in (home, xdg, tmp, cwd):
        d.mkdir()
    env = _env(HOME=str(home), XDG_CACHE_HOME=str(xdg), TMPDIR=str(tmp))
    script = _SCRIPT
    if how == "env":
        env["LAZYRT_CACHE_DIR"] = "off"
    else:
        env.pop("LAZYRT_CACHE_DIR", None)
        script = script.replace("out = {}\n", "out = {}\nlazyrt.config.cache_dir = 'off'\n")
        assert "cache_dir = 'off'" in script
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=600, cwd=str(cwd))
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout)
    assert r["loaded"] == 0 and r["compiled"] > 0
    ref = _cpu_losses()
    for mode in ("strict", "defer"):
        np.testing.assert_allclose(r[mode], ref, rtol=1e-4, atol=1e-5)
    written = [os.path.join(d, f) for root in (home, xdg, tmp, cwd)
               for d, ds, fs in os.walk(root) for f in fs + ds]
    # (torch itself makes an empty TMPDIR/torchinductor_<user> when AdamW runs, on the CPU too)
    torchs = os.path.join(str(tmp), "torchinductor_")
    assert [w for w in written if not w.startswith(torchs)] == []


# ---------------------------------------------------------------------------
# constants made on the host


def _factories(device):
    return [
        torch.zeros((), device=device), torch.zeros(3, 4, dtype=torch.bfloat16, device=device),
        torch.ones(2, 5, dtype=torch.float64, device=device),
        torch.full((2, 3), 3.7, device=device), torch.full((4,), 7, dtype=torch.int8, device=device),
        torch.full((3,), True, device=device), torch.arange(7, device=device),
        torch.arange(2, 20, 3, device=device), torch.eye(4, device=device),
        torch.empty(0, 3, device=device).fill_(0) if device == "cpu" else
        torch.zeros(0, 3, device=device),
    ]


@pytest.fixture
def host_constants(monkeypatch):
    """Host constants on (the default; ``LAZYRT_HOST_CONSTANTS=0`` turns them off)."""
    from lazyrt._exec import consts

    monkeypatch.setattr(consts, "ENABLED", True)


@pytest.mark.usefixtures("host_constants")
def test_constants_made_on_the_host_equal_compiled_ones():
    from lazyrt._exec import consts

    with lazyrt.set_mode("strict"):
        made = _c()["host_constants"]
        got = _factories("tpu")
        assert _c()["host_constants"] >= made + len(got)
    for g, r in zip(got, _factories("cpu")):
        assert g.dtype == r.dtype and g.shape == r.shape
        assert torch.equal(g.cpu(), r), (g, r)
    # bit for bit what the compiled program of the same plan gives
    progs = [p for p in _host_progs() if p.host and not p.scalar_kinds]
    assert progs
    for p in progs:
        exe = _xla.compile_program(p.fn, (), tiered=False)[0]
        with jax.enable_x64(True):
            ref = exe()
        for h, r in zip(consts.evaluate(p, [], []), ref):
            assert h.dtype == r.dtype and h.shape == r.shape
            assert np.array_equal(np.asarray(h), np.asarray(r))


def _host_progs():
    from lazyrt._ops import resolve as _resolve

    out = []
    for op in (torch.ops.aten.zeros.default, torch.ops.aten.ones.default,
               torch.ops.aten.full.default, torch.ops.aten.arange.default,
               torch.ops.aten.arange.start_step, torch.ops.aten.eye.default):
        out += [pl.prog for pl in _resolve.resolve(op).plans.values()]
    return out


@pytest.mark.usefixtures("host_constants")
@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_moving_a_model_and_making_optimizer_state_compile_nothing(mode):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 5, 3), nn.BatchNorm2d(5), nn.Flatten(), nn.Linear(5 * 36, 4))
    ref = {k: v.clone() for k, v in m.state_dict().items()}
    with lazyrt.set_mode(mode):
        misses = _c()["cache_misses"]
        m.to("tpu")
        lazyrt.sync()
        assert _c()["cache_misses"] == misses
        # an optimizer's state, as torch.optim makes it on its first step
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        for p in m.parameters():
            opt.state[p]["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        if mode == "strict":
            assert _c()["cache_misses"] == misses
        for p in m.parameters():
            assert torch.equal(opt.state[p]["exp_avg"].cpu(), torch.zeros(p.shape))
        for k, v in m.state_dict().items():
            assert torch.equal(v.cpu(), ref[k])

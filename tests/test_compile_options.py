"""XLA compile options per platform and program class (``lazyrt/_base/backend_choices.py``,
read by ``lazyrt/_exec/xla.py``), and the persistent cache keeping quick programs."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F

import lazyrt
from lazyrt._base import backend_choices as _choices
from lazyrt._exec import strict as _strict
from lazyrt._exec import tiers
from lazyrt._exec import xla as _xla


@pytest.mark.parametrize("platform", sorted(_choices.COMPILE_OPTIONS))
def test_every_rows_options_exist_in_this_jaxlib(platform):
    """An unknown option name fails at compile (XLA's options are one set for every
    backend, so the GPU and TPU rows are checked here on the CPU too)."""
    lowered = jax.jit(lambda x: x * 2).lower(jnp.ones(3))
    for cls in _choices.PROGRAM_CLASSES:
        opts = _choices.compile_options_for(platform, cls)
        exe = lowered.compile(compiler_options=opts) if opts else lowered.compile()
        assert float(exe(jnp.ones(3))[0]) == 2.0


def test_an_unknown_class_is_an_error():
    with pytest.raises(ValueError, match="program class"):
        _choices.compile_options_for("gpu", "fused")


# options XLA:CPU takes, at the values it has by default: the programs' results are
# unchanged, and each class's set tells which row a compile got
_ROWS = {
    "op": {"xla_cpu_enable_fast_min_max": False},
    "dot": {"xla_cpu_fast_math_honor_nans": True},
    "flush": {"xla_cpu_fast_math_honor_infs": True},
}


def test_each_program_class_gets_its_rows_options(monkeypatch, compile_at_first_run):
    monkeypatch.setitem(_choices.COMPILE_OPTIONS, "cpu", _ROWS)
    monkeypatch.setattr(lazyrt.config, "cache_dir", None)  # every program compiled here
    seen = []
    real = jax.stages.Lowered.compile

    def spy(self, compiler_options=None, **kw):
        seen.append((self.as_text(), dict(compiler_options or {})))
        return real(self, compiler_options=compiler_options, **kw)

    monkeypatch.setattr(jax.stages.Lowered, "compile", spy)
    x, w = torch.randn(5, 13), torch.randn(13, 3)
    img, k = torch.randn(1, 2, 9, 9), torch.randn(4, 2, 3, 3)
    with lazyrt.set_mode("strict"):
        t, tw = x.to("tpu"), w.to("tpu")
        ti, tk = img.to("tpu"), k.to("tpu")
        _strict.drop(list(_strict._compiled))
        seen.clear()
        got = [torch.tanh(t).cpu(), (t @ tw).cpu(), F.conv2d(ti, tk).cpu()]
    strict_seen = list(seen)
    with lazyrt.set_mode("defer"):
        seen.clear()
        got.append((torch.tanh(t) @ tw * 2).cpu())
    flush_seen = list(seen)
    want = [torch.tanh(x), x @ w, F.conv2d(img, k), torch.tanh(x) @ w * 2]
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
    classes = set()
    for text, opts in strict_seen:
        cls = "dot" if ("dot_general" in text or "convolution" in text) else "op"
        classes.add(cls)
        assert _ROWS[cls].items() <= opts.items(), (cls, opts)
        assert _xla.program_class("op", text) == cls
    assert classes == {"op", "dot"}
    assert flush_seen
    for _, opts in flush_seen:
        assert _ROWS["flush"].items() <= opts.items(), opts


@pytest.mark.usefixtures("compile_at_first_run")
def test_quick_programs_are_kept_in_the_persistent_cache(tmp_path, monkeypatch):
    """lazyrt's own disk cache (not JAX's, whose ``jax_persistent_cache_min_compile_time_secs``
    skips programs that compile in under a second) keeps every program: one-op programs,
    compiled in milliseconds, load from it once the executables in memory are gone."""
    monkeypatch.setattr(lazyrt.config, "cache_dir", str(tmp_path))
    monkeypatch.setattr(lazyrt.config, "compile", "full")
    x = torch.randn(11, 7)

    def ops(t):
        return [torch.sinh(t), t * 0.375 + 1, t.sum(0), torch.cumsum(t, 1)]

    with lazyrt.set_mode("strict"):
        t = x.to("tpu")
        c0 = lazyrt.metrics.counters()
        first = [o.cpu() for o in ops(t)]
        tiers.drain()  # the writes
        c1 = lazyrt.metrics.counters()
        compiled = c1["cache_misses"] - c0["cache_misses"]
        assert compiled >= 4
        # each program stored (lazyrt's own programs also under their signature)
        assert c1["disk_cache_writes"] - c0["disk_cache_writes"] >= compiled
        _strict.drop(list(_strict._compiled))
        again = [o.cpu() for o in ops(t)]
        c2 = lazyrt.metrics.counters()
    assert c2["disk_cache_hits"] - c1["disk_cache_hits"] == compiled
    for a, b, r in zip(first, again, ops(x)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-5)

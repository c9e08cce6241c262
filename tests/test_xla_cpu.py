"""lazyrt's XLA:CPU specifics: its own float32 log1p and GELU forms, the per-compile vector
width option, and the host malloc cache. Values are checked against PyTorch CPU eager."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _util import assert_close

import lazyrt
from lazyrt._base import hostmem as _hostmem
from lazyrt._exec import xla as _xla


def _wide_float32():
    """Normal floats over the whole range, both signs, around the series/log switch points,
    and the specials (subnormals are left out: XLA:CPU flushes them to zero)."""
    parts = [np.logspace(-37, 38, 20001), -np.logspace(-37, np.log10(0.9999999), 10001),
             np.linspace(-1.0, 5.0, 60001), np.linspace(-0.3, 0.42, 20001),
             [-0.2929, -0.29289, 0.4142, 0.41421, 2.0 ** -24, -(2.0 ** -24), 2.0 ** -23],
             [0.0, -0.0, -1.0, -1.5, np.inf, -np.inf, np.nan, 3.4e38]]
    return torch.from_numpy(np.concatenate(parts).astype(np.float32))


@pytest.mark.parametrize("fn", [torch.log1p, torch.special.log1p, F.softplus, F.logsigmoid],
                         ids=["log1p", "special.log1p", "softplus", "logsigmoid"])
def test_log1p_family_matches_cpu_over_the_float32_range(mode, fn):
    x = _wide_float32()
    got = fn(x.to("tpu")).cpu()
    want = fn(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    # atol: results below float32's smallest normal are flushed to zero by XLA:CPU
    torch.testing.assert_close(got, want, rtol=4e-7, atol=float(np.finfo(np.float32).tiny),
                               equal_nan=True)
    # signed zeros come through: log1p(-0.0) is -0.0
    if fn in (torch.log1p, torch.special.log1p):
        assert torch.equal(torch.signbit(got[x == 0]), torch.signbit(x[x == 0]))


def test_log1p_within_three_ulps_of_float64():
    x = _wide_float32()
    x = x[torch.isfinite(x) & (x > -1)]
    got = torch.log1p(x.to("tpu")).cpu().double()
    ref = torch.log1p(x.double())
    ulp = (torch.nextafter(ref.float().abs(), torch.tensor(float("inf"))).double()
           - ref.float().abs().double())
    fin = torch.isfinite(ref) & (ulp > 0)
    assert ((got - ref).abs()[fin] / ulp[fin]).max().item() <= 3.0


def test_log1p_other_dtypes_and_grad(mode):
    for dt in (torch.float64, torch.bfloat16, torch.float16):
        x = torch.linspace(-0.9, 10, 1001, dtype=dt)
        assert_close(torch.log1p(x.to("tpu")), torch.log1p(x))
    x = torch.linspace(-0.5, 3, 257, requires_grad=True)
    xt = x.detach().to("tpu").requires_grad_(True)
    torch.log1p(xt).sum().backward()
    torch.log1p(x).sum().backward()
    assert_close(xt.grad, x.grad)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_forward_backward_match_cpu(mode, approximate):
    x = torch.cat([torch.linspace(-12, 12, 4001), torch.tensor([0.0, -0.0, 1e-20, -1e30, 1e30])])
    x.requires_grad_(True)
    xt = x.detach().to("tpu").requires_grad_(True)
    y, yt = F.gelu(x, approximate=approximate), F.gelu(xt, approximate=approximate)
    assert_close(yt, y)
    g = torch.linspace(-1, 1, x.numel())
    y.backward(g)
    yt.backward(g.to("tpu"))
    assert_close(xt.grad, x.grad)


def test_vector_width_option(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    for v, want in (("off", None), ("256", 256), ("512", 512)):
        monkeypatch.setenv("LAZYRT_XLA_CPU_VECTOR_WIDTH", v)
        assert _xla._vector_width() == want
    monkeypatch.setenv("LAZYRT_XLA_CPU_VECTOR_WIDTH", "auto")
    assert _xla._vector_width() == (512 if "avx512f" in _xla._cpu_flags() else None)
    monkeypatch.setenv("LAZYRT_XLA_CPU_VECTOR_WIDTH", "1024")
    with pytest.raises(ValueError, match="LAZYRT_XLA_CPU_VECTOR_WIDTH"):
        _xla._vector_width()
    # the user's own XLA flag wins
    monkeypatch.setenv("LAZYRT_XLA_CPU_VECTOR_WIDTH", "512")
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_prefer_vector_width=256")
    assert _xla._vector_width() is None


def test_compile_options_reach_the_executable(mode):
    opts = _xla.compile_options()
    if not opts:
        pytest.skip("no lazyrt compile options on this platform/CPU")
    x = torch.randn(1000)
    got = torch.exp(torch.tanh(x.to("tpu")) * 2).cpu()
    assert_close(got, torch.exp(torch.tanh(x) * 2))
    if mode == "defer":
        y = torch.tanh(x.to("tpu")) + 1
        assert "prefer_vector_width" not in lazyrt.hlo()  # an option, not part of the program
        lazyrt.sync()
        del y


_PROBE = ("import lazyrt, json, torch; from lazyrt._base import hostmem as _hostmem; "
          "from jax._src import xla_bridge as xb; "
          "assert not xb._backends, 'import lazyrt started a JAX backend'; "
          "assert _hostmem.applied() == {}; "
          "(torch.ones(3).to('tpu') * 2).cpu(); "
          "print(json.dumps(_hostmem.applied()))")


def _probe(**env):
    e = dict(os.environ, JAX_PLATFORMS="cpu", **env)
    p = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=e,
                       timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().splitlines()[-1]


@pytest.mark.subprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc knobs")
def test_host_malloc_cache_on_by_default_and_switchable():
    import json

    on = json.loads(_probe())
    assert on == {"mmap_threshold": _hostmem.THRESHOLD, "trim_threshold": _hostmem.THRESHOLD}
    assert json.loads(_probe(LAZYRT_HOST_MALLOC_CACHE="0")) == {}


@pytest.mark.subprocess
def test_host_malloc_cache_bad_value_is_an_error():
    e = dict(os.environ, JAX_PLATFORMS="cpu", LAZYRT_HOST_MALLOC_CACHE="maybe")
    p = subprocess.run([sys.executable, "-c", "import lazyrt"], capture_output=True, text=True,
                       env=e, timeout=120, check=False)
    assert p.returncode != 0
    assert "LAZYRT_HOST_MALLOC_CACHE" in p.stderr


@pytest.mark.parametrize("n", [4, 400, 4096, 100003])
def test_atan_right_at_every_size(mode, n):
    # XLA:CPU miscompiles atan at 512-bit vectors; lazyrt compiles such programs at the
    # default width (see _xla.compile). Fused with other ops too.
    x = torch.linspace(-50, 50, n)
    assert_close(torch.atan(x.to("tpu")), torch.atan(x))
    assert_close(torch.atan(torch.exp(x.to("tpu") * 0.01)) * 2 + 1, torch.atan(torch.exp(x * 0.01)) * 2 + 1)
    assert_close(torch.atan2(x.to("tpu"), x.to("tpu") * 0.5 + 1), torch.atan2(x, x * 0.5 + 1))

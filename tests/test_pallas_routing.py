"""Routing of SDPA and mm/addmm/bmm to the Pallas kernels (interpret mode on CPU).

Counters count routing decisions made while tracing ("calls traced", see
``lazyrt.lowering.pallas_router``): > 0 means a kernel is in the compiled code.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from _util import assert_close

import lazyrt
from lazyrt import metrics

pytestmark = pytest.mark.sweep(every=4)

RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture
def pallas():
    """``pallas(policy)``: set the policy for the test, reset counters; restored after."""
    prev = lazyrt.config.pallas

    def set_(p):
        lazyrt.set_pallas(p)
        metrics.reset()

    yield set_
    lazyrt.set_pallas(prev)


def _counts():
    c = metrics.counters()
    return c["pallas_attention_calls"], c["pallas_matmul_calls"], c["pallas_fallbacks"]


def _run(mode, fn):
    if mode == "defer":
        with lazyrt.set_mode("defer"):
            out = fn()
            out = [t.cpu() if isinstance(t, torch.Tensor) else t for t in out]
        return out
    return [t.cpu() if isinstance(t, torch.Tensor) else t for t in fn()]


# ---------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------

def _sdpa_case(name, gen):
    b, hq, L, S, e = 2, 4, 8, 11, 16
    hkv = 2 if "gqa" in name else hq
    if "causal" in name:
        S = L
    q = torch.randn(b, hq, L, e, generator=gen)
    k = torch.randn(b, hkv, S, e, generator=gen)
    v = torch.randn(b, hkv, S, e, generator=gen)
    kw = {}
    if "causal" in name:
        kw["is_causal"] = True
    if "bool" in name:
        m = torch.rand(L, S, generator=gen) > 0.3
        m[3] = False  # a fully masked row: zeros, no NaN
        kw["attn_mask"] = m
    if "float" in name:
        kw["attn_mask"] = torch.randn(b, 1, L, S, generator=gen)
    if "gqa" in name:
        kw["enable_gqa"] = True
    if "scale" in name:
        kw["scale"] = 0.3
    return q, k, v, kw


def _sdpa_fwd_bwd(q, k, v, kw, device):
    q, k, v = [t.detach().to(device).requires_grad_() for t in (q, k, v)]
    kw = {n: (a.to(device) if isinstance(a, torch.Tensor) else a) for n, a in kw.items()}
    out = F.scaled_dot_product_attention(q, k, v, **kw)
    (out * out).sum().backward()
    return out, q.grad, k.grad, v.grad


CASES = ["causal", "bool", "scale_float", "gqa_causal", "gqa_bool"]
# Every case in strict mode, a few in defer (interpret-mode kernels compile slowly).
MODE_CASES = [("strict", c) for c in CASES] + [("defer", "gqa_causal")]


@pytest.mark.parametrize("mode,case", MODE_CASES)
def test_sdpa_on_matches_cpu_and_uses_kernel(mode, pallas, case):
    gen = torch.Generator().manual_seed(hash(case) % 1000)
    q, k, v, kw = _sdpa_case(case, gen)
    expected = _sdpa_fwd_bwd(q, k, v, kw, "cpu")
    pallas("on")
    got = _run(mode, lambda: _sdpa_fwd_bwd(q, k, v, kw, "tpu"))
    assert_close(got, [t.detach() for t in expected], RTOL, ATOL)
    att, _, fb = _counts()
    assert att > 0 and fb == 0


@pytest.mark.parametrize("mode,policy", [("strict", "off"), ("defer", "off"), ("strict", "auto")])
def test_sdpa_off_and_auto_on_cpu_use_no_kernel(mode, pallas, policy):
    gen = torch.Generator().manual_seed(1)
    q, k, v, kw = _sdpa_case("gqa_causal", gen)
    expected = _sdpa_fwd_bwd(q, k, v, kw, "cpu")
    pallas(policy)
    got = _run(mode, lambda: _sdpa_fwd_bwd(q, k, v, kw, "tpu"))
    assert_close(got, [t.detach() for t in expected], RTOL, ATOL)
    assert _counts() == (0, 0, 0)


@pytest.mark.parametrize("mode", ["strict", "defer"])
@pytest.mark.parametrize("case", CASES)
def test_sdpa_math_path_gradients_match_cpu(mode, pallas, case):
    # The jnp path's backward reuses the forward's output and logsumexp (fully masked
    # rows included: their logsumexp is -inf); GQA sums the repeated heads back.
    gen = torch.Generator().manual_seed(10 + CASES.index(case))
    q, k, v, kw = _sdpa_case(case, gen)
    expected = _sdpa_fwd_bwd(q, k, v, kw, "cpu")
    pallas("off")
    got = _run(mode, lambda: _sdpa_fwd_bwd(q, k, v, kw, "tpu"))
    assert_close(got, [t.detach() for t in expected], RTOL, ATOL)


@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_sdpa_math_path_mask_and_3d_gradients(mode, pallas):
    # A float mask that wants its own gradient, and 3-D (unbatched) inputs.
    gen = torch.Generator().manual_seed(20)
    pallas("off")
    q, k, v = (torch.randn(2, 5, 8, 16, generator=gen) for _ in range(3))
    m = torch.randn(2, 1, 8, 8, generator=gen)

    def fwd_bwd(device):
        ts = [t.detach().to(device).requires_grad_() for t in (q, k, v, m)]
        out = F.scaled_dot_product_attention(*ts[:3], attn_mask=ts[3])
        (out * out).sum().backward()
        q3, k3, v3 = [t[0].detach().to(device).requires_grad_() for t in (q, k, v)]
        out3 = F.scaled_dot_product_attention(q3, k3, v3, is_causal=True)
        (out3 * out3).sum().backward()
        return [out, *(t.grad for t in ts), out3, q3.grad, k3.grad, v3.grad]

    expected = fwd_bwd("cpu")
    got = _run(mode, lambda: fwd_bwd("tpu"))
    assert_close(got, [t.detach() for t in expected], RTOL, ATOL)


@pytest.mark.parametrize("mode", ["strict", "defer"])
@pytest.mark.parametrize("shape", [
    (1, 2, 128, 16, 2),   # 2 blocks of 64 rows
    (1, 4, 200, 8, 2),    # 4 blocks, the last one of 8 rows; GQA 4 -> 2 heads
    (1, 1, 640, 8, 1),    # 5 blocks of 128
])
def test_sdpa_causal_row_blocks_match_cpu(mode, pallas, shape):
    # A causal call with as many queries as keys runs in row blocks that skip the masked
    # upper triangle (attention._causal_blocks); output and every gradient match CPU's.
    from lazyrt.lowering.attention import _causal_blocks

    gen = torch.Generator().manual_seed(sum(shape))
    b, hq, n, e, hkv = shape
    q = torch.randn(b, hq, n, e, generator=gen)
    k, v = (torch.randn(b, hkv, n, e, generator=gen) for _ in range(2))
    kw = {"is_causal": True, "enable_gqa": hkv != hq}
    blocks = _causal_blocks(q.numpy(), k.numpy(), None, True)
    assert blocks is not None and len(blocks) > 1 and blocks[-1][1] == q.shape[-2]
    expected = _sdpa_fwd_bwd(q, k, v, kw, "cpu")
    pallas("off")
    got = _run(mode, lambda: _sdpa_fwd_bwd(q, k, v, kw, "tpu"))
    assert_close(got, [t.detach() for t in expected], RTOL, ATOL)


def test_sdpa_causal_row_blocks_bfloat16(pallas):
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 256, 16, generator=gen).bfloat16() for _ in range(3))
    kw = {"is_causal": True}
    expected = _sdpa_fwd_bwd(q.float(), k.float(), v.float(), kw, "cpu")
    pallas("off")
    got = _run("strict", lambda: _sdpa_fwd_bwd(q, k, v, kw, "tpu"))
    assert all(t.dtype == torch.bfloat16 for t in got)
    assert_close([t.float() for t in got], [t.detach() for t in expected], 2e-2, 2e-2)


def test_sdpa_unsupported_shape_falls_back(mode, pallas):
    # head_dim 272 > the kernel's 256: the fused op's lowering takes the jnp path.
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 5, 272, generator=gen) for _ in range(3))
    kw = {"is_causal": True}
    expected = _sdpa_fwd_bwd(q, k, v, kw, "cpu")
    pallas("on")
    got = _run(mode, lambda: _sdpa_fwd_bwd(q, k, v, kw, "tpu"))
    # (row 0 of a causal dq is exactly 0; CPU's is rounding noise of ~1e-5 at d=272)
    assert_close(got, [t.detach() for t in expected], RTOL, 1e-4)
    att, _, fb = _counts()
    assert att == 0 and fb > 0


def test_sdpa_dropout_and_3d_take_math_path(pallas):
    pallas("on")
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 6, 16, generator=gen) for _ in range(3))  # 3-D
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    got = F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"), is_causal=True)
    assert_close(got, expected, RTOL, ATOL)
    assert _counts()[0] == 0 and _counts()[2] == 1


def test_sdpa_errors_still_raise(pallas):
    pallas("on")
    q = torch.randn(1, 4, 8, 16, device="tpu")
    k = torch.randn(1, 2, 8, 16, device="tpu")
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, k)  # GQA shapes without enable_gqa


def test_flash_and_efficient_ops_direct(pallas):
    """The flash/efficient ATen ops, called directly on tpu, run the kernel too."""
    pallas("on")
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 8, 16, generator=gen) for _ in range(3))
    aten = torch.ops.aten
    exp = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = aten._scaled_dot_product_flash_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"), 0.0, True)
    assert_close(out[0], exp, RTOL, ATOL)
    lse = torch.logsumexp((q @ k.transpose(-1, -2) / 4).masked_fill(
        torch.ones(8, 8, dtype=torch.bool).triu(1), float("-inf")), -1)
    assert_close(out[1], lse, RTOL, ATOL)
    out = aten._scaled_dot_product_efficient_attention(
        q.to("tpu"), k.to("tpu"), v.to("tpu"), None, False, 0.0, True)
    assert_close(out[0], exp, RTOL, ATOL)
    assert _counts()[0] > 0


# ---------------------------------------------------------------------------
# matmul
# ---------------------------------------------------------------------------

def _mm_ops(a, b, bias, bb1, bb2):
    return [torch.mm(a, b), torch.addmm(bias, a, b), torch.bmm(bb1, bb2)]


def _mm_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(13, 37, generator=g), torch.randn(37, 20, generator=g),
            torch.randn(20, generator=g), torch.randn(3, 9, 17, generator=g),
            torch.randn(3, 17, 5, generator=g))


def test_matmul_on_routes_and_matches(mode, pallas):
    ins = _mm_inputs()
    expected = _mm_ops(*ins)
    pallas("on")
    got = _run(mode, lambda: _mm_ops(*[t.to("tpu") for t in ins]))
    assert_close(got, expected, RTOL, ATOL)
    _, mm, fb = _counts()
    assert mm >= 3 and fb == 0


@pytest.mark.parametrize("mode,policy", [("strict", "off"), ("defer", "off"), ("strict", "auto")])
def test_matmul_off_and_auto_on_cpu(mode, pallas, policy):
    ins = _mm_inputs(1)
    expected = _mm_ops(*ins)
    pallas(policy)
    got = _run(mode, lambda: _mm_ops(*[t.to("tpu") for t in ins]))
    assert_close(got, expected, RTOL, ATOL)
    assert _counts() == (0, 0, 0)


def test_policy_change_retraces(pallas, monkeypatch):
    # (no disk cache: a program found there by its signature is not traced, and the
    # kernel calls counted here are counted when a program is traced)
    monkeypatch.setattr(lazyrt.config, "cache_dir", None)
    a, b = torch.randn(6, 7), torch.randn(7, 5)
    ta, tb = a.to("tpu"), b.to("tpu")
    pallas("on")
    torch.mm(ta, tb).cpu()
    assert _counts()[1] > 0
    pallas("off")
    torch.mm(ta, tb).cpu()
    assert _counts()[1] == 0
    pallas("on")  # the cached plan of the "off" run must not be reused
    assert_close(torch.mm(ta, tb), a @ b, RTOL, ATOL)
    assert _counts()[1] > 0


def test_matmul_unsupported_falls_back(mode, pallas):
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(4, 6, generator=g), torch.randn(6, 3, generator=g)
    full_bias = torch.randn(4, 3, generator=g)
    ad, bd = a.double(), b.double()

    def ops(a, b, full_bias, ad, bd):
        return [torch.addmm(full_bias, a, b),  # bias [M, N]: not the kernel's epilogue
                torch.mm(ad, bd)]  # float64

    expected = ops(a, b, full_bias, ad, bd)
    pallas("on")
    got = _run(mode, lambda: ops(*[t.to("tpu") for t in (a, b, full_bias, ad, bd)]))
    assert_close(got, expected, RTOL, ATOL)
    _, mm, fb = _counts()
    assert mm == 0 and fb >= 2


# ---------------------------------------------------------------------------
# end to end
# ---------------------------------------------------------------------------

class _Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class _GPT(nn.Module):
    def __init__(self, vocab=23, d=16, h=2, n=2, t=8):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.randn(t, d) * 0.02)
        self.blocks = nn.ModuleList(_Block(d, h) for _ in range(n))
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.emb(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)


def _train(policy, mode, steps=3):
    lazyrt.set_pallas(policy)
    torch.manual_seed(0)
    model = _GPT()
    g = torch.Generator().manual_seed(7)
    batches = [(torch.randint(0, 23, (2, 8), generator=g), torch.randint(0, 23, (2, 8), generator=g))
               for _ in range(steps)]
    model = model.to("tpu")
    # NOTE: SGD, not Adam: the k-projection bias has an analytically zero gradient
    # (softmax is shift invariant), and Adam would blow its rounding noise up to lr.
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    with lazyrt.set_mode(mode):
        for idx, tgt in batches:
            idx, tgt = idx.to("tpu"), tgt.to("tpu")
            loss = F.cross_entropy(model(idx).flatten(0, 1), tgt.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        losses = [loss.cpu() for loss in losses]
        params = [p.detach().cpu() for p in model.parameters()]
    return losses, params


def test_transformer_trains_same_with_and_without_kernels(mode, pallas):
    pallas("on")
    on = _train("on", mode)
    att, mm, _ = _counts()
    assert att > 0 and mm > 0
    off = _train("off", mode)
    assert_close(on, off, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------
# the measured routing table (lazyrt._base.backend_choices, "Pallas routing")
# ---------------------------------------------------------------------------

from lazyrt._base import backend_choices as choices  # noqa: E402
from lazyrt.lowering import pallas_router as router  # noqa: E402

_ALL_CLASSES = [(k, d, s) for k in choices.KERNELS for d in choices.DTYPE_CLASSES
                for s in choices.SIZE_CLASSES]


def test_table_has_a_row_naming_its_run_for_every_class():
    for p in choices.PLATFORMS:
        for k, d, s in _ALL_CLASSES:
            r = choices.PALLAS_ROUTING[p, k, d, s]
            assert r.order[-1] == "xla" and r.run in choices.PALLAS_RUNS
    assert len(choices.PALLAS_ROUTING) == len(choices.PLATFORMS) * len(_ALL_CLASSES)
    with pytest.raises(ValueError):
        choices.Route(("pallas",), "unmeasured")  # must end with XLA's path
    with pytest.raises(ValueError):
        choices.Route(("xla",), "no such run")


def test_table_gpu_choices_per_class():
    # The H200 run timed the kernels 14-19x slower than XLA (large float32 GPT): XLA; no
    # class was measured faster, so no GPU row runs a kernel; half-precision attention
    # tries cuDNN first.
    for k, d, s in _ALL_CLASSES:
        r = choices.PALLAS_ROUTING["gpu", k, d, s]
        assert "pallas" not in r.order
        want = ("cudnn", "xla") if (k, d) == ("attention", "half") else ("xla",)
        assert r.order == want, (k, d, s)
    assert choices.PALLAS_ROUTING["gpu", "matmul", "float32", "large"].run == "h200-2026-12-03"
    assert choices.PALLAS_ROUTING["gpu", "attention", "float32", "large"].run == "h200-2026-12-03"
    assert choices.PALLAS_ROUTING["gpu", "matmul", "half", "small"].run == "unmeasured"
    assert not choices.uses_pallas("gpu") and not choices.uses_pallas("cuda")


def test_table_tpu_and_cpu_choices_per_class():
    for k, d, s in _ALL_CLASSES:
        tpu = choices.PALLAS_ROUTING["tpu", k, d, s]
        assert tpu.order == ("xla",) and tpu.run == "unmeasured"  # no TPU run yet
        cpu = choices.PALLAS_ROUTING["cpu", k, d, s]
        assert cpu.order == ("xla",) and cpu.run == "interpret-only"
    assert not choices.uses_pallas("tpu") and not choices.uses_pallas("cpu")
    assert "| gpu | attention | half | large | cudnn > xla |" in choices.pallas_table_markdown()


def test_table_classes():
    import jax.numpy as jnp

    assert choices.dtype_class(jnp.bfloat16) == choices.dtype_class(jnp.float16) == "half"
    assert choices.dtype_class(jnp.float32) == "float32"
    # the measured d1024 GPT's matmuls and attention are large, the small GPT's small
    assert choices.size_class(16 * 512 * 1024 * 3072) == "large"
    assert choices.size_class(16 * 16 * 512 * 64 * 512) == "large"
    assert choices.size_class(8 * 128 * 256 * 768) == "small"
    assert choices.platform_class("cuda") == choices.platform_class("rocm") == "gpu"


@pytest.fixture
def as_gpu(monkeypatch, pallas):
    """The router believing it runs on a GPU whose cuDNN attention works (its probe and
    head-dim limit stubbed); ``jax.nn.dot_product_attention`` runs its XLA implementation,
    so the cuDNN route's code path runs on the CPU. Every compiled plan and executable is
    dropped before and after, so no other test sees this routing."""
    from lazyrt._ops.control import invalidate_compiled

    invalidate_compiled(None)
    monkeypatch.setattr(router, "_backend", lambda: "gpu")
    monkeypatch.setattr(router, "cudnn_ok", lambda: True)
    monkeypatch.setattr(router, "_cudnn_max_head_dim", lambda: 256)
    monkeypatch.setattr(router, "CUDNN_IMPLEMENTATION", "xla")
    calls = {"fwd": 0, "bwd": 0}
    fwd, bwd = router.cudnn_attention, router.cudnn_attention_vjp

    def spy_fwd(*a, **kw):
        calls["fwd"] += 1
        return fwd(*a, **kw)

    def spy_bwd(*a, **kw):
        calls["bwd"] += 1
        return bwd(*a, **kw)

    monkeypatch.setattr(router, "cudnn_attention", spy_fwd)
    monkeypatch.setattr(router, "cudnn_attention_vjp", spy_bwd)
    yield calls
    monkeypatch.undo()
    invalidate_compiled(None)


def test_auto_on_gpu_routes_by_table(as_gpu, pallas):
    import jax.numpy as jnp

    pallas("auto")
    f32 = jnp.zeros((2, 4, 128, 64), jnp.float32)
    bf = f32.astype(jnp.bfloat16)
    kv = jnp.zeros((2, 2, 128, 64), jnp.bfloat16)
    assert not router.active()
    assert router.matmul(jnp.zeros((64, 32)), jnp.zeros((32, 16))) is None
    assert router.attention_route(f32, f32, f32, None, True) == "xla"
    assert router.attention_route(bf, kv, kv, None, True) == "cudnn"  # GQA 4/2, causal
    assert router.attention_route(bf, bf, bf, jnp.ones((128, 128), bool), False) == "xla"
    short = jnp.zeros((2, 4, 100, 64), jnp.bfloat16)
    assert router.attention_route(short, bf, bf, None, True) == "xla"  # causal, L != S
    assert router.attention_route(short, bf, bf, None, False) == "cudnn"
    wide = jnp.zeros((1, 2, 16, 272), jnp.bfloat16)
    assert router.attention_route(wide, wide, wide, None, False) == "xla"  # head dim > 256
    assert _counts() == (0, 0, 0)
    # ``on``: the kernel first wherever it fits; ``off``: cuDNN, else XLA
    pallas("on")
    assert router.attention_route(bf, kv, kv, None, True) == "pallas"
    assert router.attention_route(wide, wide, wide, None, False) == "xla"
    assert _counts() == (1, 0, 1)
    pallas("off")
    assert router.attention_route(bf, kv, kv, None, True) == "cudnn"
    assert router.attention_route(f32, f32, f32, None, True) == "xla"


def test_sdpa_cudnn_route_matches_cpu(mode, as_gpu, pallas):
    # The cuDNN route's code path (layout, GQA, scale, logsumexp, backward by the VJP),
    # run with JAX's XLA implementation on the CPU: bfloat16 against PyTorch CPU in float32.
    pallas("auto")
    gen = torch.Generator().manual_seed(30)
    q = torch.randn(2, 4, 16, 16, generator=gen)
    k, v = (torch.randn(2, 2, 16, 16, generator=gen) for _ in range(2))
    kw = {"is_causal": True, "enable_gqa": True, "scale": 0.3}
    expected = _sdpa_fwd_bwd(q, k, v, kw, "cpu")
    got = _run(mode, lambda: _sdpa_fwd_bwd(q.bfloat16(), k.bfloat16(), v.bfloat16(), kw, "tpu"))
    assert all(t.dtype == torch.bfloat16 for t in got)
    # (bfloat16 keeps 8 bits: gradients of ~2.5 land within ~0.06 of float32's)
    assert_close([t.float() for t in got], [t.detach() for t in expected], 3e-2, 8e-2)
    assert as_gpu["fwd"] > 0 and as_gpu["bwd"] > 0
    # float32 takes the jnp path, with the same results as before
    as_gpu.update(fwd=0, bwd=0)
    got = _run(mode, lambda: _sdpa_fwd_bwd(q, k, v, kw, "tpu"))
    assert_close(got, [t.detach() for t in expected], RTOL, ATOL)
    assert as_gpu == {"fwd": 0, "bwd": 0}


def test_kernels_pick_triton_while_jax_has_it(monkeypatch):
    # Mosaic GPU (Pallas's default GPU lowering) has no dot_general rule: the kernels ask
    # for Triton where JAX still has it, else report no GPU backend (the router then runs
    # XLA's path on a GPU).
    from kernels_pallas import _common

    _common.gpu_backend.cache_clear()
    try:
        assert _common.gpu_backend() == "triton"
        monkeypatch.setenv("KERNELS_PALLAS_GPU_BACKEND", "none")
        _common.gpu_backend.cache_clear()
        assert _common.gpu_backend() is None
        assert _common.compiled_backend_available()  # (the CPU interprets them)
        monkeypatch.setattr(_common.jax, "default_backend", lambda: "gpu")
        assert not _common.compiled_backend_available()
        import kernels_pallas as kp

        assert not kp.supports_matmul((8, 8), (8, 8), "float32")
        with pytest.raises(NotImplementedError):
            _common.compiler_params(False)
        assert _common.compiler_params(True) is None  # interpret mode needs none
    finally:
        monkeypatch.undo()
        _common.gpu_backend.cache_clear()

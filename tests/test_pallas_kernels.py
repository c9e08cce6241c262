"""Tests for the Pallas kernels in ``kernels_pallas``.

On CPU the kernels run in Pallas interpret mode; on gpu/tpu the same test classes run
them compiled (``INTERPRET = False``), and the ``*Interpret`` subclasses (marked slow
there) re-run everything interpreted. Every case is checked against the plain-jnp
``*_reference`` and, for attention and the MLP epilogue, against PyTorch CPU.

Shapes stay small (seq <= 64, head_dim <= 32): interpret mode is slow and each distinct
configuration compiles once. The exhaustive sweeps are ``@pytest.mark.slow``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kernels_pallas as kp

pytestmark = pytest.mark.sweep(every=4)

ACCELERATOR = jax.default_backend() in ("gpu", "tpu")

# Tolerances, relative to the largest magnitude of the expected value.
TOL = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 5e-3}


def _np32(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().float().numpy()
    return np.asarray(jnp.asarray(x, jnp.float32))


def assert_close(actual, expected, tol: float, what: str = "") -> None:
    a, e = _np32(actual), _np32(expected)
    assert a.shape == e.shape, (what, a.shape, e.shape)
    assert np.isfinite(a).all(), f"{what}: non-finite values"
    scale = max(1.0, float(np.abs(e).max(initial=0.0)))
    np.testing.assert_allclose(a, e, rtol=tol, atol=tol * scale, err_msg=what)


def _to_torch(x) -> torch.Tensor:
    x = jnp.asarray(x)
    if x.dtype == jnp.bfloat16:
        return torch.from_numpy(np.array(x.astype(jnp.float32))).to(torch.bfloat16)
    return torch.from_numpy(np.array(x))


# ---------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------


SMALL_TILES = kp.BlockSizes(16, 16)


@dataclasses.dataclass(frozen=True)
class AttnCase:
    name: str
    batch: int = 2
    q_heads: int = 2
    kv_heads: int = 2
    q_len: int = 32
    kv_len: int = 32
    head_dim: int = 16
    causal: bool = False
    mask: str | None = None  # None | "bool" | "bool_empty_row" | "additive" | "additive_-inf"
    mask_shape: str = "b1qk"  # which of [b, h, q, k] the mask spans ("1" = broadcast)
    scale: float | None = None
    dtype: str = "float32"
    blocks: kp.BlockSizes = SMALL_TILES

    def __str__(self) -> str:
        return self.name


ATTN_CASES = [
    AttnCase("basic"),
    AttnCase("odd_lengths_gqa", q_heads=4, kv_heads=2, q_len=37, kv_len=53),
    AttnCase("causal_odd_gqa", q_heads=4, kv_heads=2, q_len=37, kv_len=53, causal=True),
    AttnCase("causal_q_longer", q_len=40, kv_len=24, causal=True, head_dim=32),
    AttnCase("bool_mask_empty_row", q_heads=4, kv_heads=2, q_len=37, kv_len=53,
             mask="bool_empty_row"),
    AttnCase("bool_mask_causal_per_head", q_heads=4, kv_heads=1, q_len=24, kv_len=40,
             causal=True, mask="bool", mask_shape="bhqk"),
    AttnCase("additive_mask_per_head", q_heads=4, kv_heads=2, q_len=21, kv_len=35,
             mask="additive", mask_shape="hqk"),
    AttnCase("additive_-inf_keys_1d_mask_d8", batch=1, q_len=19, kv_len=29, head_dim=8,
             mask="additive_-inf", mask_shape="k"),
    AttnCase("head_dim_24_scale", head_dim=24, q_len=20, kv_len=20, scale=0.3),
    AttnCase("bwd_blocks_differ", q_heads=2, kv_heads=1, q_len=45, kv_len=45, causal=True,
             blocks=kp.BlockSizes(16, 32, block_q_bwd=32, block_k_bwd=16)),
    AttnCase("default_blocks", batch=1, q_len=50, kv_len=64, blocks=kp.BlockSizes()),
    AttnCase("bf16_causal_gqa", q_heads=4, kv_heads=2, q_len=37, kv_len=53, causal=True,
             dtype="bfloat16"),
    AttnCase("bf16_bool_mask", q_len=33, kv_len=20, mask="bool", dtype="bfloat16"),
    AttnCase("fp16_additive", batch=1, q_len=30, kv_len=30, mask="additive",
             dtype="float16"),
]


def _make_attention_inputs(case: AttnCase, seed: int = 0):
    rng = np.random.default_rng(seed)
    dt = jnp.dtype(case.dtype)

    def rand(*shape):
        return jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(dt)

    q = rand(case.batch, case.q_heads, case.q_len, case.head_dim)
    k = rand(case.batch, case.kv_heads, case.kv_len, case.head_dim)
    v = rand(case.batch, case.kv_heads, case.kv_len, case.head_dim)
    do = rand(case.batch, case.q_heads, case.q_len, case.head_dim)
    mask = None
    if case.mask is not None:
        full = {"b": case.batch, "h": case.q_heads, "q": case.q_len, "k": case.kv_len}
        shape = tuple(full.get(c, 1) for c in case.mask_shape)
        if case.mask.startswith("bool"):
            mask = rng.random(shape) > 0.3
            if case.mask == "bool_empty_row":
                mask[..., 3, :] = False  # query row 3 sees no key at all
            mask = jnp.asarray(mask)
        else:
            mask = rng.standard_normal(shape).astype(np.float32)
            if case.mask == "additive_-inf":
                mask[..., 1::3] = -np.inf  # masked keys, shared by all rows
            mask = jnp.asarray(mask).astype(dt)
    return q, k, v, do, mask


# NOTE: forward and backward under one jit: one compile per case instead of an eager
# backward that compiles each small op separately (interpret mode is compile-bound).
@functools.partial(jax.jit, static_argnames=("causal", "scale", "block_sizes", "interpret"))
def _kernel_vjp(q, k, v, do, mask, *, causal, scale, block_sizes, interpret):
    fn = functools.partial(kp.flash_attention, causal=causal, scale=scale,
                           block_sizes=block_sizes, interpret=interpret)
    out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, mask), q, k, v)
    return (out, *vjp(do))


@functools.partial(jax.jit, static_argnames=("causal", "scale"))
def _reference_vjp(q, k, v, do, mask, *, causal, scale):
    # NOTE: the oracle runs in float32 on the (possibly bf16) inputs, so a low-precision
    # kernel is compared with the exact answer rather than another low-precision one.
    f32 = lambda x: x.astype(jnp.float32)
    fn = functools.partial(kp.flash_attention_reference, causal=causal, scale=scale)
    out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, mask), f32(q), f32(k), f32(v))
    return (out, *vjp(f32(do)))


def _torch_sdpa(q, k, v, do, mask, *, causal, scale):
    tq, tk, tv = (_to_torch(x).requires_grad_() for x in (q, k, v))
    tmask = None if mask is None else _to_torch(mask)
    if tmask is not None and tmask.ndim < 2:  # torch wants a mask of rank >= 2
        tmask = tmask.reshape((1,) * (2 - tmask.ndim) + tuple(tmask.shape))
    out = F.scaled_dot_product_attention(
        tq, tk, tv, attn_mask=tmask, is_causal=causal, scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    out.backward(_to_torch(do))
    return out, tq.grad, tk.grad, tv.grad


class TestFlashAttention:
    INTERPRET = kp.default_interpret()

    def _run(self, case: AttnCase):
        q, k, v, do, mask = _make_attention_inputs(case)
        got = _kernel_vjp(q, k, v, do, mask, causal=case.causal, scale=case.scale,
                          block_sizes=case.blocks, interpret=self.INTERPRET)
        return (q, k, v, do, mask), got

    @pytest.mark.sweep(every=4)
    @pytest.mark.parametrize("case", ATTN_CASES, ids=str)
    def test_forward_and_grads(self, case: AttnCase):
        (q, k, v, do, mask), got = self._run(case)
        tol = TOL[case.dtype]
        assert got[0].dtype == q.dtype and got[0].shape == q.shape
        for g, x in zip(got[1:], (q, k, v)):
            assert g.dtype == x.dtype and g.shape == x.shape
        names = ("out", "dq", "dk", "dv")
        ref = _reference_vjp(q, k, v, do, mask, causal=case.causal, scale=case.scale)
        for name, a, e in zip(names, got, ref):
            assert_close(a, e, tol, f"{case}: {name} vs reference")
        # PyTorch CPU SDPA runs in the inputs' dtype (bf16/fp16 included).
        want = _torch_sdpa(q, k, v, do, mask, causal=case.causal, scale=case.scale)
        for name, a, e in zip(names, got, want):
            assert_close(a, e, 2 * tol, f"{case}: {name} vs torch SDPA")

    def test_fully_masked_rows_are_zero(self):
        case = AttnCase("empty", batch=1, q_heads=2, kv_heads=1, q_len=20, kv_len=20,
                        mask="bool_empty_row")
        _, (out, dq, dk, dv) = self._run(case)
        np.testing.assert_array_equal(_np32(out)[:, :, 3], 0.0)
        np.testing.assert_array_equal(_np32(dq)[:, :, 3], 0.0)
        for g in (out, dq, dk, dv):
            assert np.isfinite(_np32(g)).all()

    def test_gqa_matches_repeated_kv(self):
        case = AttnCase("gqa", batch=1, q_heads=4, kv_heads=2, q_len=20, kv_len=28)
        q, k, v, _, _ = _make_attention_inputs(case)
        blocks = case.blocks
        out = kp.flash_attention(q, k, v, block_sizes=blocks, interpret=self.INTERPRET)
        rep = kp.flash_attention(
            q, jnp.repeat(k, 2, axis=1), jnp.repeat(v, 2, axis=1),
            block_sizes=blocks, interpret=self.INTERPRET,
        )
        assert_close(out, rep, 1e-6, "gqa vs repeated kv")

    def test_jit_and_grad_compose(self):
        case = AttnCase("jit", batch=1, q_len=16, kv_len=16)
        q, k, v, _, _ = _make_attention_inputs(case)
        loss = lambda q, k, v: jnp.sum(
            kp.flash_attention(q, k, v, causal=True, block_sizes=case.blocks,
                               interpret=self.INTERPRET) ** 2)
        g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
        ref = jax.grad(
            lambda q, k, v: jnp.sum(kp.flash_attention_reference(q, k, v, causal=True) ** 2),
            argnums=(0, 1, 2),
        )(q, k, v)
        for a, e in zip(g, ref):
            assert_close(a, e, TOL["float32"], "jit(grad)")


@pytest.mark.slow
@pytest.mark.parametrize(
    "q_len,kv_len,causal,groups,block",
    list(itertools.product([1, 15, 16, 17, 64], [1, 16, 31, 64], [False, True], [1, 2],
                           [16, 32])),
)
def test_attention_sweep(q_len, kv_len, causal, groups, block):
    case = AttnCase("sweep", batch=1, q_heads=2 * groups, kv_heads=2, q_len=q_len,
                    kv_len=kv_len, causal=causal, blocks=kp.BlockSizes(block, block))
    TestFlashAttention().test_forward_and_grads(case)


# ---------------------------------------------------------------------------------------
# Matmul
# ---------------------------------------------------------------------------------------

SMALL = kp.MatmulBlockSizes(16, 16, 16)


def _rand(rng, shape, dtype="float32"):
    return jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(jnp.dtype(dtype))


# NOTE: interpret=None here selects the jnp oracle (matmul_reference), anything else the
# kernel; forward and backward share one jit (interpret mode is compile-bound).
@functools.partial(jax.jit, static_argnames=("activation", "out_dtype", "interpret"))
def _matmul_vjp(a, b, bias, g, *, activation, interpret, out_dtype=None):
    if interpret is None:
        fn = functools.partial(kp.matmul_reference, activation=activation, out_dtype=out_dtype)
    else:
        fn = functools.partial(kp.batched_matmul if a.ndim == 3 else kp.matmul,
                               activation=activation, out_dtype=out_dtype,
                               block_sizes=SMALL, interpret=interpret)
    out, vjp = jax.vjp(lambda a, b, bias: fn(a, b, bias=bias), a, b, bias)
    return (out, *vjp(g.astype(out.dtype)))


class TestMatmul:
    INTERPRET = kp.default_interpret()

    @pytest.mark.parametrize(
        "m,k,n", [(16, 16, 16), (37, 53, 29), (1, 70, 5), (64, 128, 48)],
        ids=lambda s: str(s),
    )
    def test_matches_jnp_dot_highest(self, m, k, n):
        rng = np.random.default_rng(m * 1000 + n)
        a, b = _rand(rng, (m, k)), _rand(rng, (k, n))
        got = kp.matmul(a, b, block_sizes=SMALL, interpret=self.INTERPRET)
        want = jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST)
        assert got.dtype == jnp.float32 and got.shape == (m, n)
        # Relative to the output scale (blocked summation reorders the K sum).
        assert_close(got, want, 1e-5, "matmul vs jnp.dot")

    @pytest.mark.parametrize("activation", [None, "relu", "silu", "gelu", "gelu_tanh"])
    def test_epilogue_and_grads(self, activation):
        rng = np.random.default_rng(7)
        a, b, bias = _rand(rng, (37, 45)), _rand(rng, (45, 21)), _rand(rng, (21,))
        g = _rand(rng, (37, 21))
        got = _matmul_vjp(a, b, bias, g, activation=activation, interpret=self.INTERPRET)
        want = _matmul_vjp(a, b, bias, g, activation=activation, interpret=None)
        for name, x, y in zip(("out", "da", "db", "dbias"), got, want):
            assert_close(x, y, TOL["float32"], f"{activation}: {name}")

    def test_addmm_gelu_matches_torch(self):
        rng = np.random.default_rng(3)
        a, b, bias = _rand(rng, (24, 40)), _rand(rng, (40, 36)), _rand(rng, (36,))
        got = kp.matmul(a, b, bias=bias, activation="gelu", block_sizes=SMALL,
                        interpret=self.INTERPRET)
        want = F.gelu(torch.addmm(_to_torch(bias), _to_torch(a), _to_torch(b)))
        assert_close(got, want, TOL["float32"], "addmm+gelu vs torch")

    @pytest.mark.parametrize("out_dtype", [None, "float32"])
    def test_bf16(self, out_dtype):
        rng = np.random.default_rng(11)
        a, b = _rand(rng, (33, 40), "bfloat16"), _rand(rng, (40, 17), "bfloat16")
        bias, g = _rand(rng, (17,), "bfloat16"), _rand(rng, (33, 17))
        got = _matmul_vjp(a, b, bias, g, activation="gelu_tanh", out_dtype=out_dtype,
                          interpret=self.INTERPRET)
        assert got[0].dtype == (jnp.bfloat16 if out_dtype is None else jnp.float32)
        assert [x.dtype for x in got[1:]] == [jnp.bfloat16] * 3
        # The oracle: float32 math on the same (bf16-representable) values.
        f32 = [x.astype(jnp.float32) for x in (a, b, bias)]
        want = _matmul_vjp(*f32, g, activation="gelu_tanh", interpret=None)
        for name, x, y in zip(("out", "da", "db", "dbias"), got, want):
            assert_close(x, y, TOL["bfloat16"], f"bf16 {name}")

    def test_batched(self):
        rng = np.random.default_rng(5)
        a, b = _rand(rng, (3, 20, 30)), _rand(rng, (3, 30, 12))
        bias, g = _rand(rng, (12,)), _rand(rng, (3, 20, 12))
        got = _matmul_vjp(a, b, bias, g, activation="silu", interpret=self.INTERPRET)
        want = _matmul_vjp(a, b, bias, g, activation="silu", interpret=None)
        assert got[0].shape == (3, 20, 12)
        for name, x, y in zip(("out", "da", "db", "dbias"), got, want):
            assert_close(x, y, TOL["float32"], f"bmm {name}")
        torch_out = F.silu(torch.bmm(_to_torch(a), _to_torch(b)) + _to_torch(bias))
        assert_close(got[0], torch_out, TOL["float32"], "bmm vs torch")


@pytest.mark.slow
@pytest.mark.parametrize(
    "m,k,n,activation,dtype",
    list(itertools.product([1, 16, 31, 100], [1, 17, 64], [3, 16, 65], kp.ACTIVATIONS,
                           ["float32", "bfloat16"])),
)
def test_matmul_sweep(m, k, n, activation, dtype):
    rng = np.random.default_rng(0)
    a, b, bias = _rand(rng, (m, k), dtype), _rand(rng, (k, n), dtype), _rand(rng, (n,))
    got = kp.matmul(a, b, bias=bias, activation=activation, block_sizes=SMALL,
                    interpret=TestMatmul.INTERPRET)
    want = kp.matmul_reference(a, b, bias=bias, activation=activation, out_dtype="float32")
    assert_close(got, want, TOL[dtype], "sweep")


# ---------------------------------------------------------------------------------------
# On accelerators: the same classes again, interpreted (slow there; the default on CPU).
# ---------------------------------------------------------------------------------------

if ACCELERATOR:

    @pytest.mark.slow
    class TestFlashAttentionInterpret(TestFlashAttention):
        INTERPRET = True

    @pytest.mark.slow
    class TestMatmulInterpret(TestMatmul):
        INTERPRET = True


# ---------------------------------------------------------------------------------------
# Validation, predicates, configuration (no kernel runs)
# ---------------------------------------------------------------------------------------


def _zeros(shape, dtype="float32"):
    return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


def _attn_raises(q, k, v, mask=None, match=""):
    args = [jnp.zeros(s.shape, s.dtype) for s in (q, k, v)]
    m = None if mask is None else jnp.zeros(mask.shape, mask.dtype)
    with pytest.raises(ValueError, match=match):
        kp.flash_attention(*args, m)
    with pytest.raises(ValueError, match=match):
        kp.flash_attention_reference(*args, m)


@pytest.mark.parametrize(
    "q,k,v,mask,match",
    [
        ((2, 8, 16), (2, 8, 16), (2, 8, 16), None, "rank-4"),
        ((1, 2, 8, 16), (1, 2, 8, 32), (1, 2, 8, 32), None, "head_dim mismatch"),
        ((1, 3, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16), None, "must divide q_heads"),
        ((1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 9, 16), None, "k and v shapes differ"),
        ((2, 2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16), None, "batch mismatch"),
        ((1, 2, 8, 512), (1, 2, 8, 512), (1, 2, 8, 512), None, "head_dim=512"),
        ((1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16), (3, 8, 8), "not broadcastable"),
        ((1, 2, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16), (1, 1, 1, 2, 8, 8), "not broadcastable"),
    ],
)
def test_attention_shape_errors(q, k, v, mask, match):
    _attn_raises(_zeros(q), _zeros(k), _zeros(v), None if mask is None else _zeros(mask, "bool"),
                 match)
    assert not kp.supports_attention(q, k, "float32", v_shape=v, mask_shape=mask)


def test_attention_dtype_errors():
    s = (1, 2, 8, 16)
    _attn_raises(_zeros(s, "int32"), _zeros(s, "int32"), _zeros(s, "int32"),
                 match="unsupported dtype int32")
    _attn_raises(_zeros(s), _zeros(s, "bfloat16"), _zeros(s), match="dtypes differ")
    _attn_raises(_zeros(s), _zeros(s), _zeros(s), _zeros((8, 8), "int32"),
                 match="mask must be bool or floating")
    assert not kp.supports_attention(s, s, "int32")
    assert not kp.supports_attention(s, s, torch.int64)
    assert not kp.supports_attention(s, s, "float32", mask_shape=(8, 8), mask_dtype="int8")


def test_supports_attention_accepts():
    q, k = (2, 8, 37, 64), (2, 2, 53, 64)
    for dt in ("float32", jnp.bfloat16, np.float16, torch.bfloat16, torch.float32):
        assert kp.supports_attention(q, k, dt)
    assert kp.supports_attention(q, k, "float32", mask_shape=(37, 53))
    assert kp.supports_attention(q, k, "float32", mask_shape=(2, 1, 37, 53),
                                 mask_dtype="float32")
    # Never raises, even on junk.
    assert not kp.supports_attention(None, k, "float32")
    assert not kp.supports_attention(q, k, "not-a-dtype")
    assert not kp.supports_attention(q, (2, 2, 0, 64), "float32")


@pytest.mark.parametrize(
    "a,b,kwargs,match",
    [
        ((4, 8), (4, 8), {}, r"\[M, K\] @ \[K, N\]"),
        ((2, 4, 8), (8, 3), {}, r"a.shape=\(2, 4, 8\), b.shape=\(8, 3\)"),
        ((4, 8), (8, 3), {"bias": (4,)}, r"bias.shape=\(4,\)"),
        ((4, 8), (8, 3), {"activation": "tanh"}, "unknown activation"),
        ((4, 8), (8, 3), {"out_dtype": "int8"}, "unsupported out_dtype"),
    ],
)
def test_matmul_shape_errors(a, b, kwargs, match):
    if "bias" in kwargs:
        kwargs = {**kwargs, "bias": jnp.zeros(kwargs["bias"])}
    for fn in (kp.matmul, kp.matmul_reference):
        with pytest.raises(ValueError, match=match):
            fn(jnp.zeros(a), jnp.zeros(b), **kwargs)


def test_batched_matmul_errors():
    with pytest.raises(ValueError, match=r"\[B, M, K\] @ \[B, K, N\]"):
        kp.batched_matmul(jnp.zeros((2, 4, 8)), jnp.zeros((3, 8, 4)))
    with pytest.raises(ValueError, match=r"\[B, M, K\] @ \[B, K, N\]"):
        kp.batched_matmul(jnp.zeros((4, 8)), jnp.zeros((8, 4)))


def test_matmul_dtype_errors():
    with pytest.raises(ValueError, match="dtypes differ"):
        kp.matmul(jnp.zeros((4, 8)), jnp.zeros((8, 4), jnp.bfloat16))
    with pytest.raises(ValueError, match="unsupported dtype int32"):
        kp.matmul(jnp.zeros((4, 8), jnp.int32), jnp.zeros((8, 4), jnp.int32))


def test_supports_matmul():
    assert kp.supports_matmul((37, 53), (53, 29), "float32")
    assert kp.supports_matmul((3, 37, 53), (3, 53, 29), torch.bfloat16)
    assert not kp.supports_matmul((37, 53), (52, 29), "float32")
    assert not kp.supports_matmul((37, 53), (53, 29), "int8")
    assert not kp.supports_matmul((2, 3, 4, 5), (2, 3, 5, 4), "float32")
    assert not kp.supports_matmul(None, None, None)


@pytest.mark.parametrize("cls,kwargs", [
    (kp.BlockSizes, {"block_q": 0, "block_k": 16}),
    (kp.BlockSizes, {"block_q": 24, "block_k": 16}),
    (kp.BlockSizes, {"block_q": 16, "block_k": 16, "block_k_bwd": 3}),
    (kp.BlockSizes, {"block_q": 16.0, "block_k": 16}),
    (kp.MatmulBlockSizes, {"block_m": 48}),
    (kp.MatmulBlockSizes, {"block_k": True}),
])
def test_block_sizes_validate(cls, kwargs):
    with pytest.raises((ValueError, TypeError)):
        cls(**kwargs)


def test_block_sizes_frozen_and_hashable():
    bs = kp.BlockSizes(32, 64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        bs.block_q = 16  # type: ignore[misc]
    assert hash(bs) == hash(kp.BlockSizes(32, 64))
    assert hash(kp.MatmulBlockSizes()) == hash(kp.MatmulBlockSizes(128, 128, 64))


def test_default_interpret():
    assert kp.default_interpret() == (jax.default_backend() == "cpu")


def test_reference_fully_masked_row_is_zero():
    q = jnp.ones((1, 1, 2, 4))
    mask = jnp.array([[True, True], [False, False]])
    out = kp.flash_attention_reference(q, q, q, mask)
    np.testing.assert_array_equal(np.asarray(out[0, 0, 1]), 0.0)
    assert math.isfinite(float(out.sum()))

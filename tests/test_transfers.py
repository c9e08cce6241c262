"""Steady-state training steps make no implicit host-to-device transfer.

A Python scalar handed to an executable is an implicit transfer at every call (a
synchronous copy on a GPU). After warm-up, a training step runs under
``jax.transfer_guard_host_to_device("disallow")``, which raises on an implicit transfer
and lets explicit ones (``jax.device_put``) through, so a regression shows on the CPU.
Each step's losses are checked against PyTorch CPU eager.
"""
from __future__ import annotations

import math

import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lazyrt
from lazyrt._base.metrics import COUNTERS
from lazyrt._exec import scalars as _scalars

V, T, B, D = 32, 8, 2, 16


class Tiny(nn.Module):
    """Embeddings, a causal SDPA block, layer norm, a GELU MLP, a head."""

    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, D), nn.Embedding(T, D)
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, idx, pos):
        x = self.tok(idx) + self.pos(pos)
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True))
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return self.head(x)


OPTIMIZERS = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    "adamw_fused": lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3),
}


def _data():
    g = torch.Generator().manual_seed(0)
    d = torch.randint(0, V, (B, T + 1), generator=g)
    return d[:, :-1].contiguous(), d[:, 1:].contiguous(), torch.arange(T)


def _trainer(device: str, opt_name: str, compiled: bool = False):
    torch.manual_seed(0)
    model = Tiny()
    model = model.to(device)
    opt = OPTIMIZERS[opt_name](list(model.parameters()))
    idx, tgt, pos = (t.to(device) for t in _data())
    fwd = torch.compile(model) if compiled else model

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fwd(idx, pos).view(-1, V), tgt.view(-1))
        loss.backward()
        opt.step()
        return loss.item()

    return step


def _guarded(step, n: int) -> list:
    with jax.transfer_guard_host_to_device("disallow"):
        return [step() for _ in range(n)]


WARM, STEADY = 2, 2


@pytest.mark.parametrize("opt_name", ["adamw", "sgd_momentum",
                                      pytest.param("adamw_fused", marks=pytest.mark.slow)])
def test_steady_training_step_makes_no_implicit_transfer(mode, opt_name):
    ref = _trainer("cpu", opt_name)
    expected = [ref() for _ in range(WARM + STEADY)]
    step = _trainer("tpu", opt_name)
    got = [step() for _ in range(WARM)]
    got += _guarded(step, STEADY)
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-6)


@pytest.mark.usefixtures("fresh_dynamo")
def test_steady_compiled_step_makes_no_implicit_transfer(mode):
    ref = _trainer("cpu", "adamw")
    expected = [ref() for _ in range(WARM + STEADY)]
    step = _trainer("tpu", "adamw", compiled=True)
    got = [step() for _ in range(WARM)]
    got += _guarded(step, STEADY)
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-6)


def test_random_ops_get_a_fresh_seed_without_implicit_transfers(mode):
    """A random op's seed is a runtime scalar that never repeats: it travels explicitly,
    and each call draws a new mask."""
    x = torch.ones(64, 64, device="tpu")
    for _ in range(2):
        F.dropout(x, 0.5).cpu()
    with jax.transfer_guard_host_to_device("disallow"):
        a = F.dropout(x, 0.5).cpu()
        b = F.dropout(x, 0.5).cpu()
    for m in (a, b):
        assert set(m.unique().tolist()) <= {0.0, 2.0} and 0.3 < (m == 0).float().mean() < 0.7
    assert not torch.equal(a, b)


def test_repeated_scalars_stay_on_the_device():
    """A strict op's scalars: a value met again is not transferred again; a new value is
    one transfer per op, however many of the op's scalars hold it."""
    with lazyrt.set_mode("strict"):
        xs = [torch.full((3,), float(i + 1), device="tpu") for i in range(4)]
        ys = [x.clone() for x in xs]
        for _ in range(3):  # compile, then the value is kept from its second use
            torch._foreach_add_(ys, xs, alpha=0.25)
        n0 = COUNTERS["scalar_transfers"]
        with jax.transfer_guard_host_to_device("disallow"):
            torch._foreach_add_(ys, xs, alpha=0.25)
        assert COUNTERS["scalar_transfers"] == n0
        new = 1.0 + math.pi  # a value no other test uses
        with jax.transfer_guard_host_to_device("disallow"):
            torch._foreach_mul_(ys, [new] * len(ys))
        assert COUNTERS["scalar_transfers"] == n0 + 1
        got = [y.cpu() for y in ys]
    for g, i in zip(got, range(4)):
        want = torch.full((3,), float(i + 1))
        for _ in range(4):
            want = want + 0.25 * float(i + 1)
        torch.testing.assert_close(g, want * new, rtol=0, atol=0)


def test_a_flush_sends_its_scalars_once_and_only_when_they_change(compile_at_first_run):
    with lazyrt.set_mode("defer"):
        x = torch.ones(4, device="tpu")
        lazyrt.sync()

        def run(s):
            y = (x * s + 0.5).cpu()
            return y

        run(0.75), run(0.75)  # compiled, then the vector is on the device
        n0 = COUNTERS["scalar_transfers"]
        with jax.transfer_guard_host_to_device("disallow"):
            a = run(0.75)
            assert COUNTERS["scalar_transfers"] == n0
            b = run(1.25)
            assert COUNTERS["scalar_transfers"] == n0 + 1
    torch.testing.assert_close(a, torch.ones(4) * 0.75 + 0.5, rtol=0, atol=0)
    torch.testing.assert_close(b, torch.ones(4) * 1.25 + 0.5, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32,
                                   torch.int64])
def test_scalar_results_match_cpu_under_the_guard(mode, dtype):
    """Python scalars keep PyTorch's promotion and values (a float scalar does not widen a
    float16 tensor; on an int tensor it gives a float one), signed zeros included. (In
    float16/bfloat16 lazyrt rounds a scalar to the tensor's dtype where PyTorch computes
    in float32: one rounding apart, as before scalars moved to the device;
    tests/test_program_size.py.)"""
    x = torch.tensor([3, -2, 0, 7], dtype=dtype)
    ops = [lambda t: t * 0.1, lambda t: t + 3, lambda t: t * -0.0, lambda t: t * 0.0,
           lambda t: t.add(t, alpha=2), lambda t: torch.clamp(t, min=-1.5, max=2.5)]
    want = [f(x) for f in ops]
    t = x.to("tpu")
    for f in ops:  # warm-up: compile, and bring the values to the device
        f(t), f(t)
    lazyrt.sync()
    with jax.transfer_guard_host_to_device("disallow"):
        got = [f(t).cpu() for f in ops]
    tol = {torch.bfloat16: 1e-2, torch.float16: 1e-3}.get(dtype, 0)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=tol, atol=0)
        if w.is_floating_point():  # -0.0 and 0.0 apart
            assert torch.equal(torch.signbit(g), torch.signbit(w))


def test_store_keeps_values_by_kind_and_sign():
    st = _scalars.Store(jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    for _ in range(2):  # kept from the second use on
        a = st.put([1, 1.0, 0.0, -0.0])
    assert [str(x.dtype) for x in a] == ["int64", "float64", "float64", "float64"]
    assert [np.signbit(np.asarray(x)) for x in a[2:]] == [False, True]
    b = st.put([1, 1.0, 0.0, -0.0])
    assert all(x is y for x, y in zip(a, b))
    assert st.put([np.float32(1.0)]) is None  # not a Python scalar: the caller passes it

"""``lazyrt.jax_op``: a user's JAX (or Pallas) function as a torch op on tpu, against the
same math in PyTorch on CPU: values, gradients, errors; strict (one cached executable),
defer (one trace node), compiled (no graph break), a 2-device Mesh."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F
from _util import assert_close
from torch._dynamo.utils import counters

import lazyrt
from lazyrt import metrics

pytestmark = pytest.mark.sweep(every=2)


def _rms(x, w, eps: float = 1e-6):
    x32 = x.astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * r).astype(x.dtype) * w


def _rms_torch(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _gelu_linear(x, w, b):
    return jax.nn.gelu(x @ w.T + b, approximate=False)


def _gelu_linear_torch(x, w, b):
    return F.gelu(F.linear(x, w, b))


def _ste(x):
    return jnp.round(x)


def _ste_bwd(g, x):  # straight-through: the gradient passes unchanged
    return g


def _split_stats(x, k: int):
    return x[..., :k].sum(-1), x[..., k:] * 2.0


def _take_rows(table, idx):
    return table[idx] * 3.0


RMS = lazyrt.jax_op("lazyrt_test::rms_norm", _rms, static=("eps",))
GELU_LINEAR = torch.tpu.pallas.jax_op("lazyrt_test::gelu_linear", _gelu_linear)
STE = lazyrt.jax_op("lazyrt_test::ste_round", _ste, backward=_ste_bwd)
SPLIT = lazyrt.jax_op("lazyrt_test::split_stats", _split_stats, static=("k",), num_outputs=2)
TAKE = lazyrt.jax_op("lazyrt_test::take_rows", _take_rows)


def _scale_add(x, y, s: float = 2.0):
    return x * s + y


SCALE_ADD = lazyrt.jax_op("lazyrt_test::scale_add", _scale_add, static=("s",), donate=("x",))


def _leaves(*ts):
    cpu = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in ts]
    tpu = [t.detach().to("tpu").requires_grad_(t.is_floating_point()) for t in ts]
    return cpu, tpu


def _check_grads(cpu, tpu):
    for c, t in zip(cpu, tpu):
        if c.requires_grad:
            assert_close(t.grad.cpu(), c.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["rms", "gelu_linear"])
def test_values_and_gradients_match_cpu(mode, case):
    torch.manual_seed(0)
    if case == "rms":
        args = (torch.randn(4, 8), torch.randn(8))
        op, ref = (lambda x, w: RMS(x, w, eps=1e-5)), (lambda x, w: _rms_torch(x, w, 1e-5))
    else:
        args = (torch.randn(4, 8), torch.randn(16, 8), torch.randn(16))
        op, ref = GELU_LINEAR, _gelu_linear_torch
    cpu, tpu = _leaves(*args)
    want = ref(*cpu)
    (want * want).sum().backward()
    got = op(*tpu)
    assert got.device.type == "tpu" and got.shape == want.shape and got.dtype == want.dtype
    (got * got).sum().backward()
    assert_close(got.cpu(), want.detach(), rtol=1e-5, atol=1e-5)
    _check_grads(cpu, tpu)


def test_static_default_keyword_and_schema():
    assert str(torch.ops.lazyrt_test.rms_norm.default._schema).startswith(
        "lazyrt_test::rms_norm(Tensor x, Tensor w, float eps=")
    x, w = torch.randn(3, 8), torch.randn(8)
    for eps in (1e-6, 0.5):
        assert_close(torch.ops.lazyrt_test.rms_norm(x.to("tpu"), w.to("tpu"), eps=eps).cpu(),
                     _rms_torch(x, w, eps))


def test_user_backward_multiple_outputs_and_int_inputs(mode):
    torch.manual_seed(0)
    # a user-given backward: straight-through rounding
    cpu, tpu = _leaves(torch.randn(5, 3) * 4)
    want = cpu[0] + (cpu[0].round() - cpu[0]).detach()
    (want * torch.arange(15.).view(5, 3)).sum().backward()
    got = STE(tpu[0])
    (got * torch.arange(15.).view(5, 3).to("tpu")).sum().backward()
    assert_close(got.cpu(), want.detach())
    _check_grads(cpu, tpu)
    # two outputs, a static int
    cpu, tpu = _leaves(torch.randn(2, 6))
    a, b = cpu[0][..., :4].sum(-1), cpu[0][..., 4:] * 2.0
    (a.sum() + (b * b).sum()).backward()
    ga, gb = SPLIT(tpu[0], 4)
    (ga.sum() + (gb * gb).sum()).backward()
    assert_close(ga.cpu(), a.detach())
    assert_close(gb.cpu(), b.detach())
    _check_grads(cpu, tpu)
    # an int64 index argument: no gradient for it, a gradient (scatter-add) for the table
    cpu, tpu = _leaves(torch.randn(6, 4), torch.tensor([0, 5, 0, 2]))
    want = cpu[0][cpu[1]] * 3.0
    want.pow(2).sum().backward()
    got = TAKE(*tpu)
    got.pow(2).sum().backward()
    assert_close(got.cpu(), want.detach())
    _check_grads(cpu, tpu)


def test_strict_is_one_cached_executable():
    with lazyrt.set_mode("strict"):
        x, w = torch.randn(4, 8, device="tpu"), torch.randn(8, device="tpu")
        RMS(x, w)
        before = metrics.counters()
        RMS(x, w)
        after = metrics.counters()
    assert after["executions"] - before["executions"] == 1
    assert after["cache_misses"] == before["cache_misses"]


def test_defer_is_one_trace_node_fused_with_neighbours():
    x, w = torch.randn(4, 8), torch.randn(8)
    with lazyrt.set_mode("defer"):
        lazyrt.sync()
        xt, wt = x.to("tpu"), w.to("tpu")
        lazyrt.sync()
        y = RMS(xt * 2, wt) + 1
        text = lazyrt.graph(y)
        lines = [ln for ln in text.splitlines() if ln.lstrip().startswith("%")]
        assert len(lines) == 3, text
        assert sum("rms_norm" in ln for ln in lines) == 1, text
        before = metrics.counters()["flushes"]
        got = y.cpu()
        assert metrics.counters()["flushes"] == before + 1
    assert_close(got, _rms_torch(x * 2, w) + 1)


def test_compiled_is_one_graph_node_without_graph_break(mode):
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    args = (torch.randn(4, 8), torch.randn(16, 8), torch.randn(16))
    cpu, tpu = _leaves(*args)

    def f(x, w, b, lin=GELU_LINEAR):
        return (lin(x, w, b).sin() * 2).sum()

    want = f(*cpu, lin=_gelu_linear_torch)
    want.backward()
    before = metrics.counters()
    got = torch.compile(f, backend="tpu")(*tpu)
    got.backward()
    after = metrics.counters()
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1
    assert after["compiled_eager_calls"] == before["compiled_eager_calls"]
    assert after["compiled_graphs"] > before["compiled_graphs"]
    assert_close(got.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-4)
    _check_grads(cpu, tpu)
    explained = torch._dynamo.explain(f)(*tpu)
    assert explained.graph_break_count == 0
    torch._dynamo.reset()


def test_a_jax_error_names_the_op_and_the_call_site(mode):
    x, w = torch.randn(4, 8, device="tpu"), torch.randn(5, 6, device="tpu")
    with pytest.raises(TypeError) as info:
        GELU_LINEAR(x, w, torch.randn(5, device="tpu"))  # the line the error must name
    msg = str(info.value)
    assert "lazyrt_test::gelu_linear" in msg and "dot_general" in msg
    line = sys._getframe().f_lineno - 3
    assert f"{__file__}:{line}" in msg, msg


def test_cpu_tensors_get_pytorchs_device_error(mode):
    x, w = torch.randn(4, 8, device="tpu"), torch.randn(8)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        RMS(x, w)
    with pytest.raises(NotImplementedError, match="'CPU' backend"):
        RMS(x.cpu(), w)


def test_bad_declarations_are_named():
    with pytest.raises(TypeError, match="static argument 'n' needs a type"):
        lazyrt.jax_op("lazyrt_test::bad1", lambda x, n: x * n, static=("n",))
    with pytest.raises(TypeError, match="static names no parameter"):
        lazyrt.jax_op("lazyrt_test::bad2", lambda x: x, static=("y",))
    with pytest.raises(ValueError, match="namespace::op"):
        lazyrt.jax_op("bad3", lambda x: x)
    op = lazyrt.jax_op("lazyrt_test::bad4", lambda x: (x, x))  # returns 2, declared 1
    with pytest.raises(ValueError, match="returned 2 arrays, num_outputs=1"):
        op(torch.randn(2, device="tpu"))


def test_a_donated_argument_is_given_up(mode):
    """``donate=("x",)``: the result is right, x's buffer goes to XLA (reading x afterwards
    raises, and the call adds no live bytes: the result may live in x's buffer); a view, a
    tensor passed twice or an input that requires grad is not given up."""
    a, b = torch.randn(64, 32), torch.randn(64, 32)
    x, y = a.to("tpu"), b.to("tpu")
    lazyrt.sync()
    before = torch.tpu.memory_allocated()
    out = SCALE_ADD(x, y, 3.0)
    lazyrt.sync()
    assert torch.tpu.memory_allocated() == before
    assert_close(out.cpu(), a * 3.0 + b)
    with pytest.raises(RuntimeError, match="deleted"):
        x.cpu()
    assert_close(y.cpu(), b)
    v = y[:, :16]  # a view: its base stays
    assert_close(SCALE_ADD(v, v, 1.0).cpu(), b[:, :16] * 2.0)
    assert_close(v.cpu(), b[:, :16])
    assert_close(SCALE_ADD(y, y, 1.0).cpu(), b * 2.0)  # passed twice
    assert_close(y.cpu(), b)
    g = a.to("tpu").requires_grad_()
    SCALE_ADD(g, y, 3.0).sum().backward()
    assert_close(g.grad.cpu(), torch.full_like(a, 3.0))
    assert_close(g.detach().cpu(), a)


def test_a_pallas_kernel_as_an_op(mode):
    from jax.experimental import pallas as pl

    def scale_add(x, y, alpha: float = 2.0):
        def kernel(x_ref, y_ref, o_ref):
            o_ref[...] = x_ref[...] * alpha + y_ref[...]

        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              interpret=jax.default_backend() == "cpu")(x, y)

    def scale_add_bwd(g, x, y, alpha: float = 2.0):
        return g * alpha, g

    op = lazyrt.jax_op(f"lazyrt_test::scale_add_{mode}", scale_add, static=("alpha",),
                       backward=scale_add_bwd)
    cpu, tpu = _leaves(torch.randn(8, 128), torch.randn(8, 128))
    want = cpu[0] * 3.0 + cpu[1]
    (want * want).sum().backward()
    got = op(*tpu, alpha=3.0)
    (got * got).sum().backward()
    assert_close(got.cpu(), want.detach())
    _check_grads(cpu, tpu)
    # without a backward, jax.vjp of a pallas_call fails: the error says what to do
    no_bwd = lazyrt.jax_op(f"lazyrt_test::scale_add_nobwd_{mode}", scale_add, static=("alpha",))
    x = torch.randn(8, 128, device="tpu", requires_grad=True)
    with pytest.raises(Exception, match="pass backward="):
        no_bwd(x, x.detach()).sum().backward()


_MESH_SCRIPT = textwrap.dedent("""
    import jax
    jax.config.update("jax_num_cpu_devices", 2)
    import jax.numpy as jnp, torch, lazyrt
    import lazyrt.distributed as ld
    from jax.sharding import PartitionSpec as P
    from lazyrt._exec.values import concrete

    mesh = ld.Mesh([0, 1], (2,), ("data",))

    def rms(x, w, eps: float = 1e-6):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w

    op = lazyrt.jax_op("mesh_test::rms", rms, static=("eps",), mesh=mesh,
                       in_specs=(("data", None), (None,)), out_specs=("data", None))
    torch.manual_seed(0)
    x = torch.randn(8, 16, requires_grad=True)
    w = torch.randn(16, requires_grad=True)
    ref = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
    (ref * ref).sum().backward()
    for mode in ("strict", "defer"):
        with lazyrt.set_mode(mode):
            xt = x.detach().to("tpu")
            ld.mark_sharding(xt, mesh, ("data", None))
            xt.requires_grad_()
            wt = w.detach().to("tpu").requires_grad_()
            y = op(xt, wt)
            (y * y).sum().backward()
            torch.testing.assert_close(y.cpu(), ref.detach())
            torch.testing.assert_close(xt.grad.cpu(), x.grad)
            torch.testing.assert_close(wt.grad.cpu(), w.grad)
            lazyrt.sync()
            assert concrete(y).sharding.spec == P("data", None), concrete(y).sharding
            print(mode, "ok")
""")


@pytest.mark.subprocess
def test_two_device_mesh_runs_under_shard_map():
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", _MESH_SCRIPT], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["strict", "ok", "defer", "ok"]


@pytest.mark.parametrize("pallas", ["off", "on"])
def test_lazyrts_own_kernels_are_jax_ops(mode, pallas):
    """``torch.ops.lazyrt.flash_attention``/``matmul``: the kernels_pallas kernels (interpret
    mode on CPU with ``on``) or their references, through the same jax_op path."""
    torch.manual_seed(0)
    cpu, tpu = _leaves(torch.randn(1, 4, 16, 8), torch.randn(1, 2, 16, 8),
                       torch.randn(1, 2, 16, 8))
    want = F.scaled_dot_product_attention(*cpu, is_causal=True, enable_gqa=True)
    want.pow(2).sum().backward()
    prev = lazyrt.config.pallas
    lazyrt.set_pallas(pallas)
    try:
        before = metrics.counters()["pallas_attention_calls"]
        got = torch.ops.lazyrt.flash_attention(*tpu, causal=True)
        got.pow(2).sum().backward()
        assert_close(got.cpu(), want.detach(), rtol=1e-5, atol=1e-5)
        _check_grads(cpu, tpu)
        assert (metrics.counters()["pallas_attention_calls"] > before) == (pallas == "on")
        cpu, tpu = _leaves(torch.randn(32, 16), torch.randn(16, 24), torch.randn(24))
        want = F.gelu(cpu[0] @ cpu[1] + cpu[2])
        want.pow(2).sum().backward()
        got = torch.ops.lazyrt.matmul(*tpu, activation="gelu")
        got.pow(2).sum().backward()
        assert_close(got.cpu(), want.detach(), rtol=1e-5, atol=1e-5)
        _check_grads(cpu, tpu)
    finally:
        lazyrt.set_pallas(prev)


def _rms_plain(x, w, eps: float = 1e-6):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rms_plain_bwd(g, x, w, eps: float = 1e-6):  # the VJP by hand (docs/custom-kernels.md)
    h = x.shape[-1]
    r = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    gw_x = g * w
    dx = r * gw_x - x * r**3 * jnp.sum(gw_x * x, axis=-1, keepdims=True) / h
    dw = jnp.sum((g * x * r).reshape(-1, h), axis=0)
    return dx, dw


RMS_BWD = lazyrt.jax_op("lazyrt_test::rms_hand_bwd", _rms_plain, static=("eps",),
                        backward=_rms_plain_bwd)


class _Block(torch.nn.Module):
    def __init__(self, h, norm):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(h))
        self.lin = torch.nn.Linear(h, h)
        self.norm = norm

    def forward(self, x):
        return self.lin(self.norm(x, self.w, eps=1e-5))


@pytest.mark.parametrize("how", ["strict", "defer", "compiled"])
def test_training_loop_with_a_user_backward_matches_cpu(how):
    def train(device, norm, compiled=False):
        torch.manual_seed(0)
        model = _Block(16, norm).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        fwd = torch.compile(model, backend="tpu") if compiled else model
        x = torch.randn(8, 16).to(device)
        losses = []
        for _ in range(3):
            loss = fwd(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses, [p.detach().cpu() for p in model.parameters()]

    want, want_p = train("cpu", _rms_torch)
    torch._dynamo.reset()
    with lazyrt.set_mode("strict" if how == "compiled" else how):
        got, got_p = train("tpu", RMS_BWD, compiled=how == "compiled")
    torch._dynamo.reset()
    assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-6)
    for g, w in zip(got_p, want_p):
        assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_pytorchs_opcheck_schema_fake_and_aot():
    """PyTorch's own checks of a custom op: schema, fake kernel vs the real outputs, and
    AOTAutograd (dynamic shapes) through the registered autograd formula."""
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    x = torch.randn(4, 8, device="tpu", requires_grad=True)
    w = torch.randn(8, device="tpu", requires_grad=True)
    checks = [
        (RMS, (x, w), {"eps": 1e-5}),
        (SPLIT, (x, 3), {}),
        (TAKE, (x, torch.tensor([1, 0, 3], device="tpu")), {}),
        (torch.ops.lazyrt.flash_attention, (x.view(1, 1, 4, 8),) * 3, {"causal": True}),
    ]
    for op, args, kwargs in checks:
        res = torch.library.opcheck(op, args, kwargs, test_utils=utils)
        assert set(res.values()) == {"SUCCESS"}, (op, res)

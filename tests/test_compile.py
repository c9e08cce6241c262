"""``torch.compile`` on tpu: the ``"tpu"`` Dynamo backend, against CPU eager."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import jax
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from _util import assert_close

import lazyrt
from lazyrt import metrics

HERE = os.path.dirname(os.path.abspath(__file__))


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _c():
    return metrics.counters()


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        return self.fc2(self.drop(F.gelu(self.fc1(x))))


# ---- backend choice -----------------------------------------------------------------------


def test_tpu_inputs_pick_the_tpu_backend(mode):
    def f(x, y):
        return (x @ y).relu().sum(0) * 2

    x, y = torch.randn(4, 3), torch.randn(3, 5)
    before = _c()["compiled_modules"]
    got = torch.compile(f)(x.to("tpu"), y.to("tpu"))
    assert _c()["compiled_modules"] == before + 1
    assert_close(got.cpu(), f(x, y))
    assert got.device.type == "tpu"


def test_cpu_inputs_keep_the_default_backend():
    def f(x):
        return x.sin() + 1

    before = _c()["compiled_modules"]
    x = torch.randn(5)
    assert_close(torch.compile(f, backend="eager")(x), f(x))
    assert _c()["compiled_modules"] == before


def test_inductor_for_tpu_work_compiles_with_tpu_and_warns_once(monkeypatch):
    """accelerate (Trainer's torch_compile=True) passes backend="inductor" explicitly."""
    from lazyrt._compile import api

    monkeypatch.setattr(api, "_warned", [])
    torch.manual_seed(0)
    m = MLP()
    x = torch.randn(3, 8)
    ref = m(x)
    m = m.to("tpu")
    before = _c()["compiled_modules"]
    with pytest.warns(UserWarning, match="backend='inductor'.*backend='tpu'"):
        cm = torch.compile(m, backend="inductor", mode="max-autotune")
    assert_close(cm(x.to("tpu")).cpu(), ref)
    f = torch.compile(lambda a: a.exp() + 1, backend="inductor")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        assert_close(f(x.to("tpu")).cpu(), x.exp() + 1)
    assert _c()["compiled_modules"] == before + 2


def test_dynamic_true_is_refused():
    with pytest.raises(ValueError, match="dynamic=True"):
        torch.compile(MLP().to("tpu"), dynamic=True)


def test_backend_by_name_and_entry_point():
    from importlib.metadata import entry_points

    names = {ep.name: ep.value for ep in entry_points(group="torch_dynamo_backends")}
    assert names.get("tpu") == "lazyrt._compile.backend:tpu_backend"
    devices = {ep.name: ep.value for ep in entry_points(group="torch.backends")}
    assert devices.get("tpu") == "lazyrt._autoload:load"
    x = torch.randn(3, 3)
    got = torch.compile(lambda a: a.exp() * a, backend="tpu")(x.to("tpu"))
    assert_close(got.cpu(), x.exp() * x)


@pytest.mark.subprocess
def test_import_torch_alone_gives_the_device_and_import_lazyrt_no_dynamo():
    code = ("import sys, torch\n"
            "assert 'lazyrt' in sys.modules and 'torch._dynamo' not in sys.modules\n"
            "print((torch.ones(2, device='tpu') + 1).cpu().tolist())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[2.0, 2.0]"


# ---- one program per graph ----------------------------------------------------------------


def _train(model, x, steps, compile_step=False):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = torch.compile(opt.step) if compile_step else opt.step
    losses, counts = [], []
    for _ in range(steps):
        before = _c()
        loss = model(x).square().mean()
        loss.backward()
        step()
        opt.zero_grad()
        losses.append(loss.item())
        after = _c()
        counts.append({k: after[k] - before[k] for k in
                       ("flushes", "cache_misses", "compiled_calls", "compiled_eager_calls")})
    return losses, counts


@pytest.mark.parametrize("compile_step", [False, True], ids=["eager_step", "compiled_step"])
def test_training_matches_cpu_one_flush_per_step(mode, compile_step):
    torch.manual_seed(0)
    ref = MLP()
    model = MLP()
    model.load_state_dict(ref.state_dict())
    model = model.to("tpu")
    model.compile()
    x = torch.randn(6, 8)
    ref_losses, _ = _train(ref, x, 4)
    losses, counts = _train(model, x.to("tpu"), 4, compile_step)
    for a, b in zip(losses, ref_losses):
        assert a == pytest.approx(b, rel=1e-4)
    assert_close(model.fc1.weight.cpu(), ref.fc1.weight, rtol=1e-4, atol=1e-5)
    graphs = 3 if compile_step else 2  # forward, backward (and the optimizer step)
    for c in counts:
        assert c["compiled_calls"] == graphs and c["compiled_eager_calls"] == 0
    if mode == "defer":
        assert all(c["flushes"] == 1 for c in counts)  # + the sync of loss.item()
        assert all(c["cache_misses"] == 0 for c in counts[2:])


def test_compiled_graph_is_one_strict_executable():
    with lazyrt.set_mode("strict"):
        f = torch.compile(lambda x: ((x * 2).sin() + x.cos()).sum(1))
        x = torch.randn(4, 6, device="tpu")
        f(x)
        before = _c()
        out = f(x)
        after = _c()
    assert after["executions"] - before["executions"] == 1
    assert after["cache_misses"] == before["cache_misses"]
    assert_close(out.cpu(), ((x.cpu() * 2).sin() + x.cpu().cos()).sum(1))


def test_compiled_graph_is_one_node_of_the_pending_trace():
    with lazyrt.set_mode("defer"):
        f = torch.compile(lambda x: ((x * 2).sin() + x.cos()).sum(1))
        x = torch.randn(4, 6, device="tpu")
        lazyrt.sync()
        y = f(x) + 1  # compiled graph, then an eager op: one trace
        text = lazyrt.graph(y)
        assert "compiled_inference" in text and "add" in text
        assert "func.func" in lazyrt.hlo(y)
        before = _c()["flushes"]
        got = y.cpu()
        assert _c()["flushes"] == before + 1
    assert_close(got, ((x.cpu() * 2).sin() + x.cpu().cos()).sum(1) + 1)


def test_a_graph_whose_surroundings_keep_recompiling_runs_alone():
    """Generation's shape: a compiled step between eager ops on a growing tensor. Each
    call's trace is new until the graph is isolated; then the graph's program is a cache
    hit at every call and only the small eager programs around it compile."""
    from lazyrt._exec import defer as _defer

    w = torch.randn(8, 8)
    wt = w.to("tpu")
    step = torch.compile(lambda h: torch.tanh(h @ wt) * 0.5)
    with lazyrt.set_mode("defer"):
        seq = torch.randn(1, 8).to("tpu")
        h = seq[-1:].clone()
        ref_seq, ref_h = seq.cpu(), h.cpu()
        progs = []
        for _ in range(8):
            before = _c()
            h = step(h + seq[-1:])  # eager op on a slice of the growing seq
            seq = torch.cat([seq, h])  # the growing part
            got = seq.cpu()
            ref_h = torch.tanh((ref_h + ref_seq[-1:]) @ w) * 0.5
            ref_seq = torch.cat([ref_seq, ref_h])
            assert_close(got, ref_seq)
            progs.append(_c()["flushes"] - before["flushes"])
    # the first calls fused graph and surroundings (1 flush, a new program each call; before
    # the first, what was pending ran on its own); from the call after GRAPH_ISOLATE_MISSES
    # misses on, the graph runs in a flush of its own
    k = _defer.GRAPH_ISOLATE_MISSES
    assert progs[:k] == [2] + [1] * (k - 1)
    assert all(n >= 2 for n in progs[k:]), progs
    from lazyrt._compile.graph import ALONE

    alone = [r.cache_hit for r in lazyrt.memory.flush_log()[-sum(progs[k:]):]
             if r.name == ALONE]
    # the graph alone: one program, compiled at its first lone call, then a hit every call
    assert len(alone) == len(progs) - k and all(alone[1:]), alone
    assert _c()["compiled_eager_calls"] == 0


# ---- semantics ----------------------------------------------------------------------------


def test_graph_breaks_run_eagerly(mode):
    def f(x):
        y = x * 2
        if y.sum().item() > 0:  # .item(): a graph break
            y = y + 1
        print("between graphs")
        idx = torch.nonzero(y > 1)  # data-dependent shape: a graph break
        return y.exp(), idx

    x = torch.randn(5, 3)
    got, idx = torch.compile(f)(x.to("tpu"))
    ref, ridx = f(x)
    assert_close(got.cpu(), ref)
    assert torch.equal(idx.cpu(), ridx)


def test_output_strides_and_views_match_eager(mode):
    def f(x):
        return (x * 2).t(), x[1:, ::2] + 0, (x + 1).unsqueeze(0).expand(2, 3, 4)

    x = torch.randn(3, 4)
    outs = torch.compile(f)(x.to("tpu"))
    for g, r in zip(outs, f(x)):
        assert g.shape == r.shape and g.stride() == r.stride()
        assert_close(g.cpu(), r)


def test_input_mutation_and_aliasing(mode):
    def f(x, buf):
        buf.add_(x)  # mutates an input
        v = buf.view(-1)
        return v * 2, buf

    x, buf = torch.randn(2, 3), torch.zeros(2, 3)
    tx, tbuf = x.to("tpu"), buf.to("tpu")
    cf = torch.compile(f)
    out, same = cf(tx, tbuf)
    out2, _ = cf(tx, tbuf)
    r_out, _ = f(x, buf)
    r_out2, _ = f(x, buf)
    assert same is tbuf
    assert_close(tbuf.cpu(), buf)
    assert_close(out.cpu(), r_out)
    assert_close(out2.cpu(), r_out2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool, torch.int64])
def test_cpu_scalar_tensor_inputs_stay_on_the_host(mode, dtype):
    # A 0-d CPU tensor input (as the optimizer's step counter is) is read on the host at
    # each call: new values need no recompile, and a floating or bool one is no transfer.
    def f(x, s):
        return x * s + (s + s)  # s itself, and a host op's result, on the device

    x = torch.randn(3, 4)
    tx = x.to("tpu")
    cf = torch.compile(f)
    vals = [True, False, True] if dtype is torch.bool else [2, -3, 7]
    outs, counts = [], []
    for v in vals:
        s = torch.tensor(v, dtype=dtype)
        before = _c()
        out = cf(tx, s)
        outs.append((out.cpu(), f(x, s)))
        after = _c()
        counts.append({k: after[k] - before[k]
                       for k in ("cache_misses", "transfers_to_device", "compiled_eager_calls")})
    for got, ref in outs:
        assert got.dtype == ref.dtype
        assert_close(got, ref)
    for c in counts[1:]:
        assert c["cache_misses"] == 0 and c["compiled_eager_calls"] == 0
        # integer ones are moved (a runtime scalar is float64: inexact past 2**53)
        assert c["transfers_to_device"] == (2 if dtype is torch.int64 else 0)


def test_tensor_made_on_tpu_inside_a_graph(mode):
    # torch.tensor(..., device="tpu") while Dynamo traces (a sliding-window cache's roll
    # index does this): a fake tensor for the tracer, a constant of the program after
    def f(x, k):
        idx = torch.tensor([-1], dtype=torch.long, device=x.device)
        y = x.roll(-1, dims=-2)
        y[:, :, idx] = k
        return y * torch.tensor(2.0, device=x.device)

    x, k = torch.randn(1, 2, 4, 3), torch.randn(1, 2, 1, 3)
    cf = torch.compile(f)
    before = _c()
    got = cf(x.to("tpu"), k.to("tpu"))
    after = _c()
    ref = f(x, k)
    assert after["compiled_eager_calls"] == before["compiled_eager_calls"]
    assert got.shape == ref.shape and got.stride() == ref.stride()
    assert_close(got.cpu(), ref)


def test_inference_graph_mutations_are_written_back(mode):
    # An inference graph keeps its input mutations (copy_ at its end); lazyrt writes
    # them into the inputs after the program: a view input, a cast and a broadcast, a CPU
    # counter, and the version counter bumped as an in-place op bumps it.
    def f(view, wide, counter, x):
        view.mul_(2).add_(x)
        wide.copy_(x.sum(0).double())  # float32 (4,) into float64 (3, 4)
        counter.add_(1)
        return view.sum() + counter

    base, wide, x = torch.randn(4, 4), torch.zeros(3, 4, dtype=torch.float64), torch.randn(3, 4)
    counter = torch.tensor(0.0)
    tbase, twide, tx = base.to("tpu"), wide.to("tpu"), x.to("tpu")
    tcounter = counter.clone()
    cf = torch.compile(f)
    for step in range(3):
        v0, w0 = tbase._version, twide._version
        before = _c()
        got = cf(tbase[1:], twide, tcounter, tx)
        after = _c()
        ref = f(base[1:], wide, counter, x)
        assert after["compiled_eager_calls"] == before["compiled_eager_calls"]
        assert_close(got.cpu(), ref)
        assert_close(tbase.cpu(), base)
        assert_close(twide.cpu(), wide)
        assert twide.dtype == torch.float64
        assert tcounter.item() == counter.item() == step + 1
        assert tbase._version > v0 and twide._version > w0


def test_index_with_a_python_list(mode):
    def f(y):
        return y[[0, 2]] * 2, y[:, [1, 1, 0]]

    x = torch.randn(3, 4, requires_grad=True)
    tx = x.detach().to("tpu").requires_grad_()
    a, b = torch.compile(f)(tx)
    ra, rb = f(x)
    assert_close(a.cpu(), ra)
    assert_close(b.cpu(), rb)
    (a.sum() + b.sum()).backward()
    (ra.sum() + rb.sum()).backward()
    assert_close(tx.grad.cpu(), x.grad)


def test_dropout_is_seeded_reproducible_and_compiles_once(mode):
    drop = nn.Dropout(0.5)
    f = torch.compile(lambda x: drop(x) * 3)
    x = torch.ones(64, device="tpu")
    torch.manual_seed(123)
    a, b = f(x).cpu(), f(x).cpu()
    graphs = _c()["compiled_graphs"]
    torch.manual_seed(123)
    a2, b2 = f(x).cpu(), f(x).cpu()
    assert _c()["compiled_graphs"] == graphs
    assert torch.equal(a, a2) and torch.equal(b, b2)
    assert not torch.equal(a, b)  # a fresh mask per call
    assert set(a.unique().tolist()) <= {0.0, 6.0}


def test_train_eval_and_batch_size_recompile_as_dynamo_decides(mode):
    m = MLP().to("tpu")
    m.drop.p = 0.5
    cm = torch.compile(m)
    x = torch.randn(4, 8)
    with torch.no_grad():
        m.eval()
        assert_close(cm(x.to("tpu")).cpu(), MLP.forward(m, x.to("tpu")).cpu())
        m.train()
        cm(x.to("tpu"))
        y = cm(torch.randn(6, 8, device="tpu"))
    assert y.shape == (6, 4)


def test_errors_keep_pytorch_types(mode):
    f = torch.compile(lambda a, b: torch.linalg.solve(a, b))
    with pytest.raises(RuntimeError, match="singular"):
        out = f(torch.zeros(3, 3, device="tpu"), torch.ones(3, 1, device="tpu"))
        out.cpu()


def test_checked_linalg_ops_return_their_values(mode):
    # the error check reads its info after the program: in defer that flushes, and the
    # outputs must already be tensors then
    a = torch.randn(4, 4, generator=torch.Generator().manual_seed(0)) + 4 * torch.eye(4)
    b = torch.randn(4, 2, generator=torch.Generator().manual_seed(1))
    f = torch.compile(lambda a, b: (torch.linalg.inv(a), torch.linalg.solve(a, b)))
    inv, sol = f(a.to("tpu"), b.to("tpu"))
    assert_close(inv.cpu(), torch.linalg.inv(a), rtol=1e-4, atol=1e-5)
    assert_close(sol.cpu(), torch.linalg.solve(a, b), rtol=1e-4, atol=1e-5)


# NOTE: defined once per process and kept: a library destroyed and defined again in one
# process (one per parametrized case) crashed torch 2.11's fake-tensor dispatch
# (segmentation fault in FakeTensorMode._dispatch_impl at the second case).
_TWICE_LIB = []


def _twice_op():
    if not _TWICE_LIB:
        lib = torch.library.Library("lazyrt_compile_test", "DEF")
        lib.define("twice(Tensor x) -> Tensor")
        lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
        lib.impl("twice", lambda x: torch.empty_like(x), "Meta")
        _TWICE_LIB.append(lib)
    return torch.ops.lazyrt_compile_test.twice


def test_an_op_without_lowering_runs_the_graph_eagerly(mode):
    _twice_op()
    f = torch.compile(lambda x: torch.ops.lazyrt_compile_test.twice(x.sin()) + 1)
    before = _c()["compiled_eager_calls"]
    x = torch.randn(4)
    with pytest.raises(NotImplementedError, match=r"lazyrt_compile_test\.twice"):
        f(x.to("tpu")).cpu()
    assert _c()["compiled_eager_calls"] > before


def test_no_lazyrt_or_jax_frame_is_ever_compiled(mode):
    from torch._dynamo.convert_frame import input_codes

    def f(x):
        lazyrt.sync()  # calls into lazyrt from a compiled frame
        torch.tpu.synchronize()
        return repr(x * 2), x.sum().item()

    torch.compile(f)(torch.ones(3, device="tpu"))
    m = MLP().to("tpu")
    torch.compile(m)(torch.ones(2, 8, device="tpu")).sum().backward()
    files = {ref().co_filename for ref in input_codes.seen if ref() is not None}
    # NOTE: the packages' real directories, not a path segment: a clone is often a folder
    # named lazyrt, and the tests in it are user code Dynamo should compile.
    pkgs = tuple(os.path.join(os.path.realpath(os.path.dirname(pkg.__file__)), "")
                 for pkg in (lazyrt, jax))
    bad = [p for p in files if os.path.realpath(p).startswith(pkgs)]
    assert bad == []
    assert any(os.path.realpath(p) == os.path.realpath(__file__) for p in files)  # f was compiled


@pytest.mark.subprocess
def test_torch_logs_show_recompiles_and_graph_breaks():
    code = ("import torch\n"
            "f = torch.compile(lambda x: (x * 2).sum().item() + (x + 1).sum().item())\n"
            "f(torch.ones(3, device='tpu'))\n"
            "f(torch.ones(4, device='tpu'))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu",
                                             TORCH_LOGS="recompiles,graph_breaks"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Graph break" in r.stderr and "Recompiling" in r.stderr


# ---- Hugging Face static-cache generation -------------------------------------------------


def test_hf_static_cache_generation_matches_cpu_and_compiles_once(mode):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (1, 5))
    ref = model.generate(ids, max_new_tokens=6, do_sample=False, cache_implementation="static")
    model = model.to("tpu")
    before = _c()
    out = model.generate(ids.to("tpu"), max_new_tokens=6, do_sample=False,
                         cache_implementation="static")
    after = _c()
    assert out.cpu().tolist() == ref.tolist()
    assert after["compiled_graphs"] - before["compiled_graphs"] == 1  # one decoding graph
    assert after["compiled_calls"] - before["compiled_calls"] == 5  # every decoding step

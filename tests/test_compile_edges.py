"""``torch.compile`` on tpu at its edges, against CPU eager: graphs routed by the devices
they create and read, inductor requests from libraries (Trainer's ``torch_compile=True``),
Python scalars as runtime inputs (a diffusion loop over int timesteps), Dynamo's recompile
limit, a compiled forward in defer compiling once, and recompile explanations."""
from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn as nn
from _util import assert_close

import lazyrt
from lazyrt import metrics

_KEYS = ("compiled_graphs", "cache_misses", "compiled_eager_calls", "compiled_modules")


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _c():
    return metrics.counters()


def _delta(before):
    after = _c()
    return {k: after[k] - before[k] for k in _KEYS}


# ---- the backend follows the devices a graph creates and reads ----------------------------


def test_graph_that_creates_tpu_tensors_compiles_with_tpu(mode):
    # no tpu input: inductor's "tpu" codegen imported torch_tpu before
    before = _c()
    f = torch.compile(lambda n: torch.arange(n, device="tpu") * 2)
    got = f(8)
    assert got.device.type == "tpu"
    assert torch.equal(got.cpu(), torch.arange(8) * 2)
    assert _delta(before)["compiled_modules"] == 1


def test_module_holding_tpu_tensors_outside_its_parameters_compiles_with_tpu(mode):
    class Scale(nn.Module):
        def __init__(self, s):
            super().__init__()
            self.s = s  # a plain attribute: the module has no parameters or buffers

        def forward(self, x):
            return (x * self.s).cumsum(0)

    s = torch.randn(5)
    cm = torch.compile(Scale(s.to("tpu")))
    x = torch.randn(5)
    got = cm(x.to("tpu"))
    assert_close(got.cpu(), (x * s).cumsum(0))
    # and a module on the CPU keeps PyTorch's own backend (a CPU tensor comes back)
    assert torch.compile(Scale(s), backend="eager")(x).device.type == "cpu"


def _block_mask_fields(bm):
    return [getattr(bm, n) for n in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks",
                                     "full_kv_indices", "q_num_blocks", "q_indices",
                                     "full_q_num_blocks", "full_q_indices")]


@pytest.mark.parametrize("mode", ["strict", pytest.param("defer", marks=pytest.mark.slow)],
                         indirect=True)
def test_compiled_create_block_mask_on_tpu_equals_cpu(mode):
    """torchtitan compiles ``create_block_mask`` and builds the mask on its device."""
    from torch.nn.attention.flex_attention import create_block_mask

    def doc_causal(b, h, q, kv):
        return (q >= kv) & (q // 96 == kv // 96)

    ref = create_block_mask(doc_causal, 2, 1, 256, 256, device="cpu")
    before = _c()
    got = torch.compile(create_block_mask)(doc_causal, 2, 1, 256, 256, device="tpu")
    d = _delta(before)
    assert type(got) is type(ref)
    assert got.BLOCK_SIZE == ref.BLOCK_SIZE and got.seq_lengths == ref.seq_lengths
    for a, b in zip(_block_mask_fields(ref), _block_mask_fields(got)):
        assert b.device.type == "tpu" and b.dtype == a.dtype
        assert torch.equal(b.cpu(), a)
    assert d["compiled_modules"] >= 1 and d["compiled_eager_calls"] == 0


# ---- inductor requests: Trainer(torch_compile=True) -------------------------------------


def _trainer_losses(device, compile_):
    import tempfile

    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(1)
    data = []
    for _ in range(12):
        ids = torch.randint(0, 64, (8,), generator=g)
        data.append({"input_ids": ids, "labels": ids})
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out, per_device_train_batch_size=4, max_steps=3, learning_rate=1e-3,
            logging_steps=1, report_to=[], save_strategy="no", torch_compile=compile_,
            use_cpu=device == "cpu", seed=0, disable_tqdm=True)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
        trainer.train()
    params = next(trainer.model.parameters())
    return [h["loss"] for h in trainer.state.log_history if "loss" in h], params.device


def test_accelerate_inductor_backend_compiles_tpu_models_with_tpu(mode, monkeypatch):
    """accelerate's own compile call (what ``TrainingArguments(torch_compile=True)``
    reaches): ``torch.compile(model, backend="inductor")``."""
    accelerate = pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState
    from accelerate.utils import TorchDynamoPlugin

    from lazyrt._compile import api

    # NOTE: accelerate's state is process-wide: one that another test in this process made
    # (tests/test_clients.py) keeps its dynamo plugin and drops this one (nothing compiles)
    AcceleratorState._reset_state(reset_partial_state=True)
    monkeypatch.setattr(api, "_warned", [])
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    x = torch.randn(3, 8)
    acc = accelerate.Accelerator(dynamo_plugin=TorchDynamoPlugin(backend="inductor"))
    assert acc.device.type == "tpu"
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    model.load_state_dict(ref.state_dict())
    before = _c()
    with pytest.warns(UserWarning, match="backend='inductor'.*backend='tpu'"):
        model = acc.prepare(model)
    out = model(x.to(acc.device))
    assert _delta(before)["compiled_modules"] == 1
    assert_close(out.cpu(), ref(x))


@pytest.mark.slow
def test_trainer_torch_compile_trains_on_tpu_like_cpu_eager(mode, monkeypatch):
    """accelerate passes backend="inductor" for ``TrainingArguments(torch_compile=True)``:
    tpu work compiles with "tpu" instead, with one warning."""
    from lazyrt._compile import api

    monkeypatch.setattr(api, "_warned", [])
    ref, dev = _trainer_losses("cpu", False)
    assert dev.type == "cpu"
    before = _c()
    with pytest.warns(UserWarning, match="backend='inductor'.*backend='tpu'"):
        got, dev = _trainer_losses("tpu", True)
    d = _delta(before)
    assert dev.type == "tpu"
    assert d["compiled_modules"] >= 1 and d["compiled_eager_calls"] == 0
    assert got == pytest.approx(ref, rel=1e-4)


# ---- Python scalars: runtime inputs; shapes stay static ---------------------------------


def test_python_ints_and_floats_become_runtime_inputs(mode):
    """After one recompile Dynamo makes a changing int/float dynamic (as on CPU); on tpu it
    is then an input of the one program: no graph and no program per value."""
    f = torch.compile(lambda x, n, s: ((x * n).sin() * s + n // 2).sum())
    x0 = torch.randn(5)
    counts = []
    for n, s in [(1, 0.5), (2, 0.25), (3, 1.5), (7, -2.0), (10, 3.0), (123, 0.125)]:
        x, xt = x0.clone().requires_grad_(), x0.to("tpu").requires_grad_()
        before = _c()
        y = f(xt, n, s)
        y.backward()
        got, grad = y.cpu(), xt.grad.cpu()
        counts.append(_delta(before))
        ref = ((x * n).sin() * s + n // 2).sum()
        ref.backward()
        assert_close(got, ref, rtol=1e-5, atol=1e-5)
        assert_close(grad, x.grad, rtol=1e-5, atol=1e-5)
    assert sum(c["compiled_graphs"] for c in counts) <= 4  # forward + backward, twice
    assert all(c["compiled_graphs"] == 0 and c["cache_misses"] == 0 for c in counts[2:])
    assert all(c["compiled_eager_calls"] == 0 for c in counts)


def test_an_int_that_sets_a_shape_makes_a_program_per_value_not_a_recompile(mode):
    """``torch.arange(n)``: each value is its own static program, one Dynamo graph for all
    (past Dynamo's recompile limit of 8, nothing runs eagerly)."""
    g = torch.compile(lambda n, k: torch.arange(n, device="tpu") * k + n)
    before = _c()
    for n in range(1, 12):
        assert torch.equal(g(n, 3).cpu(), torch.arange(n) * 3 + n)
    d = _delta(before)
    assert d["compiled_graphs"] <= 2 and d["compiled_eager_calls"] == 0


def test_an_int_start_of_a_slice_is_a_constant_per_value(mode):
    x = torch.arange(20.0)
    f = torch.compile(lambda x, n: x[n:n + 3] * 2 + n)
    before = _c()
    for n in range(10):
        assert torch.equal(f(x.to("tpu"), n).cpu(), x[n:n + 3] * 2 + n)
    d = _delta(before)
    assert d["compiled_graphs"] <= 2 and d["compiled_eager_calls"] == 0


def _tiny_unet():
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    return diffusers.UNet2DModel(
        sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=(8, 16), down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"), norm_num_groups=4).eval()


@pytest.mark.slow
def test_unet_over_int_timesteps_compiles_at_most_two_graphs(mode):
    unet = _tiny_unet()
    x = torch.randn(1, 3, 8, 8)
    timesteps = [999, 800, 600, 400, 200, 50, 1]
    with torch.no_grad():
        ref = [unet(x, t).sample for t in timesteps]
        cu = torch.compile(unet.to("tpu"))
        before = _c()
        got = [cu(x.to("tpu"), t).sample.cpu() for t in timesteps]
    d = _delta(before)
    for a, b in zip(got, ref):
        assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert d["compiled_graphs"] <= 2 and d["compiled_eager_calls"] == 0


# ---- Dynamo's recompile limit -------------------------------------------------------------


def _lazyrt_warnings(record):
    return [str(w.message) for w in record if "recompile_limit" in str(w.message)]


def test_recompile_limit_on_tpu_warns_with_its_cause():
    with torch._dynamo.config.patch(recompile_limit=2), \
            warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        f = torch.compile(lambda x: x.sum() * 2)  # a new shape each call: static shapes
        for n in range(1, 5):
            assert f(torch.ones(n, device="tpu")).item() == 2 * n
        g = torch.compile(lambda x, k: x * k, dynamic=False)  # ints specialized
        for k in range(4):
            assert torch.equal(g(torch.ones(2, device="tpu"), k).cpu(), torch.full((2,), k))
        h = torch.compile(lambda x: x.sum(), backend="eager")  # not tpu work: no warning
        for n in range(1, 5):
            h(torch.ones(n))
    msgs = _lazyrt_warnings(rec)
    assert len(msgs) == 2, msgs
    assert "lazyrt" in msgs[0] and "size mismatch" in msgs[0] and "static shapes" in msgs[0]
    assert "lazyrt" in msgs[1] and re.search(r"value of \S*k\S* changed", msgs[1])
    files = {w.filename for w in rec if "recompile_limit" in str(w.message)}
    assert files == {__file__}  # the warning points at the user's function


@pytest.mark.slow
def test_dynamic_kv_cache_generation_hits_the_limit_with_lazyrt_warning(mode):
    """Each decoding step grows the dynamic cache: a new static shape per step. Tokens equal
    CPU's; past the limit lazyrt says why (use the static cache)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (1, 5))
    ref = model.generate(ids, max_new_tokens=12, do_sample=False)
    model.to("tpu")
    model.forward = torch.compile(model.forward)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = model.generate(ids.to("tpu"), max_new_tokens=12, do_sample=False)
    assert out.cpu().tolist() == ref.tolist()
    msgs = _lazyrt_warnings(rec)
    assert msgs and "size mismatch" in msgs[0] and "cache_implementation='static'" in msgs[0]


# ---- defer: a compiled forward compiles once --------------------------------------------


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        # torch.tensor(..., device=...) makes real tpu tensors while Dynamo traces
        bias = torch.tensor([0.5, -0.5, 1.0, 0.0], device=x.device, dtype=x.dtype)
        return self.fc2(torch.tanh(self.fc1(x))) + bias


def test_compiled_forward_in_defer_compiles_once():
    torch.manual_seed(0)
    ref_net = _Net().double()
    x = torch.randn(3, 8, dtype=torch.float64)
    with lazyrt.set_mode("defer"), torch.no_grad():
        net = _Net().to("tpu")
        net.double()  # pending casts of every parameter: work done once
        cm = torch.compile(net)
        counts, outs = [], []
        for _ in range(3):
            before = _c()
            outs.append(cm(x.to("tpu")).cpu())
            counts.append(_delta(before))
        ref_net.load_state_dict({k: v.cpu() for k, v in net.state_dict().items()})
        ref = ref_net(x)
    for o in outs:
        assert_close(o, ref)
    assert counts[0]["compiled_graphs"] == 1
    assert counts[1]["cache_misses"] == 0 and counts[2]["cache_misses"] == 0, counts
    assert all(c["compiled_eager_calls"] == 0 for c in counts)


# ---- LAZYRT_EXPLAIN_RECOMPILE -----------------------------------------------------------


def test_explain_recompile_from_the_first_recompile_short_with_source_line(capsys):
    from lazyrt._exec import defer as _defer

    prev = lazyrt.config.explain_recompile
    lazyrt.config.explain_recompile = True
    try:
        with lazyrt.set_mode("defer"):
            ps = [torch.ones(n, device="tpu") for n in range(1, 30)]
            w = torch.ones(4, 4, device="tpu")
            lazyrt.sync()
            _defer.clear_cache()  # as in a fresh process: nothing compiled yet
            capsys.readouterr()
            ((w @ w).relu() * 2 + 1).sum().item()  # the first compile: nothing to explain
            first = capsys.readouterr().err
            ((w[:, :3] @ w[:3]).relu() * 2 + 1).sum().item()  # the first recompile
            second = capsys.readouterr().err
            torch._foreach_add_(ps, 1.0)  # one node over 29 tensors
            lazyrt.sync()
            capsys.readouterr()
            ps[5] = torch.ones(7, device="tpu")
            lazyrt.sync()
            capsys.readouterr()
            torch._foreach_add_(ps, 1.0)
            lazyrt.sync()
            third = capsys.readouterr().err
    finally:
        lazyrt.config.explain_recompile = prev
    assert "recompiling" not in first
    assert "recompiling" in second and "first difference: op" in second and "mm" in second
    assert f"{__file__}:" in second  # the user's source line of the op
    assert "first difference: op 0 _foreach_add" in third and "(7,)" in third
    assert max(len(line) for line in third.splitlines()) < 300
    assert len(third.splitlines()) <= 6


@pytest.mark.subprocess
def test_explain_recompile_speaks_at_a_processes_first_recompile():
    import os
    import subprocess
    import sys

    code = ("import torch, lazyrt\n"
            "lazyrt.set_mode('defer')\n"
            "w = torch.ones(4, 4, device='tpu')\n"
            "(w @ w).sum().item()\n"
            "(w[:, :3] @ w[:3]).sum().item()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu",
                                             LAZYRT_EXPLAIN_RECOMPILE="1"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.count("lazyrt: recompiling") == 1, r.stderr[-2000:]
    assert "first difference: op" in r.stderr and "<string>:5" in r.stderr

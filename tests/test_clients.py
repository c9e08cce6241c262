"""Real client libraries on tpu against their own CPU results: memory facts (torch.tpu,
torch.accelerator, accelerate's ``device_map="auto"``, torchtitan's memory monitor),
transformers' continuous batching (``generate_batch``), diffusers pipelines and training.

The client patches these need are in ``lazyrt/_torch/clients.py``; each has a test here.
``-m slow`` runs every case (strict and defer); CI runs a sample.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import lazyrt
from lazyrt._base import hostmem
from lazyrt._base.config import Config, parse_memory

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

GIB = 1 << 30


from test_model_families import _one_cpu_thread  # noqa: E402,F401  (CPU refs on one thread)


@pytest.fixture
def device_memory():
    """Set ``lazyrt.config.device_memory`` for a test."""
    prev = lazyrt.config.device_memory

    def set_(v):
        lazyrt.config.device_memory = v

    yield set_
    lazyrt.config.device_memory = prev


def _slow(*modes):
    return [pytest.param(m, marks=pytest.mark.slow) for m in modes]


# ---- memory facts ---------------------------------------------------------------------------

def test_mem_get_info_reports_the_budget_and_lazyrt_use(device_memory):
    """On the CPU platform total is the budget; free falls by what a tpu tensor holds; every
    door (torch.tpu, torch.accelerator, its .memory module, device properties) agrees."""
    if lazyrt.memory.device_memory_info() is not None:
        pytest.skip("the device reports its own limit")
    device_memory(4 * GIB)
    lazyrt.sync()
    free0, total = torch.tpu.mem_get_info()
    assert total == 4 * GIB
    assert 0 < free0 <= total - torch.tpu.memory_allocated()
    assert torch.tpu.get_device_properties(0).total_memory == total
    assert torch.accelerator.get_memory_info(0)[1] == total
    assert torch.accelerator.memory.get_memory_info()[1] == total
    x = torch.ones(16 << 20, device="tpu")  # 64 MiB
    lazyrt.sync()
    free1, _ = torch.tpu.mem_get_info()
    if free0 < total - torch.tpu.memory_allocated() + x.numel() * 4:
        pytest.skip("the host has less available than the budget: free is the host's")
    assert free0 - free1 == x.numel() * 4
    del x


def test_mem_get_info_share_of_host_memory(device_memory):
    if lazyrt.memory.device_memory_info() is not None:
        pytest.skip("the device reports its own limit")
    device_memory(0.25)
    assert torch.tpu.mem_get_info()[1] == int(0.25 * hostmem.total())
    free, total = torch.tpu.mem_get_info()
    assert free <= hostmem.available()


def test_device_memory_env(monkeypatch):
    monkeypatch.setenv("LAZYRT_DEVICE_MEMORY", "512MiB")
    assert Config.from_env().device_memory == 512 << 20
    monkeypatch.setenv("LAZYRT_DEVICE_MEMORY", "8GB")
    assert Config.from_env().device_memory == 8 * 10**9
    monkeypatch.setenv("LAZYRT_DEVICE_MEMORY", "30%")
    assert Config.from_env().device_memory == pytest.approx(0.3)
    monkeypatch.delenv("LAZYRT_DEVICE_MEMORY")
    assert Config.from_env().device_memory == 0.5
    for bad in ("0", "lots", "150%", "-1GiB", "3 parsecs"):
        with pytest.raises(ValueError, match="LAZYRT_DEVICE_MEMORY"):
            parse_memory("LAZYRT_DEVICE_MEMORY", bad)


def test_host_memory_obeys_the_cgroup_limit(tmp_path, monkeypatch):
    """A cgroup memory limit below the machine's memory is the host total; available is at
    most what the limit leaves of the cgroup's usage (v2 and v1 files)."""
    limit, usage = 300 << 20, 100 << 20
    monkeypatch.setattr(hostmem, "_CGROUP", str(tmp_path))
    (tmp_path / "memory.max").write_text(f"{limit}\n")
    (tmp_path / "memory.current").write_text(f"{usage}\n")
    monkeypatch.setattr(hostmem, "_cgroup_dirs", lambda: [("v2", str(tmp_path))])
    assert hostmem.total() == limit
    assert hostmem.available() <= limit - usage
    (tmp_path / "memory.max").write_text("max\n")
    assert hostmem.total() > limit  # no limit: the machine's memory
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "memory.limit_in_bytes").write_text(f"{limit}\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{usage}\n")
    monkeypatch.setattr(hostmem, "_cgroup_dirs", lambda: [("v1", str(v1))])
    assert hostmem.total() == limit
    assert hostmem.available() <= limit - usage


def test_accelerate_sees_tpu_memory(device_memory):
    pytest.importorskip("accelerate")
    from accelerate.utils import get_max_memory

    device_memory(2 * GIB)
    mm = get_max_memory()
    assert set(mm) == {0, "cpu"}
    assert 0 < mm[0] <= 2 * GIB


def test_torchtitan_memory_monitor():
    """torchtitan's DeviceMemoryMonitor divides by ``total_memory`` (it was 0)."""
    pytest.importorskip("torchtitan")
    from torchtitan.components.metrics import DeviceMemoryMonitor

    mon = DeviceMemoryMonitor("tpu")
    assert mon.device_capacity == torch.tpu.mem_get_info()[1] > 0
    x = torch.ones(1 << 20, device="tpu") * 2
    lazyrt.sync()
    stats = mon.get_peak_stats()
    assert stats.max_active_gib * GIB >= x.numel() * 4
    assert 0 < stats.max_active_pct < 100 and 0 < stats.max_reserved_pct < 100
    del x


def _tiny_llama(tie=True, init_range=0.5, **kw):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=tie, initializer_range=init_range, pad_token_id=0,
                      eos_token_id=63, bos_token_id=1, **kw)
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("mode", ["strict", *_slow("defer")])
def test_device_map_auto_places_on_tpu(mode, tmp_path, device_memory):
    """``from_pretrained(device_map="auto")`` without ``max_memory``: accelerate reads
    tpu's free memory and puts every weight there; forward and generate equal CPU's."""
    pytest.importorskip("accelerate")
    from transformers import LlamaForCausalLM

    device_memory(2 * GIB)
    _tiny_llama(init_range=0.02).save_pretrained(tmp_path)
    ref = LlamaForCausalLM.from_pretrained(tmp_path).eval()
    lazyrt.set_mode(mode)
    model = LlamaForCausalLM.from_pretrained(tmp_path, device_map="auto").eval()
    assert {str(p.device) for p in model.parameters()} == {"tpu:0"}
    ids = torch.tensor([[1, 5, 9, 13, 2, 7]])
    with torch.no_grad():
        want = ref(ids).logits
        got = model(ids.to("tpu")).logits.cpu()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        kw = {"max_new_tokens": 6, "do_sample": False}
        assert model.generate(ids.to("tpu"), **kw).cpu().tolist() == ref.generate(ids, **kw).tolist()


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("mode", ["defer", *_slow("strict")])
def test_accelerate_dispatch_auto_and_memory_queries(mode, tmp_path, device_memory):
    """accelerate's own big-model path without ``max_memory`` (``infer_auto_device_map``,
    ``load_checkpoint_and_dispatch(device_map="auto")``) puts the model on tpu (it picked
    the CPU while tpu reported no memory); a training step under ``Accelerator`` equals
    CPU's, and ``torch.accelerator``'s memory queries count the parameters, gradients and
    optimizer state, and what freeing them gives back."""
    pytest.importorskip("accelerate")
    from accelerate import (
        Accelerator,
        infer_auto_device_map,
        init_empty_weights,
        load_checkpoint_and_dispatch,
    )
    from transformers import LlamaForCausalLM

    device_memory(2 * GIB)
    ref = _tiny_llama(init_range=0.02)
    ref.save_pretrained(tmp_path)
    lazyrt.set_mode(mode)
    with init_empty_weights():
        model = LlamaForCausalLM(ref.config)
    model.tie_weights()
    assert infer_auto_device_map(model) == {"": 0}
    model = load_checkpoint_and_dispatch(model, str(tmp_path), device_map="auto")
    assert model.hf_device_map == {"": 0}
    assert {str(t.device) for t in (*model.parameters(), *model.buffers())} == {"tpu:0"}

    from accelerate.state import AcceleratorState

    # NOTE: accelerate's state is process-wide; another test in this process may have
    # made it for a CPU run (tests/test_hf_clients.py's CPU reference)
    AcceleratorState._reset_state(reset_partial_state=True)
    acc = Accelerator()
    assert acc.device.type == "tpu"
    ids = torch.tensor([[1, 5, 9, 13, 2, 7]])

    def step(m, opt, dev):
        loss = m(ids.to(dev), labels=ids.to(dev)).loss
        (acc.backward(loss) if dev != "cpu" else loss.backward())
        opt.step()
        return loss.item()

    want = step(ref, torch.optim.AdamW(ref.parameters(), lr=1e-3), "cpu")
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    assert step(model, opt, acc.device) == pytest.approx(want, rel=1e-5)
    for (n, p), p_ref in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), p_ref.detach(), rtol=1e-4, atol=1e-6, msg=n)

    lazyrt.sync()
    params = list(model.parameters())
    state = [v for s in opt.state.values() for v in s.values()
             if torch.is_tensor(v) and v.device.type == "tpu"]
    held = _nbytes(params) + _nbytes(p.grad for p in params) + _nbytes(state)
    alloc = torch.accelerator.memory_allocated()
    assert alloc == torch.tpu.memory_allocated() >= held
    assert torch.accelerator.max_memory_allocated() >= alloc
    free, total = torch.accelerator.get_memory_info()
    assert total == 2 * GIB and 0 < free <= total - alloc
    dropped = _nbytes(p.grad for p in params) + _nbytes(state)
    del opt, state
    acc.free_memory()
    for p in params:
        p.grad = None
    lazyrt.sync()
    assert torch.accelerator.memory_allocated() <= alloc - dropped


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_trainer_on_device_map_auto_with_memory_queries(mode, tmp_path, device_memory):
    """``Trainer`` on a model loaded with ``device_map="auto"`` (no ``max_memory``) trains on
    tpu with CPU's losses; ``torch.accelerator``'s memory queries, read from a callback at
    every step, agree with each other and hold at least the parameters."""
    pytest.importorskip("accelerate")
    from transformers import LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    device_memory(2 * GIB)
    _tiny_llama(init_range=0.02).save_pretrained(tmp_path / "model")
    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": x, "labels": x} for x in torch.randint(2, 60, (12, 16), generator=g)]

    class Memory(TrainerCallback):
        def __init__(self):
            self.seen = []

        def on_step_end(self, args, state, control, **kwargs):
            self.seen.append((torch.accelerator.memory_allocated(),
                              torch.accelerator.max_memory_allocated(),
                              torch.accelerator.get_memory_info()))

    def train(**load):
        model = LlamaForCausalLM.from_pretrained(tmp_path / "model", **load)
        args = TrainingArguments(str(tmp_path / "out"), per_device_train_batch_size=4,
                                 max_steps=3, learning_rate=1e-3, logging_steps=1,
                                 save_strategy="no", report_to=[], seed=0, data_seed=0,
                                 use_cpu=not load, disable_tqdm=True)
        mem = Memory()
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[mem])
        trainer.train()
        return model, [h["loss"] for h in trainer.state.log_history if "loss" in h], mem.seen

    _, want, _ = train()
    lazyrt.set_mode(mode)
    model, got, seen = train(device_map="auto")
    assert {str(p.device) for p in model.parameters()} == {"tpu:0"}
    assert got == pytest.approx(want, rel=1e-5)
    assert len(seen) == 3
    for alloc, peak, (free, total) in seen:
        assert _nbytes(model.parameters()) <= alloc <= peak
        assert total == 2 * GIB and 0 < free <= total - alloc


@pytest.mark.parametrize("mode", ["defer", *_slow("strict")])
def test_peft_lora_training_step_and_merge(mode):
    """PEFT LoRA on a tpu model: one AdamW step gives CPU's loss and adapter weights (the
    base weights stay frozen), and ``merge_and_unload`` gives CPU's merged logits."""
    peft = pytest.importorskip("peft")

    ids = torch.tensor([[1, 5, 9, 13, 2, 7, 30, 31]])

    def run(dev):
        model = peft.get_peft_model(_tiny_llama(init_range=0.02), peft.LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
        model.to(dev)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        loss = model(ids.to(dev), labels=ids.to(dev)).loss
        loss.backward()
        opt.step()
        trained = {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}
        merged = model.merge_and_unload()
        with torch.no_grad():
            logits = merged(ids.to(dev)).logits.cpu()
        return loss.item(), trained, logits, {str(p.device) for p in merged.parameters()}

    want = run("cpu")
    lazyrt.set_mode(mode)
    got = run("tpu")
    assert got[3] == {"tpu:0"}
    assert got[0] == pytest.approx(want[0], rel=1e-5)
    assert got[1].keys() == want[1].keys() and len(want[1]) == 8
    for n in want[1]:
        torch.testing.assert_close(got[1][n], want[1][n], rtol=1e-4, atol=1e-6, msg=n)
    torch.testing.assert_close(got[2], want[2], rtol=1e-4, atol=1e-5)


# ---- transformers continuous batching --------------------------------------------------------

PROMPTS = [[1, 5, 9, 13, 17], [1, 2, 3], [1, 30, 31, 32, 33, 34, 35], [1, 7]]


def _generate_batch(model, prompts, new, num_blocks=16, max_batch_tokens=64, **cb_kw):
    from transformers import GenerationConfig
    from transformers.generation import ContinuousBatchingConfig

    gc = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=63, pad_token_id=0)
    cb = ContinuousBatchingConfig(num_blocks=num_blocks, max_batch_tokens=max_batch_tokens,
                                  page_size=16, **cb_kw)
    with torch.no_grad():
        out = model.generate_batch(prompts, generation_config=gc, continuous_batching_config=cb)
    assert len(out) == len(prompts)
    return [r.generated_tokens for r in out.values()]


_CLIENTS = ("transformers", "accelerate", "diffusers", "peft", "torchtitan")


def _run(code):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.split("\n")[-2]


@pytest.mark.subprocess
def test_import_lazyrt_imports_no_client_library():
    """The client patches wait for their library (an import hook), so ``import lazyrt``
    (and ``import torch``, which autoloads it) imports none."""
    assert _run("import sys, torch, lazyrt\n"
                "from lazyrt._torch import clients\n"
                f"print([m for m in sys.modules if m.split('.')[0] in {_CLIENTS!r}], "
                "clients.applied, clients._finder in sys.meta_path)") == "[] {} True"


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("first", ["lazyrt", "transformers.generation.continuous_batching",
                                   "transformers.generation.continuous_batching.model_runner"])
def test_client_patches_apply_whatever_is_imported_first(first):
    """Importing the library patches it, whether lazyrt is imported before it or during it
    (its first ``import torch`` autoloads lazyrt while the package is half loaded)."""
    out = _run(f"import {first}\n"
               "import lazyrt, transformers.generation.continuous_batching.continuous_api\n"
               "from lazyrt._torch import clients\n"
               "print(sorted(n for n in clients.applied if n.startswith('cb_')))")
    assert out == "['cb_host_inputs', 'cb_memory', 'cb_padding', 'cb_paged_attention']"


def test_client_patches_are_applied():
    """In this process (transformers is imported by now): every continuous-batching patch
    applied (and Trainer's once ``transformers.trainer`` is imported, by whichever test)."""
    import transformers.generation.continuous_batching  # noqa: F401

    from lazyrt._torch import clients

    assert sorted(n for n in clients.applied if n.startswith("cb_")) == [
        "cb_host_inputs", "cb_memory", "cb_padding", "cb_paged_attention"]
    assert [p.__name__ for p in clients.CB_PATCHES] == [
        "_patch_cb_memory", "_patch_cb_host_inputs", "_patch_cb_padding",
        "_patch_cb_paged_attention"]


@pytest.fixture
def padded_sizes():
    """The padded (query, key) sizes of every continuous-batching step run meanwhile."""
    from transformers.generation.continuous_batching import model_runner

    sizes = []
    orig = model_runner.ModelRunner.maybe_pad_inputs

    def spy(self, *args):
        out = orig(self, *args)
        sizes.append(out)
        return out

    model_runner.ModelRunner.maybe_pad_inputs = spy
    yield sizes
    model_runner.ModelRunner.maybe_pad_inputs = orig


@pytest.mark.parametrize("mode", ["defer", *_slow("strict")])
def test_generate_batch_equals_cpu_and_compiles_per_size_not_per_step(mode, padded_sizes):
    """Prompts of different lengths, greedy: CPU's tokens (``generate_batch`` and
    ``generate`` per prompt). A step compiles only for a padded (query, key) size not seen
    before (``cb_host_inputs``, ``cb_padding``; before them every step compiled): a run
    with three times the steps at the sizes of a first run compiles nothing."""
    model = _tiny_llama()
    ref = _generate_batch(model, PROMPTS, 24)
    per_prompt = [model.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False)[0, len(p):]
                  .tolist() for p in PROMPTS]
    assert ref == [t[:t.index(63) + 1] if 63 in t else t for t in per_prompt]
    model.to("tpu")
    lazyrt.set_mode(mode)
    C = lazyrt.metrics.COUNTERS
    padded_sizes.clear()
    assert _generate_batch(model, PROMPTS, 8) == [t[:8] for t in ref]
    first, before = list(padded_sizes), C["cache_misses"]
    padded_sizes.clear()
    assert _generate_batch(model, PROMPTS, 24) == ref
    assert len(padded_sizes) > 2 * len(first) and set(padded_sizes) == set(first)
    assert C["cache_misses"] == before
    assert all(q % 8 == 0 and kv % 64 == 0 for q, kv in first)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_generate_batch_more_requests(mode, padded_sizes):
    """Twelve requests at once, the prompts of several lengths: CPU's tokens; run again
    (same sizes), nothing compiles."""
    model = _tiny_llama()
    prompts = [[1] + [(t + 5 * i) % 60 + 2 for t in p[1:]] for i in range(3) for p in PROMPTS]
    ref = _generate_batch(model, prompts, 12, num_blocks=32)
    model.to("tpu")
    lazyrt.set_mode(mode)
    assert _generate_batch(model, prompts, 12, num_blocks=32) == ref
    C = lazyrt.metrics.COUNTERS
    before = C["cache_misses"]
    assert _generate_batch(model, prompts, 12, num_blocks=32) == ref
    assert C["cache_misses"] == before


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_generate_batch_sliding_window_and_logprobs(mode):
    """Sliding-window attention (the mask's second band) and log-probabilities (written
    through an int32 view of the outputs) equal CPU's."""
    from transformers import GenerationConfig, MistralConfig, MistralForCausalLM
    from transformers.generation import ContinuousBatchingConfig

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=128, sliding_window=6, initializer_range=0.5)
    model = MistralForCausalLM(cfg).eval()
    prompts = [[1, 5, 9, 13, 17, 20, 22, 23, 40], [1, 2, 3], [1, 30, 31, 32, 33, 34, 35]]
    gc = GenerationConfig(max_new_tokens=10, do_sample=False, eos_token_id=63, pad_token_id=0)
    cb = ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=64, page_size=16,
                                  return_logprobs=True)

    def run():
        with torch.no_grad():
            out = model.generate_batch(prompts, generation_config=gc, continuous_batching_config=cb)
        return [(r.generated_tokens, r.logprobs) for r in out.values()]

    ref = run()
    model.to("tpu")
    lazyrt.set_mode(mode)
    got = run()
    assert [t for t, _ in got] == [t for t, _ in ref]
    for (_, lp), (_, lp_ref) in zip(got, ref):
        torch.testing.assert_close(torch.tensor(lp), torch.tensor(lp_ref), rtol=0, atol=1e-4)


@pytest.mark.parametrize("mode", _slow("strict", "defer"))
def test_generate_batch_sizes_its_cache_from_the_tpu_budget(mode, device_memory):
    """With no ``num_blocks`` the paged cache is sized from ``torch.tpu.mem_get_info()``
    (``cb_memory``), not from the host's RAM: it fits in the budget, and a budget twice as
    big gives a bigger cache. The tokens are still CPU's."""
    from transformers.generation.continuous_batching import cache as cb_cache
    from transformers.generation.continuous_batching import utils as cb_utils

    sizes = []
    init = cb_cache.PagedAttentionCache.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        sizes.append(self.cache_tensor.numel())
        assert self.cache_tensor.device.type == "tpu"

    model = _tiny_llama()
    ref = _generate_batch(model, PROMPTS, 6)
    model.to("tpu")
    lazyrt.set_mode(mode)
    cb_cache.PagedAttentionCache.__init__ = spy
    try:
        for free in (8 << 20, 16 << 20):
            lazyrt.sync()
            device_memory(torch.tpu.memory_allocated() + free)
            assert _generate_batch(model, PROMPTS, 6, num_blocks=None) == ref
    finally:
        cb_cache.PagedAttentionCache.__init__ = init
    assert 0 < sizes[0] < 8 << 20 and sizes[0] < sizes[1] < 16 << 20
    # outside a tpu cache's sizing the breakdown is transformers' own (the host)
    assert cb_utils.get_device_and_memory_breakdown()[0].type != "tpu"


# ---- diffusers -------------------------------------------------------------------------------

def _tiny_unet2d():
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    return UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
                       block_out_channels=(16, 32), norm_num_groups=8,
                       down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D")).eval()


@pytest.mark.parametrize("mode", ["defer", *_slow("strict")])
def test_diffusers_ddpm_pipeline(mode):
    """A DDPM pipeline (UNet2DModel with attention blocks, DDPMScheduler), fixed CPU
    generator: the images equal CPU's."""
    pytest.importorskip("diffusers")
    from diffusers import DDPMPipeline, DDPMScheduler

    pipe = DDPMPipeline(unet=_tiny_unet2d(), scheduler=DDPMScheduler(num_train_timesteps=10))
    pipe.set_progress_bar_config(disable=True)

    def run():
        return pipe(batch_size=2, generator=torch.Generator().manual_seed(0),
                    num_inference_steps=3, output_type="np").images

    ref = run()
    pipe.to("tpu")
    lazyrt.set_mode(mode)
    got = run()
    assert got.shape == ref.shape == (2, 8, 8, 3)
    assert abs(got - ref).max() < 1e-5


@pytest.mark.parametrize("mode", _slow("strict", "defer"))
def test_diffusers_unet2d_condition_training_step(mode):
    """One training step of a tiny UNet2DConditionModel (cross-attention on text states):
    loss, every gradient and every parameter after the step equal CPU's. (SGD: AdamW's
    first step moves a parameter by ~lr wherever its gradient is near 0, so gradients that
    agree to 1e-8 give parameters that differ by a share of lr.)"""
    pytest.importorskip("diffusers")
    from diffusers import UNet2DConditionModel

    def build():
        torch.manual_seed(0)
        return UNet2DConditionModel(
            sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
            block_out_channels=(16, 32), norm_num_groups=8, cross_attention_dim=16,
            attention_head_dim=4,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))

    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 8, 8, generator=g)
    t = torch.tensor([3, 7])
    text = torch.randn(2, 5, 16, generator=g)
    noise = torch.randn(2, 4, 8, 8, generator=g)

    def step(model, dev):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        out = model(x.to(dev), t.to(dev), encoder_hidden_states=text.to(dev)).sample
        loss = torch.nn.functional.mse_loss(out, noise.to(dev))
        loss.backward()
        grads = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}
        opt.step()
        return loss.item(), grads, {n: p.detach().cpu() for n, p in model.named_parameters()}

    ref = step(build(), "cpu")
    lazyrt.set_mode(mode)
    got = step(build().to("tpu"), "tpu")
    assert got[0] == pytest.approx(ref[0], rel=1e-5)
    for i in (1, 2):
        assert got[i].keys() == ref[i].keys()
        for n in ref[i]:
            torch.testing.assert_close(got[i][n], ref[i][n], rtol=1e-4, atol=1e-5, msg=n)


@pytest.fixture(autouse=True)
def _restore_mode():
    prev = lazyrt.get_mode()
    yield
    lazyrt.sync()
    lazyrt.set_mode(prev)

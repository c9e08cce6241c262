"""Saving, checkpointing and offload through the Hugging Face libraries' own code, on tpu
against the same run on the CPU (tiny Llama models built from configs; no hub access).

* ``save_pretrained``/``from_pretrained`` (tied weights written once), ``Trainer``
  checkpoints and ``resume_from_checkpoint`` (with dropout: the tpu RNG is saved and
  restored with the checkpoint), accelerate ``save_model``/``save_state``/``load_state``,
  PEFT adapters saved and reloaded;
* a ``device_map`` split across tpu, cpu and disk (accelerate's hooks) runs forward and
  ``generate`` as the CPU does.

CI runs two samples (a Trainer checkpoint and resume in strict mode, a tpu/cpu device_map
split in defer mode); ``-m slow`` runs every workflow in both modes.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import lazyrt

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
transformers = pytest.importorskip("transformers")

slow = pytest.mark.slow
VOCAB = 64


@pytest.fixture(autouse=True)
def _fresh_accelerator_state():
    """Trainer and Accelerator keep a process-wide device state: each test (and each device
    within one) starts from none."""
    yield
    _reset_accelerate()


def _reset_accelerate():
    try:
        from accelerate.state import AcceleratorState
    except ImportError:
        return
    AcceleratorState._reset_state(reset_partial_state=True)


def tiny_llama(seed=0, tie=True, dropout=0.0):
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=tie, attention_dropout=dropout, initializer_range=0.5)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg)


class _Data(torch.utils.data.Dataset):
    def __init__(self, n=16, length=12):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, VOCAB, (n, length), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def _state(model):
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def _assert_states_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], msg=k)


# ---- save_pretrained / safetensors -----------------------------------------------------------


def _save_pretrained_files(dev, path):
    from safetensors.torch import load_file

    model = tiny_llama().to(dev)
    model.save_pretrained(path)
    return load_file(os.path.join(path, "model.safetensors"))


@slow
@pytest.mark.parametrize("m", ["strict", "defer"])
def test_save_pretrained_roundtrip(tmp_path, m):
    """The tpu model's ``save_pretrained`` writes the CPU model's file (the tied lm_head
    once) and ``from_pretrained`` loads it back."""
    with lazyrt.set_mode(m):
        tpu = _save_pretrained_files("tpu", tmp_path / "tpu")
    cpu = _save_pretrained_files("cpu", tmp_path / "cpu")
    assert "lm_head.weight" not in tpu
    _assert_states_equal(tpu, cpu)
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "tpu", device_map="tpu")
    assert back.lm_head.weight is back.model.embed_tokens.weight
    assert back.lm_head.weight.device.type == "tpu"
    _assert_states_equal(_state(back), _state(tiny_llama()))


# ---- Trainer ---------------------------------------------------------------------------------


def _trainer_losses(dev, out, dropout, resume=None, steps=4):
    _reset_accelerate()  # before the arguments: they make accelerate's state for their device
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=steps, per_device_train_batch_size=4, learning_rate=1e-2,
        logging_steps=1, save_strategy="steps", save_steps=2, report_to=[], seed=0,
        use_cpu=dev == "cpu", disable_tqdm=True, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=tiny_llama(seed=1 if resume else 0, dropout=dropout),
                                   args=args, train_dataset=_Data())
    assert trainer.args.device.type == dev
    trainer.train(resume_from_checkpoint=resume)
    if resume is None:  # Trainer.save_model writes what the trained model holds
        from safetensors.torch import load_file

        trainer.save_model(str(out / "final"))
        saved = load_file(str(out / "final" / "model.safetensors"))
        state = _state(trainer.model)
        assert "lm_head.weight" not in saved  # tied: written once, as from the CPU
        _assert_states_equal(saved, {k: state[k] for k in saved})
        assert saved.keys() == state.keys() - {"lm_head.weight"}
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.mark.parametrize("m,dropout", [
    ("strict", 0.3), pytest.param("defer", 0.3, marks=slow),
    pytest.param("strict", 0.0, marks=slow), pytest.param("defer", 0.0, marks=slow)])
def test_trainer_checkpoint_and_resume(tmp_path, m, dropout):
    """``save_strategy="steps"`` checkpoints and ``save_model`` save from tpu; a run resumed
    from a checkpoint continues with the uninterrupted run's losses, with dropout too (the
    tpu RNG state travels with the checkpoint). Without dropout the losses are the CPU's."""
    with lazyrt.set_mode(m):
        straight = _trainer_losses("tpu", tmp_path / "a", dropout)
        assert os.path.isdir(tmp_path / "a" / "checkpoint-2")
        assert os.path.isfile(tmp_path / "a" / "checkpoint-2" / "model.safetensors")
        resumed = _trainer_losses("tpu", tmp_path / "b", dropout,
                                  resume=str(tmp_path / "a" / "checkpoint-2"))
    assert len(straight) == 4
    assert resumed[-2:] == pytest.approx(straight[-2:], rel=1e-6)
    if not dropout:
        assert straight == pytest.approx(_trainer_losses("cpu", tmp_path / "c", 0.0), rel=1e-4)


# The Trainer patch when lazyrt is imported from inside transformers.trainer (a script whose
# first import is transformers': torch's device autoload imports lazyrt mid-way), and after it.
_RNG_FILE_SCRIPT = textwrap.dedent("""
    {imports}
    import os, sys, tempfile, torch
    sys.path.insert(0, {tests!r})
    from test_hf_clients import _Data, tiny_llama
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), report_to=[], max_steps=1)
    trainer = Trainer(model=tiny_llama(), args=args, train_dataset=_Data())
    assert trainer.args.device.type == "tpu", trainer.args.device
    torch.tpu.manual_seed(7)
    torch.rand(3, device="tpu")
    saved = torch.tpu.get_rng_state()
    trainer._save_rng_state(args.output_dir)
    torch.rand(5, device="tpu")
    trainer._load_rng_state(args.output_dir)
    assert torch.equal(torch.tpu.get_rng_state(), saved)
    states = torch.load(os.path.join(args.output_dir, "rng_state.pth"), weights_only=False)
    assert torch.equal(states["tpu"], saved), states.keys()
    print("ok")
""")


@pytest.mark.parametrize("imports", [
    "from transformers import Trainer, TrainingArguments",
    pytest.param("import torch, lazyrt\nfrom transformers import Trainer, TrainingArguments",
                 marks=slow),
    pytest.param("import transformers.trainer as t\nimport lazyrt\n"
                 "Trainer, TrainingArguments = t.Trainer, t.TrainingArguments", marks=slow)])
@pytest.mark.subprocess
def test_trainer_checkpoint_holds_tpu_rng_state_whatever_the_import_order(imports):
    """A checkpoint's RNG file holds the tpu generator's state and restores it, however the
    script imports transformers and lazyrt (the patch was skipped with a warning when
    lazyrt's import ran inside ``transformers.trainer``)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    code = _RNG_FILE_SCRIPT.format(imports=imports, tests=os.path.dirname(__file__))
    out = subprocess.run([sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


# ---- accelerate ------------------------------------------------------------------------------


def _accelerate_run(dev, path):
    """Train one step, save_state, train a dropout step (loss L), load_state, train it again:
    the repeated step gives L again (model, optimizer and RNG restored)."""
    accelerate = pytest.importorskip("accelerate")
    _reset_accelerate()
    acc = accelerate.Accelerator(cpu=dev == "cpu")
    assert acc.device.type == dev
    model = tiny_llama(dropout=0.3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    x = _Data().x[:4].to(acc.device)

    def step():
        loss = model(input_ids=x, labels=x).loss
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        return loss.item()

    step()
    acc.save_model(model, path / "model")
    acc.save_state(path / "state")
    first = step()
    acc.load_state(path / "state")
    again = step()
    return first, again, sorted(os.listdir(path / "state")), sorted(os.listdir(path / "model"))


@slow
@pytest.mark.parametrize("m", ["strict", "defer"])
def test_accelerate_save_and_load_state(tmp_path, m):
    pytest.importorskip("accelerate")
    with lazyrt.set_mode(m):
        first, again, files, model_files = _accelerate_run("tpu", tmp_path)
    assert again == pytest.approx(first, rel=1e-6)
    cpu = _accelerate_run("cpu", tmp_path / "cpu")
    assert files == cpu[2] and model_files == cpu[3]


# ---- PEFT ------------------------------------------------------------------------------------


@slow
@pytest.mark.parametrize("m", ["strict", "defer"])
def test_peft_adapter_save_and_reload(tmp_path, m):
    peft = pytest.importorskip("peft")
    x = _Data().x[:2]
    with lazyrt.set_mode(m):
        cfg = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        model = peft.get_peft_model(tiny_llama().to("tpu"), cfg)
        model.save_pretrained(tmp_path / "adapter")
        ref = model(input_ids=x.to("tpu")).logits.cpu()
        back = peft.PeftModel.from_pretrained(tiny_llama().to("tpu"), tmp_path / "adapter")
        torch.testing.assert_close(back(input_ids=x.to("tpu")).logits.cpu(), ref)
    cpu = peft.PeftModel.from_pretrained(tiny_llama(), tmp_path / "adapter")
    torch.testing.assert_close(cpu(input_ids=x).logits, ref, rtol=1e-4, atol=1e-4)


# ---- device_map: tpu + cpu (+ disk) -----------------------------------------------------------

_SPLIT = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu",
          "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": 0}


def _split_run(tmp_path, device_map, **kwargs):
    pytest.importorskip("accelerate")
    path = tmp_path / "ckpt"
    if not path.exists():
        tiny_llama(tie=False).save_pretrained(path)
    ref = transformers.LlamaForCausalLM.from_pretrained(path)
    model = transformers.LlamaForCausalLM.from_pretrained(path, device_map=device_map, **kwargs)
    devices = {p.device.type for p in model.parameters()}
    x = torch.tensor([[1, 5, 9, 2, 7]])
    logits = model(x.to("tpu")).logits.cpu()
    torch.testing.assert_close(logits, ref(x).logits, rtol=1e-4, atol=1e-5)
    gen = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    assert model.generate(x.to("tpu"), **gen).cpu().tolist() == ref.generate(x, **gen).tolist()
    return model, devices


@pytest.mark.parametrize("m", ["defer", pytest.param("strict", marks=slow)])
def test_device_map_split_tpu_cpu(tmp_path, m):
    with lazyrt.set_mode(m):
        model, devices = _split_run(tmp_path, _SPLIT)
    assert model.hf_device_map == _SPLIT
    assert model.model.layers[0].self_attn.q_proj.weight.device.type == "tpu"


@slow
@pytest.mark.parametrize("m", ["strict", "defer"])
def test_device_map_split_tpu_cpu_disk(tmp_path, m):
    split = dict(_SPLIT, **{"model.layers.1": "disk"})
    with lazyrt.set_mode(m):
        model, _ = _split_run(tmp_path, split, offload_folder=str(tmp_path / "off"))
    assert model.hf_device_map["model.layers.1"] == "disk"


@slow
@pytest.mark.parametrize("m", ["strict", "defer"])
def test_device_map_auto_with_max_memory(tmp_path, m):
    """accelerate's own planning with an explicit budget that splits the model: the
    embedding and head on tpu, the layers offloaded to the CPU (its hooks move them)."""
    with lazyrt.set_mode(m):
        model, devices = _split_run(tmp_path, "auto", max_memory={0: "80KB", "cpu": "100MB"})
    assert set(model.hf_device_map.values()) == {0, "cpu"}
    # offloaded weights wait on the meta device (accelerate's hooks bring them in), as on CUDA
    assert "tpu" in devices and devices <= {"tpu", "cpu", "meta"}


@slow
def test_dispatch_model_infer_auto_device_map(tmp_path):
    accelerate = pytest.importorskip("accelerate")
    torch.manual_seed(0)
    model = tiny_llama(tie=False)
    ref = tiny_llama(tie=False)
    dm = accelerate.infer_auto_device_map(model, max_memory={0: "80KB", "cpu": "100MB"},
                                          no_split_module_classes=["LlamaDecoderLayer"])
    assert set(dm.values()) == {0, "cpu"}
    model = accelerate.dispatch_model(model, device_map=dm)
    x = torch.tensor([[3, 1, 4, 1, 5]])
    torch.testing.assert_close(model(x.to("tpu")).logits.cpu(), ref(x).logits,
                               rtol=1e-4, atol=1e-5)

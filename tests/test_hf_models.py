"""Real Hugging Face ``transformers`` architectures on tpu, against PyTorch CPU eager.

Every architecture in ``hf_zoo.ARCHS`` (decoder LMs with GQA, rotary, ALiBi and sliding
windows; mixture-of-experts; state-space models; encoders; encoder-decoders; vision;
speech; multimodal) is built from a tiny config (random init, no hub access) and
checked by ``check_family`` (``test_model_families.py``: its tolerances and method) in
strict and in defer mode: the forward outputs, the gradient of every parameter, the loss,
and every parameter and buffer after one AdamW step.

A model that does not match names the ATen op that fails: an op that raises names
itself; otherwise ``_oplocate.locate`` reruns the step comparing every ATen op with the
CPU on its own inputs and lists those that differ.

The default (CI) run takes about one in 9 of the ``CI_SAMPLE`` cases (``sweep``: two
ninths of its architectures, each in one mode); all of them, and every architecture, in both modes
run with ``-m slow``:

    python -m pytest tests/test_hf_models.py -m slow -n 2

Skips cleanly when ``transformers`` is not installed (``pip install -e '.[test]'``
installs it).
"""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from _oplocate import OP_RE, locate  # noqa: E402
from hf_zoo import ARCHS  # noqa: E402
from test_model_families import _one_cpu_thread, check_family  # noqa: E402,F401

# One architecture per kind, ~60-90 s in the default run on 2 cores.
CI_SAMPLE = ["llama", "mistral", "mixtral_eager_experts", "mamba", "bert", "t5", "vit",
             "whisper", "clip"]

# name -> reason (xfail(strict=True): a model that starts passing fails the run until
# its entry is removed). A reason names the failing ATen op.
XFAIL: dict[str, str] = {}

XFAIL_MODE: dict[tuple[str, str], str] = {}


class _Wrap(torch.nn.Module):
    """Calls the HF model with keyword inputs; returns what the entry picks (logits)."""

    def __init__(self, model, keys, pick):
        super().__init__()
        self.model, self.keys, self.pick = model, keys, pick

    def forward(self, *inputs):
        return self.pick(self.model(**dict(zip(self.keys, inputs))))


def check_hf(name, mode):
    arch = ARCHS[name]
    inputs, targets = arch.batch()
    keys = list(inputs)

    def model_fn():
        return _Wrap(arch.build(), keys, arch.pick).train(arch.train)

    def batch_fn():
        return (*inputs.values(), *targets)

    try:
        check_family(model_fn, batch_fn, len(keys), arch.loss, mode, steps=1,
                     allow_unused=True, **arch.tol)
    except Exception as ex:
        msg = f"{type(ex).__name__}: {ex}"
        if not OP_RE.search(msg):
            model = model_fn().to("tpu")  # the same initial weights (seeded build)
            where = locate(model, [t.to("tpu") for t in inputs.values()],
                           [t.to("tpu") for t in targets], arch.loss)
            msg = f"{where}\n{msg}"
        raise AssertionError(f"{name} ({mode}): {msg}") from ex


def _params(names):
    out = []
    for name in names:
        for mode in ("strict", "defer"):
            reason = XFAIL_MODE.get((name, mode), XFAIL.get(name))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            out.append(pytest.param(name, mode, marks=marks, id=f"{name}-{mode}"))
    return out


@pytest.mark.sweep(every=9)
@pytest.mark.parametrize("name,mode", _params(CI_SAMPLE))
def test_hf_model_sample(name, mode):
    check_hf(name, mode)


@pytest.mark.slow
@pytest.mark.parametrize("name,mode", _params(ARCHS))
def test_hf_model(name, mode):
    check_hf(name, mode)


def test_a_wrong_lowering_is_named():
    """A model that does not match names the ATen op at fault: break one lowering (GELU
    lowered as ReLU) and check BERT's failure message."""
    import jax

    from lazyrt._ops import control as _control  # the op's entry holds the lowering it runs
    from lazyrt._ops import resolve as _resolve

    op = torch.ops.aten.gelu.default
    entry = _resolve.resolve(op)
    fn = entry.fn

    def swap(new):
        _control.invalidate_compiled([op], change=lambda: setattr(entry, "fn", new))

    swap(lambda self, approximate="none": jax.nn.relu(self))
    try:
        with pytest.raises(AssertionError) as info:
            check_hf("bert", "strict")
    finally:
        swap(fn)
    msg = str(info.value)
    assert "ATen op(s) differing from CPU eager: aten.gelu.default" in msg, msg
    assert "forward output" in msg


def test_zoo_covers_the_kinds():
    assert len(ARCHS) >= 30
    assert set(CI_SAMPLE) <= set(ARCHS)

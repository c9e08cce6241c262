"""FlexAttention on tpu (``torch.nn.attention.flex_attention``): forward and backward with
score and mask mods, block masks built on tpu, eagerly (strict, defer) and compiled,
against PyTorch's own CPU math (``sdpa_dense``, the HOP's CPU kernel)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.attention.flex_attention as fa
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import lazyrt

pytestmark = pytest.mark.sweep(every=2)

B, H, L, E = 2, 2, 128, 16
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _causal(b, h, q, kv):
    return q >= kv


def _softcap(score, b, h, q, kv):
    return 20.0 * torch.tanh(score / 20.0)


def _document(doc):
    def mask_mod(b, h, q, kv):
        return (doc[b, q] == doc[b, kv]) & (q >= kv)

    return mask_mod


def _alibi(bias):
    def score_mod(score, b, h, q, kv):
        return score + bias[h] * (kv - q)

    return score_mod


def _docs():
    pos = torch.cat([torch.arange(50), torch.arange(30), torch.arange(48)])
    return torch.stack([torch.cumsum((pos == 0).int(), 0) - 1, torch.zeros(L, dtype=torch.int64)])


# name -> (score mod maker, mask mod maker, kv heads): a maker takes the device's tensors
CASES = {
    "causal": (lambda t: None, lambda t: _causal, H),
    "document": (lambda t: None, lambda t: _document(t["doc"]), H),
    "alibi_grad": (lambda t: _alibi(t["bias"]), lambda t: _causal, H),
    "softcap_gqa": (lambda t: _softcap, lambda t: _causal, 1),
}


def _inputs(case, dtype):
    g = torch.Generator().manual_seed(0)
    hkv = CASES[case][2]
    q = torch.randn(B, H, L, E, generator=g, dtype=dtype)
    k, v = (torch.randn(B, hkv, L, E, generator=g, dtype=dtype) for _ in range(2))
    grad = torch.randn(B, H, L, E, generator=g, dtype=dtype)
    return {"q": q, "k": k, "v": v, "grad": grad, "doc": _docs(),
            "bias": torch.tensor([0.1, -0.2], requires_grad=True)}


def _run(case, t, device, fn):
    """out, lse and the gradients of q, k, v (and a captured bias) of ``case``."""
    score_of, mask_of, hkv = CASES[case]
    mask = create_block_mask(mask_of(t), B, None, L, L, device=device)
    q, k, v = (t[n].detach().requires_grad_() for n in "qkv")
    out, aux = fn(q, k, v, score_mod=score_of(t), block_mask=mask, enable_gqa=hkv != H,
                  return_aux=fa.AuxRequest(lse=True))
    out.backward(t["grad"])
    grads = [q.grad, k.grad, v.grad]
    if case == "alibi_grad":
        grads.append(t["bias_leaf"].grad)
    return [x.detach().cpu().float() for x in [out, aux.lse, *grads]]


def _on(device, t):
    out = {n: x.to(device) for n, x in t.items() if n != "bias"}
    leaf = t["bias"].detach().clone().requires_grad_()
    out["bias_leaf"] = leaf
    out["bias"] = leaf.to(device) if device != "cpu" else leaf
    return out


def _cpu(case, dtype, monkeypatch):
    """PyTorch's CPU math: the HOP's own kernel, with FlexAttention's check that refuses
    a CPU backward lifted (a CPU limit of its fused kernels, not of this math)."""
    with monkeypatch.context() as m:
        m.setattr(fa, "_validate_device", lambda q, k, v: None)
        return _run(case, _on("cpu", _inputs(case, dtype)), "cpu", flex_attention)


def _tol(dtype):
    return {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4,
                                                                          "atol": 1e-5}


def _close(got, exp, dtype):
    names = ["out", "lse", "dq", "dk", "dv", "dbias"]
    for name, a, b in zip(names, got, exp):
        torch.testing.assert_close(a, b, **_tol(dtype), msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("case", list(CASES))
def test_eager_matches_cpu(mode, case, monkeypatch):
    exp = _cpu(case, torch.float32, monkeypatch)
    got = _run(case, _on("tpu", _inputs(case, torch.float32)), "tpu", flex_attention)
    _close(got, exp, torch.float32)


@pytest.mark.parametrize("case", ["document", "alibi_grad", "softcap_gqa"])
def test_compiled_is_one_program_and_matches_cpu(mode, case, monkeypatch):
    exp = _cpu(case, torch.float32, monkeypatch)
    before = lazyrt.metrics.counters().get("compiled_eager_calls", 0)
    compiled = torch.compile(flex_attention, backend="tpu")
    got = _run(case, _on("tpu", _inputs(case, torch.float32)), "tpu", compiled)
    _close(got, exp, torch.float32)
    assert lazyrt.metrics.counters().get("compiled_eager_calls", 0) == before


def test_bfloat16_eager_and_compiled(monkeypatch):
    exp = _cpu("document", torch.bfloat16, monkeypatch)
    for fn in (flex_attention, torch.compile(flex_attention, backend="tpu")):
        got = _run("document", _on("tpu", _inputs("document", torch.bfloat16)), "tpu", fn)
        _close(got, exp, torch.bfloat16)


def test_block_mask_built_on_tpu(mode):
    doc = _docs()
    cpu = create_block_mask(_document(doc), B, None, L, L, device="cpu", BLOCK_SIZE=32)
    tpu = create_block_mask(_document(doc.to("tpu")), B, None, L, L, device="tpu", BLOCK_SIZE=32)
    assert tpu.kv_num_blocks.device.type == "tpu"
    for a, b in zip(tpu.as_tuple()[2:14], cpu.as_tuple()[2:14]):
        if isinstance(b, torch.Tensor):
            assert torch.equal(a.cpu(), b)


def test_compiled_block_mask_on_tpu(mode):
    """``torch.compile(create_block_mask)`` (torchtitan's): a graph with no tpu input that
    creates tpu tensors and reads a captured one."""
    doc = _docs()
    cpu = create_block_mask(_document(doc), B, None, L, L, device="cpu", BLOCK_SIZE=32)
    tpu = torch.compile(create_block_mask)(_document(doc.to("tpu")), B, None, L, L,
                                           device="tpu", BLOCK_SIZE=32)
    for a, b in zip(tpu.as_tuple()[2:14], cpu.as_tuple()[2:14]):
        if isinstance(b, torch.Tensor):
            assert torch.equal(a.cpu(), b)


def test_other_devices_still_refused():
    """The device check still refuses what PyTorch refuses (a CPU backward)."""
    q = torch.randn(1, 1, 16, 8, requires_grad=True)
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        flex_attention(q, q, q)


# A fresh interpreter, where nothing compiled before: its first Dynamo use is FlexAttention's.
_FIRST_USE = """
import torch, lazyrt
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
doc = torch.tensor([[0] * 40 + [1] * 24, [0] * 64])
def mask_of(d):
    return lambda b, h, q, kv: (d[b, q] == d[b, kv]) & (q >= kv)
if FIRST == "compiled_block_mask":  # no tpu argument: the tpu tensor is a closure's
    got = torch.compile(create_block_mask)(mask_of(doc.to("tpu")), 2, None, 64, 64,
                                           device="tpu", BLOCK_SIZE=16)
    exp = create_block_mask(mask_of(doc), 2, None, 64, 64, device="cpu", BLOCK_SIZE=16)
    for a, b in zip(got.as_tuple()[2:14], exp.as_tuple()[2:14]):
        if isinstance(b, torch.Tensor):
            assert torch.equal(a.cpu(), b), (a, b)
else:  # eager flex_attention compiles its HOP wrapper with PyTorch's backend="eager"
    q = torch.randn(2, 2, 64, 8, generator=torch.Generator().manual_seed(0))
    mask = create_block_mask(mask_of(doc), 2, None, 64, 64, device="cpu", BLOCK_SIZE=16)
    exp = flex_attention(q, q, q, block_mask=mask)
    tmask = create_block_mask(mask_of(doc.to("tpu")), 2, None, 64, 64, device="tpu",
                              BLOCK_SIZE=16)
    t = q.to("tpu")
    got = flex_attention(t, t, t, block_mask=tmask)
    torch.testing.assert_close(got.cpu(), exp, rtol=1e-4, atol=1e-5)
print("ok")
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("first", ["compiled_block_mask", "eager_flex"])
def test_first_dynamo_use_in_a_process(first):
    """Dynamo is set up for tpu tensors by any ``torch.compile`` call, whatever its backend:
    a compiled ``create_block_mask`` over a captured tpu tensor (no tpu argument) runs on
    tpu, and eager ``flex_attention`` (PyTorch compiles its wrapper with backend="eager")
    traces tpu tensors, as the first Dynamo use of a process."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TORCH_TPU_MODE", None)
    r = subprocess.run([sys.executable, "-c", f"FIRST = {first!r}\n" + _FIRST_USE],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


class _Block(torch.nn.Module):
    """torchtitan's shape: a compiled block (fullgraph) calling a compiled flex_attention."""

    compiled_flex = staticmethod(torch.compile(flex_attention))

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(E, E)

    def forward(self, x, mask):
        return self.compiled_flex(self.proj(x), x, x, block_mask=mask)


def test_compiled_flex_inside_a_compiled_block(mode, monkeypatch):
    torch.manual_seed(0)
    block = _Block()
    x = torch.randn(B, H, L, E)
    doc = _docs()
    with monkeypatch.context() as m:  # the CPU math's backward (see ``_cpu``)
        m.setattr(fa, "_validate_device", lambda q, k, v: None)
        exp = flex_attention(block.proj(x), x, x,
                             block_mask=create_block_mask(_document(doc), B, None, L, L,
                                                          device="cpu"))
        exp.sum().backward()
    tblock = _Block().to("tpu")
    tblock.load_state_dict(block.state_dict())
    tblock.compile(fullgraph=True)
    before = lazyrt.metrics.counters().get("compiled_eager_calls", 0)
    got = tblock(x.to("tpu"), create_block_mask(_document(doc.to("tpu")), B, None, L, L,
                                                device="tpu"))
    got.sum().backward()
    assert lazyrt.metrics.counters().get("compiled_eager_calls", 0) == before
    torch.testing.assert_close(got.detach().cpu(), exp.detach(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(tblock.proj.weight.grad.cpu(), block.proj.weight.grad,
                               rtol=1e-4, atol=1e-4)

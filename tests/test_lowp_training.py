"""Mixed-precision training on tpu against the same training under CPU autocast.

A small CNN (convolutions, batch norm, max and adaptive average pooling, a linear head) and a
small transformer (embedding, a ``TransformerEncoderLayer``, layer norm, a linear head) train a
few steps under ``torch.autocast(device, dtype)`` with a ``torch.amp.GradScaler``, once on the
CPU (``torch.autocast("cpu", ...)``) and once on tpu (``torch.autocast("tpu", ...)``), in
bfloat16 and float16, strict and defer. Same initial weights, same batches: the logits' dtype,
the losses, the scales and the float32 parameters after the last step must agree.

The two policies are not identical (tpu follows CUDA's lists, ``lazyrt/_torch/autocast.py``:
softmax and layer norm run in float32 there, in the low dtype on the CPU), and low-precision
rounding differs between XLA and PyTorch's CPU kernels, so values are compared within a few
units in the last place of the dtype (``TOL``). The basic autocast and GradScaler behaviour
(dtypes per op, back-off and growth of the scale) is in ``test_semantics.py``.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from _util import assert_close

pytestmark = pytest.mark.sweep(every=4)

# (rtol, atol) for the losses and the parameters after STEPS steps.
TOL = {torch.bfloat16: (2e-3, 2e-3), torch.float16: (5e-4, 2e-4)}
STEPS = 4


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.c1(x))), 2)
        x = F.relu(self.c2(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class TinyTransformer(nn.Module):
    def __init__(self, vocab=64, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, x):
        return self.head(self.norm(self.layer(self.emb(x))))


def _batch(name, step):
    g = torch.Generator().manual_seed(100 + step)
    if name == "cnn":
        return torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)
    x = torch.randint(0, 64, (2, 12), generator=g)
    return x, torch.roll(x, 1, 1)


def _train(model, name, device, dtype):
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler(device)  # the default scale, 2**16
    losses, scales = [], []
    for step in range(STEPS):
        x, y = (t.to(device) for t in _batch(name, step))
        with torch.autocast(device, dtype=dtype):
            out = model(x)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))
        assert out.dtype == dtype
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    params = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return losses, scales, params


@pytest.mark.parametrize("name", ["cnn", "transformer"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_autocast_gradscaler_training_matches_cpu(name, dtype, mode):
    torch.manual_seed(0)
    model = CNN() if name == "cnn" else TinyTransformer()
    cpu = _train(copy.deepcopy(model), name, "cpu", dtype)
    tpu = _train(copy.deepcopy(model), name, "tpu", dtype)
    rtol, atol = TOL[dtype]
    assert tpu[1] == cpu[1], f"scales: tpu {tpu[1]} cpu {cpu[1]}"
    assert_close(tpu[0], cpu[0], rtol=rtol, atol=atol, path="losses")
    for k, v in cpu[2].items():
        assert_close(tpu[2][k], v, rtol=rtol, atol=atol, path=k)

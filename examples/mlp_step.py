"""A small MLP trained for a few steps on the ``tpu`` device with AdamW.

    python examples/mlp_step.py [STEPS]
    lazyrt-mem run --mode defer examples/mlp_step.py
    lazyrt-mem compare examples/mlp_step.py
"""
import sys

import torch
from torch import nn

import lazyrt  # noqa: F401  (registers the tpu device)


def main(steps: int = 5) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(),
        nn.Linear(512, 512), nn.ReLU(),
        nn.Linear(512, 10),
    ).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(128, 256).to("tpu")
    y = torch.randint(0, 10, (128,)).to("tpu")
    loss_fn = nn.CrossEntropyLoss()
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)

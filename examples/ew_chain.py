"""20 chained elementwise ops on a 1M-float tensor, then one read back.

In strict mode every intermediate is materialized; in defer mode the chain is
one fused computation and only its result is.

    python examples/ew_chain.py [NUMEL]
    lazyrt-mem compare examples/ew_chain.py
"""
import sys

import torch

import lazyrt


def main(numel: int = 1 << 20) -> None:
    torch.manual_seed(0)
    x = torch.randn(numel).to("tpu")
    lazyrt.sync()  # x is materialized: the chain below starts from device data
    y = x
    for i in range(20):
        if i % 4 == 0:
            y = torch.sin(y)
        elif i % 4 == 1:
            y = y * 1.5
        elif i % 4 == 2:
            y = y + 0.25
        else:
            y = torch.tanh(y)
    lazyrt.sync()
    out = y.cpu()
    print(f"checksum {out.sum().item():.4f} over {numel} floats")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20)

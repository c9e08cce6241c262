"""Uneven shardings: what one device holds for a tensor marked on dimensions the mesh does
not divide (4 CPU devices in one process, a 2 x 2 mesh). Reported, never asserted.

    python -m perf.spmd_uneven

For each shape: the spec asked for, the spec stored (a dimension the axes do not divide is
kept whole), one device's block and its bytes, and what XLA's padded shards would hold.
"""
from __future__ import annotations

import math


def main() -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", 4)
    import torch

    import lazyrt.distributed as ld

    mesh = ld.Mesh(range(4), (2, 2), ("dp", "fsdp"))
    spec = ("dp", "fsdp")
    print(f"{'shape':>14} {'stored':>16} {'block':>14} {'bytes/device':>13} {'padded (XLA)':>13}")
    for shape in ((1024, 1024), (1023, 1024), (1023, 1023), (2, 1024)):
        t = ld.mark_sharding(torch.zeros(shape, device="tpu"), mesh, spec)
        i = ld.sharding_info(t)
        padded = math.prod(-(-n // 2) for n in shape) * 4
        print(f"{str(shape):>14} {str(tuple(i.spec)):>16} {str(i.shard_shape):>14} "
              f"{i.bytes_per_device:>13} {padded:>13}")


if __name__ == "__main__":
    main()

"""Run torchtitan's trainer (``python -m torchtitan.train``) on tpu, or on the CPU as the
reference, for ``tests/test_torchtitan.py`` and ``docs/torchtitan.md``.

    TITAN_DEVICE=tpu python tests/titan_launch.py --module llama3 --config llama3_debugmodel ...

Every argument goes to torchtitan as it is; run it from a directory holding
``tests/assets/tokenizer`` and ``tests/assets/c4_test`` (``tests/_titan.py`` makes them),
with ``tests/titan_site`` on PYTHONPATH (torchtitan's triton module, stood in). torchrun
runs it per rank as well; without torchrun it sets up a single rank itself.

Environment:
  TITAN_DEVICE   tpu (default; torchtitan finds the device by itself) or cpu
  TITAN_INIT     a file of the model's full initial parameters: rank 0 writes it after the
                 trainer is built when it does not exist, and every run that finds it loads
                 it, so runs on other devices, modes or meshes start from the same weights
                 (tpu's random numbers are JAX's, not the CPU's)
  TITAN_LOSSES   rank 0 writes ``[[step, loss, grad_norm], ...]`` there (JSON) after each step

What this file changes, and why (nothing else is changed):
  * both devices: ``torch.distributed.set_timeout``, which torchtitan 0.3.0 calls after the
    first step, is missing from torch 2.13 (a version skew between the two; the same on
    CUDA): a no-op stand-in.
  * cpu only (the reference): torchtitan looks for an accelerator and falls back to
    "cuda", so the device type is "cpu" and ``torch.cpu`` gets the few CUDA-style calls
    torchtitan makes; FlexAttention has no CPU backward and CPU inductor needs a C++
    toolchain, so on the CPU ``create_block_mask`` and ``flex_attention`` run eagerly and
    ``flex_attention`` runs PyTorch's dense reference math (``sdpa_dense``), forward and
    backward.
"""
from __future__ import annotations

import json
import os
import sys

DEVICE = os.environ.get("TITAN_DEVICE", "tpu")

for _k, _v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1"),
               ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29571")):  # _titan.py sets a free port
    os.environ.setdefault(_k, _v)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if DEVICE == "tpu":
    import lazyrt  # noqa: F401  (torchtitan picks the "tpu" device by itself)
else:
    import torch._utils

    torch._utils._get_available_device_type = lambda: "cpu"

    class _CpuProperties:
        name = "cpu"
        total_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    for _name, _fn in {
        "get_device_name": lambda device=None: "cpu",
        "get_device_properties": lambda device=None: _CpuProperties(),
        "memory_stats": lambda device=None: {},
        "reset_peak_memory_stats": lambda device=None: None,
        "empty_cache": lambda: None,
    }.items():
        if not hasattr(torch.cpu, _name):
            setattr(torch.cpu, _name, _fn)
    torch.cpu.current_device = lambda: 0  # torchtitan passes it to barrier(device_ids=[...])

    import importlib

    import torchtitan.models.common.attention as _att
    from torch.nn.attention import flex_attention as _fa

    _hop = importlib.import_module("torch._higher_order_ops.flex_attention")
    _att._compiled_create_block_mask = _fa.create_block_mask
    _att.FlexAttention._compiled_flex_attn = staticmethod(_fa.flex_attention)
    _fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True  # the HOP eagerly: sdpa_dense
    _validate = _fa._validate_device

    def _validate_device(query, key, value):
        if query.device.type != "cpu":
            _validate(query, key, value)

    _fa._validate_device = _validate_device

if not hasattr(dist, "set_timeout"):
    dist.set_timeout = lambda timeout, group=None: None

import torchtitan.components.metrics as _metrics  # noqa: E402
import torchtitan.trainer as _trainer  # noqa: E402

_RANK0 = os.environ["RANK"] == "0"
_losses: list = []
_log = _metrics.MetricsProcessor.log


def _record(self, step, global_avg_loss, global_max_loss, grad_norm, *args, **kwargs):
    _losses.append([int(step), float(global_avg_loss), float(grad_norm)])
    path = os.environ.get("TITAN_LOSSES")
    if path and _RANK0:
        with open(path, "w") as f:
            json.dump(_losses, f)
    return _log(self, step, global_avg_loss, global_max_loss, grad_norm, *args, **kwargs)


_metrics.MetricsProcessor.log = _record
_init = _trainer.Trainer.__init__


def _init_weights(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    path = os.environ.get("TITAN_INIT")
    if not path:
        return
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = {n: p for m in self.model_parts for n, p in m.named_parameters()}
    if not os.path.exists(path):
        full = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu()
                for n, p in params.items()}
        if _RANK0:
            torch.save(full, path + ".tmp")
            os.replace(path + ".tmp", path)
        return
    saved = torch.load(path)
    assert set(saved) == set(params), "TITAN_INIT holds other parameters"
    with torch.no_grad():
        for n, p in params.items():
            src = saved[n].to(dtype=p.dtype)
            if isinstance(p, DTensor):
                p.to_local().copy_(distribute_tensor(src.to(p.device), p.device_mesh,
                                                     p.placements).to_local())
            else:
                p.copy_(src.to(p.device))


_trainer.Trainer.__init__ = _init_weights

if __name__ == "__main__":
    from torchtitan.train import main

    sys.argv = ["torchtitan.train", *sys.argv[1:]]
    main()

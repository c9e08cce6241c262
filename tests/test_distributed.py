"""Distributed ``tpu``: the CI sample (the full matrix is tests/test_distributed_full.py).

Ranks are real processes (tests/dist_worker.py) on 127.0.0.1, started together with a
hard timeout (tests/_dist_launch.py); each compares its tpu results with plain PyTorch on
the CPU, and these tests assert every comparison. One 2-process launch costs ~10-30 s
here, so each launch runs several checks.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from _dist_launch import ROOT, check_items, launch

pytestmark = pytest.mark.subprocess


def _only(results, check):
    return [{check: r[check]} for r in results if check in r]


def test_import_lazyrt_registers_backends_cheaply():
    code = (
        "import time, sys\n"
        "import torch\n"
        "t = time.perf_counter(); import lazyrt; t = time.perf_counter() - t\n"
        "import torch.distributed as dist\n"
        "from jax._src import xla_bridge\n"
        "print(sorted(set(dist.Backend.backend_list) & {'tpu', 'tpu_dist'}),\n"
        "      dist.Backend.default_device_backend_map['tpu'],\n"
        "      xla_bridge.backends_are_initialized(),\n"
        "      'lazyrt.distributed._backend' in sys.modules, 'jax.distributed' in sys.modules,\n"
        "      hasattr(torch.tpu, 'Stream') and hasattr(torch.tpu, 'Event'),\n"
        "      torch.tpu.current_stream().wait_stream(torch.tpu.Stream()) is None)\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    # backends registered, JAX's backend not started, the backend module not loaded
    assert p.stdout.split("\n")[0] == "['tpu', 'tpu_dist'] tpu False False True True True" or \
        p.stdout.split("\n")[0] == "['tpu', 'tpu_dist'] tpu False False False True True", p.stdout


# NOTE: one test per launch (not module fixtures): under pytest-xdist a fixture shared by
# tests on two workers would launch its ranks twice.


def test_collectives_host_side_functional_fused_and_deadlock_rule():
    """host_side: CPU tensors over gloo, object collectives, barrier, subgroups, names;
    functional: the _c10d_functional ops; collectives_fused: every collective in fused
    defer mode (float32, bfloat16, int64, bool, float64 0-d, views); fused_hazards: the
    anti-deadlock rule exercised on purpose."""
    res = launch(["host_side", "functional", "collectives_fused", "fused_hazards"], timeout=300)
    for check in ("host_side", "functional", "collectives_fused"):
        check_items(_only(res, check))
    names = {n for n, _, _ in res[0]["collectives_fused"]}
    for op in ("all_reduce sum", "all_reduce avg", "all_reduce max", "all_reduce min",
               "all_reduce product", "broadcast", "all_gather", "all_gather_into_tensor",
               "reduce_scatter sum", "reduce_scatter_tensor max", "all_to_all",
               "all_to_all_single uneven", "scatter", "gather", "reduce", "send/recv ring"):
        assert any(op in n for n in names), op
    info = check_items(_only(res, "fused_hazards"))
    for r in range(2):
        assert info[(r, "rank-local sync vs barrier: seconds")] < 30
        assert info[(r, "mismatch seconds")] < 30
    assert 2.5 < info[(0, "timeout seconds")] < 30


def test_ddp_fsdp2_dtensor_match_single_process():
    """DDP (fused AdamW with small buckets and bucket views, defer SGD) and FSDP2 (fused
    SGD, strict AdamW) on 2 ranks vs one process on the full batch (CPU) to 1e-6; DTensor
    over init_device_mesh('tpu', ...) in strict, defer and fused mode."""
    res = launch(["ddp_ci", "fsdp2_ci", "dtensor"], timeout=400)
    info = check_items(_only(res, "ddp_ci"))
    assert info[(0, "ddp fused adamw view=True bucket=0.0005 flushes per step")][-1] == 1
    assert info[(0, "ddp defer sgd view=False bucket=25 flushes per step")][-1] == 2
    info = check_items(_only(res, "fsdp2_ci"))
    assert info[(0, "fsdp2 fused sgd reshard=True flushes per step")][-1] == 1
    check_items(_only(res, "dtensor"))


def test_spmd_four_devices_one_process():
    (res,) = launch(["spmd"], nprocs=1, timeout=300, env={"LAZYRT_TEST_CPU_DEVICES": "4"})
    info = check_items([res])
    assert info[(0, "defer FSDPv2 adamw flushes in the last step")] == 1


def test_jax_started_late_is_a_clear_error():
    res = launch(["start_late"], timeout=120)
    for r in res:
        items = {n: (g, e) for n, g, e in r["start_late"]}
        assert items["error"][0] == "RuntimeError"
        assert "init_process_group('tpu')" in items["message"][0]


def test_reduce_op_names_and_premul_sum_factor():
    """How a c10d reduce op reads (no process group needed): PREMUL_SUM keeps its factor,
    a PREMUL_SUM without one and an unknown op are errors that name them."""
    import torch.distributed as dist

    from lazyrt.distributed._pgutil import reduce_op

    assert reduce_op(dist.ReduceOp.SUM) == ("sum", None)
    assert reduce_op(dist.ReduceOp.AVG) == ("avg", None)
    assert reduce_op("max") == ("max", None)
    assert reduce_op(dist._make_nccl_premul_sum(0.5)) == ("sum", 0.5)
    name, factor = reduce_op(dist._make_nccl_premul_sum(torch.tensor(0.25)))
    assert name == "sum" and torch.equal(factor, torch.tensor(0.25))
    with pytest.raises(ValueError, match="PREMUL_SUM needs a factor"):
        reduce_op(dist.ReduceOp.PREMUL_SUM)
    with pytest.raises(ValueError, match="'foo'"):
        reduce_op("foo")

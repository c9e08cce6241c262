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
from _dist_launch import ROOT, check_items, launch


@pytest.fixture(scope="module")
def group_checks():
    return launch(["host_side", "functional", "collectives_fused", "fused_hazards"], timeout=300)


@pytest.fixture(scope="module")
def training_checks():
    return launch(["ddp_ci", "fsdp2_ci", "dtensor"], timeout=400)


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


def test_host_side_objects_subgroups(group_checks):
    check_items(_only(group_checks, "host_side"))


def test_functional_collectives(group_checks):
    check_items(_only(group_checks, "functional"))


def test_collectives_fused_defer(group_checks):
    check_items(_only(group_checks, "collectives_fused"))
    names = {n for n, _, _ in group_checks[0]["collectives_fused"]}
    for op in ("all_reduce sum", "all_reduce avg", "all_reduce max", "all_reduce min",
               "all_reduce product", "broadcast", "all_gather", "all_gather_into_tensor",
               "reduce_scatter sum", "reduce_scatter_tensor max", "all_to_all",
               "all_to_all_single uneven", "scatter", "gather", "reduce", "send/recv ring"):
        assert any(op in n for n in names), op


def test_fused_deadlock_pattern_finishes(group_checks):
    info = check_items(_only(group_checks, "fused_hazards"))
    for r in range(2):
        assert info[(r, "rank-local sync vs barrier: seconds")] < 30
        assert info[(r, "mismatch seconds")] < 30
    assert 2.5 < info[(0, "timeout seconds")] < 30


def test_ddp_matches_single_process(training_checks):
    info = check_items(_only(training_checks, "ddp_ci"))
    assert info[(0, "ddp fused adamw view=True bucket=0.0005 flushes per step")][-1] == 1
    assert info[(0, "ddp defer sgd view=False bucket=25 flushes per step")][-1] == 2


def test_fsdp2_matches_single_process(training_checks):
    info = check_items(_only(training_checks, "fsdp2_ci"))
    assert info[(0, "fsdp2 fused sgd reshard=True flushes per step")][-1] == 1


def test_dtensor(training_checks):
    check_items(_only(training_checks, "dtensor"))


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

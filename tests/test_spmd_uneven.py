"""Uneven shardings: SPMD ``mark_sharding`` and ``FSDPv2`` on dimensions the mesh does not
divide (4 CPU devices in one process), and DTensor's uneven shards over c10d (2 ranks).

The checks run in tests/spmd_uneven_worker.py (JAX's device count is fixed before its
backend starts, so they need a fresh process); each compares with plain PyTorch on the CPU.
"""
from __future__ import annotations

import os

import pytest
from _dist_launch import ROOT, check_items, launch

pytestmark = pytest.mark.subprocess

WORKER = os.path.join(ROOT, "tests", "spmd_uneven_worker.py")


def test_mark_sharding_uneven_dims_and_errors():
    (res,) = launch(["marks"], nprocs=1, timeout=300, script=WORKER,
                    env={"LAZYRT_TEST_CPU_DEVICES": "4"})
    check_items([res])


def test_fsdpv2_two_class_head_trains_like_cpu():
    (res,) = launch(["fsdpv2_head"], nprocs=1, timeout=400, script=WORKER,
                    env={"LAZYRT_TEST_CPU_DEVICES": "4"})
    check_items([res])


def test_dtensor_uneven_shards_over_c10d():
    check_items(launch(["dtensor_uneven"], nprocs=2, timeout=300, script=WORKER))

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


FOUR = {"LAZYRT_TEST_CPU_DEVICES": "4"}


# NOTE: one launch for both checks (a 4-device process takes ~10 s to start here).
def test_uneven_marks_and_fsdpv2_two_class_head():
    """mark_sharding on uneven dimensions (a sample of cases; errors that stay errors) and
    FSDPv2 training a 2-class head with AdamW in strict, defer and compiled mode, equal to
    the CPU. The full matrix: the slow test below."""
    (res,) = launch(["marks", "fsdpv2_head"], nprocs=1, timeout=600, script=WORKER, env=FOUR)
    info = check_items([res])
    assert info[(0, "compiled FSDPv2 adamw losses max deviation")] <= 1e-6


@pytest.mark.slow
def test_uneven_full_matrix():
    """Every mark case (1-D and 2-D meshes, materialized and pending values, both modes)
    and FSDPv2 with SGD and AdamW."""
    (res,) = launch(["marks", "fsdpv2_head"], nprocs=1, timeout=900, script=WORKER,
                    env=dict(FOUR, LAZYRT_TEST_FULL="1"))
    check_items([res])


def test_dtensor_uneven_shards_over_c10d():
    check_items(launch(["dtensor_uneven"], nprocs=2, timeout=300, script=WORKER))

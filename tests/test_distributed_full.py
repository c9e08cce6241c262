"""Distributed ``tpu``: the full matrix (``-m slow``; the CI sample is test_distributed.py).

Every collective in strict, defer and fused defer mode on several dtypes; DDP and FSDP2
on 2 ranks in every mode with SGD and AdamW against one process on the full batch;
DTensor on a 2 x 2 mesh (4 ranks); 2 processes x 2 devices (multi-host GSPMD);
``torchrun``; start-up and failure cases.
"""
from __future__ import annotations

import pytest
from _dist_launch import check_items, launch, launch_torchrun

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]


def test_collectives_strict_and_defer():
    check_items(launch(["collectives_strict", "collectives_defer", "functional"], timeout=500))


def test_ddp_all_modes():
    info = check_items(launch(["ddp"], timeout=500))
    for mode, want in (("strict", 0), ("defer", 2), ("fused", 1)):
        assert info[(0, f"ddp {mode} sgd view=False bucket=25 flushes per step")][-1] == want


def test_fsdp2_all_modes():
    info = check_items(launch(["fsdp2"], timeout=500))
    assert info[(0, "fsdp2 fused adamw reshard=True flushes per step")][-1] == 1


def test_dtensor_2x2_mesh_and_collectives_on_4_ranks():
    check_items(launch(["dtensor", "host_side", "collectives_fused"], nprocs=4, timeout=600))


def test_multihost_2_processes_x_2_devices():
    check_items(launch(["multihost"], timeout=400, env={"LAZYRT_TEST_CPU_DEVICES": "2"}))


def test_torchrun_launch_tpu_dist():
    # TorchTPU's backend name, under torchrun's elastic agent
    res = launch_torchrun(["host_side", "ddp_ci"], timeout=400,
                          env={"LAZYRT_TEST_BACKEND": "tpu_dist"})
    check_items(res)


def test_debug_check_catches_mismatched_isolated_collectives():
    check_items(launch(["debug_check"], timeout=200))


def test_missing_peer_is_an_error_with_a_timeout():
    (res,) = launch(["missing_peer"], ranks=[0], timeout=120)
    items = {n: g for n, g, _ in res["missing_peer"]}
    assert items["error"] is not None and items["seconds"] < 60, items


def test_dead_peer_mid_run_is_an_error():
    from _dist_launch import LaunchError

    # rank 1 exits after one collective; rank 0's next all_reduce raises at once (gloo sees
    # the closed connection); at exit JAX's coordination service then aborts rank 0 (its
    # heartbeat check), which is why the launch itself reports a failure.
    try:
        res0 = launch(["peer_dies"], timeout=200, env={"LAZYRT_DIST_HEARTBEAT_TIMEOUT": "10"})[0]
    except LaunchError as e:
        assert "timed out" not in str(e).split("\n")[0], str(e)
        res0 = e.result(0)
    items = {n: g for n, g, _ in res0["peer_dies"]}
    assert items["error"] is not None, items
    assert "Connection closed" in items["message"] or "failed" in items["message"], items
    assert items["seconds"] < 60

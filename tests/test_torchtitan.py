"""torchtitan 0.3.0's llama3 debug model trained by its own trainer (``python -m
torchtitan.train``, through ``tests/titan_launch.py``) on tpu, against the same recipe on
the CPU from the same initial weights (``tests/_titan.py``: tokenizer and dataset built in
code, the CPU reference's weights saved and loaded by every run).

CI runs one rank in defer mode for 3 steps (strict with ``-m slow``); the two-rank runs (FSDP2, tensor
parallel, torchrun on 127.0.0.1) and ``--compile.enable`` run with ``-m slow``. The dataset
makes every data-parallel rank read the 1-rank run's documents, so each run's losses and
gradient norms are the CPU 1-rank run's (up to bf16 rounding: FSDP2's mixed precision
computes in bfloat16).
"""
from __future__ import annotations

import pytest
from _titan import run

pytestmark = pytest.mark.subprocess

STEPS = 3
FSDP2 = ["--parallelism.data-parallel-shard-degree", "2",
         "--parallelism.spmd-backend", "partial_dtensor"]
TP = ["--parallelism.tensor-parallel-degree", "2",
      "--parallelism.spmd-backend", "partial_dtensor"]
COMPILE = ["--compile.enable"]  # the recipe's backend, inductor: tpu work compiles with "tpu"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("titan"))


@pytest.fixture(scope="module")
def init(root):
    return f"{root}/init.pt"


@pytest.fixture(scope="module")
def cpu(root, init):
    """The CPU reference, 1 rank (it writes the initial weights every run loads)."""
    return run(root, "cpu", device="cpu", steps=STEPS, init=init)


def _same(got, ref, loss_tol=2e-3, norm_rtol=2e-2):
    assert [s for s, _, _ in got] == [s for s, _, _ in ref]
    for (step, loss, norm), (_, rloss, rnorm) in zip(got, ref):
        assert loss == pytest.approx(rloss, abs=loss_tol), (step, got, ref)
        assert norm == pytest.approx(rnorm, rel=norm_rtol), (step, got, ref)


@pytest.mark.parametrize("mode", [pytest.param("strict", marks=pytest.mark.slow), "defer"])
def test_one_rank(root, init, cpu, mode):
    _same(run(root, f"tpu1_{mode}", mode=mode, steps=STEPS, init=init), cpu)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_two_ranks_fsdp2(root, init, cpu, mode):
    _same(run(root, f"tpu2_fsdp_{mode}", mode=mode, nprocs=2, steps=STEPS, args=FSDP2,
              init=init), cpu)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_two_ranks_tensor_parallel(root, init, cpu, mode):
    _same(run(root, f"tpu2_tp_{mode}", mode=mode, nprocs=2, steps=STEPS, args=TP,
              init=init), cpu)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_compiled(root, init, cpu, mode):
    _same(run(root, f"tpu1_compiled_{mode}", mode=mode, steps=STEPS, args=COMPILE,
              init=init), cpu)

"""The model families of ``test_model_families.py`` under ``model.compile()`` on tpu, in
strict and defer: logits, every gradient and 3 AdamW steps match CPU eager; one forward
and one backward graph per family (MoE routes tokens, so Dynamo splits it more); in defer
one flush per training step (the ``loss.item()`` sync) and no recompiles after warm-up.
A sample runs in CI; ``-m slow`` runs every family."""
from __future__ import annotations

import pytest
from test_model_families import FAMILIES, STEPS, check_family

import lazyrt

CI_SAMPLE = ("gpt2", "lstm")
# MoE routes tokens with data-dependent shapes (nonzero): Dynamo splits it into more
# graphs, and each routing decision is a sync point in defer mode, eager or compiled.
DATA_DEPENDENT = {"moe"}


def _params(slow: bool):
    return [pytest.param(n, id=n, marks=[pytest.mark.slow] if slow else [])
            for n in FAMILIES if (n in CI_SAMPLE) != slow]


pytestmark = [pytest.mark.sweep(every=2), pytest.mark.usefixtures("fresh_dynamo")]


def _check(family, mode):
    model_fn, batch_fn, n_inputs, loss_fn, tol = FAMILIES[family]
    before = lazyrt.metrics.counters()
    stats: list = []
    check_family(model_fn, batch_fn, n_inputs, loss_fn, mode, compile=True, stats=stats, **tol)
    delta = {k: stats[-1][k] - before[k] for k in ("compiled_graphs", "compiled_eager_calls")}
    assert delta["compiled_eager_calls"] == 0
    if family in DATA_DEPENDENT:
        return
    assert delta["compiled_graphs"] == 2  # one forward, one backward
    if mode == "defer":
        per_step = [stats[i]["flushes"] - stats[i - 1]["flushes"] for i in range(1, STEPS)]
        misses = [stats[i]["cache_misses"] - stats[i - 1]["cache_misses"]
                  for i in range(2, STEPS)]
        assert per_step == [1] * (STEPS - 1)
        assert misses == [0] * (STEPS - 2)


@pytest.mark.parametrize("family", _params(slow=False))
def test_compiled_family_matches_cpu(family, mode):
    _check(family, mode)


@pytest.mark.parametrize("family", _params(slow=True))
def test_compiled_family_matches_cpu_all(family, mode):
    _check(family, mode)

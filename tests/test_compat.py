"""``lazyrt._base.compat``: what the running torch has, what lazyrt left out without it, and
the errors a feature of a newer torch raises (docs/versions.md)."""
from __future__ import annotations

import pytest
import torch

import lazyrt
from lazyrt._base import compat
from lazyrt.lowering._registry import LOWERINGS, lower


def test_every_feature_answers_and_missing_ones_are_listed():
    skipped = lazyrt.coverage()["skipped"]
    for name in compat.FEATURES:
        assert isinstance(compat.has(name), bool)
        assert (f"feature {name}" in skipped) == (not compat.has(name))
    for what, why in compat.SKIPPED.items():
        assert skipped[what] == why


def test_a_missing_op_skips_its_lowering_and_is_listed():
    ghost = compat.aten.no_such_op_in_any_torch
    assert isinstance(ghost.default, compat.MissingOp) and compat.op("aten.no_such_op_in_any_torch") is None

    @lower(ghost.default, ghost)
    def f(x):
        return x

    assert "aten.no_such_op_in_any_torch.default" in lazyrt.coverage()["skipped"]
    assert not any("no_such_op" in str(k) for k in LOWERINGS)
    with pytest.raises(NotImplementedError, match=f"not an op of torch {compat.TORCH}"):
        ghost.default(torch.ones(1))
    c = lazyrt.coverage("aten.no_such_op_in_any_torch.default")
    assert c.status == "missing" and compat.TORCH in c.by


def test_present_ops_are_the_real_ones():
    assert compat.aten.add.Tensor is torch.ops.aten.add.Tensor
    assert compat.op("aten::add.Tensor") is torch.ops.aten.add.Tensor
    assert compat.api("torch.UntypedStorage.data_ptr") is torch.UntypedStorage.data_ptr
    assert compat.api("torch.UntypedStorage.no_such_method") is None


def test_require_names_the_feature_and_the_torch():
    for name, f in compat.FEATURES.items():
        if compat.has(name):
            compat.require(name)
            continue
        with pytest.raises(compat.FeatureUnavailable, match=f"torch >= {f.since}") as e:
            compat.require(name, "doing it")
        assert compat.TORCH in str(e.value) and isinstance(e.value, NotImplementedError)

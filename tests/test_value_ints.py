"""Python ints that are an operand's value (``x * k``, ``x.fill_(k)``, ``x < k``) are
runtime ints of the op's program (``lazyrt._ops.value_ints``): one program for every ``k``,
and the values PyTorch's CPU gives, wrap-arounds included."""
from __future__ import annotations

import pytest
import torch
from _util import assert_close

from lazyrt import metrics

# these tests count compiles per shape and per value: each program compiled at its first run
pytestmark = pytest.mark.usefixtures("compile_at_first_run")

DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.bool, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]
INTS = [0, 3, -7, 300, 2**31 + 5, 2**40]


def _mask(x):
    return x > 1


OPS = {
    "add": lambda x, k: x + k, "rsub": lambda x, k: k - x, "mul": lambda x, k: x * k,
    "div": lambda x, k: x / (k or 1), "floordiv": lambda x, k: x // (k or 1),
    "rem": lambda x, k: x % (k or 1), "add_alpha": lambda x, k: torch.add(x, x, alpha=k),
    "fill_": lambda x, k: x.clone().fill_(k), "masked_fill": lambda x, k: x.masked_fill(_mask(x), k),
    "clamp": lambda x, k: torch.clamp(x, min=k), "eq": lambda x, k: x == k, "lt": lambda x, k: x < k,
    "ge": lambda x, k: x >= k, "where": lambda x, k: torch.where(_mask(x), x, k),
    "and": lambda x, k: x & k, "imul": lambda x, k: x.clone().mul_(k),
}


def _outcome(f, x, k):
    try:
        return f(x, k)
    except Exception as e:
        return e


@pytest.mark.parametrize("name", sorted(OPS))
def test_value_ints_equal_cpu(mode, name):
    f = OPS[name]
    for dt in DTYPES:
        g = torch.Generator().manual_seed(1)
        c = (torch.randn(6, generator=g) * 20).to(dt)
        for k in INTS:
            want = _outcome(f, c, k)
            if name == "where" and not dt.is_floating_point and dt != torch.bool \
                    and not torch.iinfo(dt).min <= k <= torch.iinfo(dt).max:
                continue  # (a scalar out of the dtype's range: left, see the closing note)
            if isinstance(want, Exception):
                continue  # (errors: the op's own checks, unchanged by this)
            got = f(c.to("tpu"), k)
            tol = 1e-2 if dt in (torch.float16, torch.bfloat16) else 1e-6
            assert_close(got, want, rtol=tol if want.is_floating_point() else 0, atol=0,
                         path=f"{name} {dt} {k}")


def test_one_program_for_every_value(mode):
    x = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    t = x.to("tpu")
    for k in (2, 5):
        (t * k + k).masked_fill(t > k, k).cpu()  # (the programs of this shape)
    metrics.reset()
    for k in (7, 11, -3, 300):
        got = (t * k + k).masked_fill(t > k, k)
        assert_close(got, (x * k + k).masked_fill(x > k, k))
    assert metrics.counters()["cache_misses"] == 0


def test_pow_keeps_its_int_exponent_static(mode):
    """``x ** 2`` is an exact product on the CPU; a runtime exponent would not be."""
    x = torch.randn(64, dtype=torch.float32)
    for k in (2, 3):
        assert_close(x.to("tpu") ** k, x ** k, rtol=0, atol=0)

"""Positions are runtime values (issue 39): an integer that only picks where an op reads or
writes (``x[i]``, ``x[i] = v``, ``x[i:i + k]``, ``narrow``, ``unbind``, ``roll``) reaches the
program as a runtime scalar, so a loop over positions compiles one program per shape, never
one per position; bounds are still checked at the op, with PyTorch's errors."""
from __future__ import annotations

import pytest
import torch
from _util import assert_close

import lazyrt
from lazyrt._base.metrics import COUNTERS

# these tests count compiles per shape and per value: each program compiled at its first run
pytestmark = pytest.mark.usefixtures("compile_at_first_run")

MODES = ["strict", "defer"]


@pytest.fixture(params=MODES)
def mode(request):
    with lazyrt.set_mode(request.param):
        yield request.param


def _compiles():
    return COUNTERS["cache_misses"]


def _loop(mode, n, body, *tensors):
    """Run ``body(i, *tensors)`` for i < n (a sync per step in defer); the programs compiled."""
    lazyrt.sync()
    c0 = _compiles()
    for i in range(n):
        body(i, *tensors)
        if mode == "defer":
            lazyrt.sync()
    return _compiles() - c0


def _row_copy(i, x, s):
    x[i, :, :] = s[i, :, :]


def test_row_copy_loop_compiles_at_most_two_programs(mode):
    """The issue's loop: 80 compiles in strict and 40 in defer before; now 2 and 1."""
    torch.manual_seed(0)
    s_cpu = torch.randn(64, 8, 8)
    x = torch.zeros(64, 8, 8).to("tpu")
    s = s_cpu.to("tpu")
    n = _loop(mode, 40, _row_copy, x, s)
    assert n <= 2
    x_cpu = torch.zeros(64, 8, 8)
    for i in range(40):
        x_cpu[i, :, :] = s_cpu[i, :, :]
    assert_close(x, x_cpu)
    # whatever the loop length: more steps compile nothing more
    assert _loop(mode, 64, _row_copy, x, s) == 0


# op form -> f(x, i) on a (12, 6) float tensor; each step's result is compared with CPU
FORMS = {
    "select_read": lambda x, i: x[i] * 2,
    "select_dim1": lambda x, i: x[:, i % 6] + 1,
    "select_negative": lambda x, i: x[-i - 1] * 3,
    "select_op": lambda x, i: torch.select(x, 0, i).sum(),
    "select_write": lambda x, i: x.__setitem__(i, x[i] + 1.0),
    "select_fill": lambda x, i: x[i].fill_(float(i)),
    "element_write": lambda x, i: x.__setitem__((i, i % 6), -1.0),
    "select_of_select": lambda x, i: x[i][i % 6] * 2,
    "view_of_select": lambda x, i: x[i].view(2, 3).t() * 1,
    "write_view_of_select": lambda x, i: x[i].view(2, 3)[1].mul_(2),
    "slice_read": lambda x, i: x[i + 1:i + 3] * 2,
    "slice_step": lambda x, i: x[i + 1:i + 7:3] - 1,
    "slice_write": lambda x, i: x[i + 1:i + 3].copy_(torch.ones(2, 6, device=x.device)),
    "slice_step_write": lambda x, i: x[i + 1:i + 7:2].add_(1.0),
    "slice_dim1": lambda x, i: x[:, 1 + i % 4:3 + i % 4].clone(),
    "narrow": lambda x, i: x.narrow(0, i, 3) * 1,
    "narrow_write": lambda x, i: x.narrow(1, i % 4, 2).zero_(),
    "unbind": lambda x, i: list(x)[i] + 1,
    "unbind_dim1": lambda x, i: torch.unbind(x, 1)[i % 6] * 2,
    "roll": lambda x, i: torch.roll(x, i, 0),
    "roll_negative_2d": lambda x, i: torch.roll(x, (-i, 2 * i), (0, 1)),
    "roll_flat": lambda x, i: torch.roll(x, i + 5),
    "index_put_int": lambda x, i: x.index_put_((torch.tensor(i),), torch.full((6,), 7.0)),
    "index_copy_int": lambda x, i: x.index_copy_(0, torch.tensor([i]), torch.ones(1, 6)),
}


def _to(a, dev):
    return a.to(dev) if isinstance(a, torch.Tensor) and a.device.type == "cpu" and dev == "tpu" \
        else a


@pytest.mark.parametrize("form", sorted(FORMS))
def test_position_forms_equal_cpu_and_compile_once_per_shape(mode, form):
    f = FORMS[form]
    if form in ("index_put_int", "index_copy_int"):
        # the index tensor and values on the tensor's device
        def f(x, i, _f=FORMS[form]):
            if x.device.type == "tpu":
                if form == "index_put_int":
                    return x.index_put_((torch.tensor(i, device="tpu"),),
                                        torch.full((6,), 7.0, device="tpu"))
                return x.index_copy_(0, torch.tensor([i], device="tpu"),
                                     torch.ones(1, 6, device="tpu"))
            return _f(x, i)
    torch.manual_seed(1)
    base = torch.randn(12, 6)
    x_cpu = base.clone()
    x = base.to("tpu")

    def step(i, x):
        out = f(x, i)
        ref = f(x_cpu, i)
        if isinstance(ref, torch.Tensor) and ref is not x_cpu:
            assert_close(out, ref)

    # two warm-up positions (a start of 0 is a static slice), then more steps compile nothing
    _loop(mode, 2, step, x)
    lazyrt.sync()
    c0 = _compiles()
    for i in range(2, 6):
        step(i, x)
        if mode == "defer":
            lazyrt.sync()
    assert _compiles() - c0 == 0, form
    assert_close(x, x_cpu)


@pytest.mark.parametrize("index", [12, -13, 100])
def test_select_out_of_range_raises_index_error_at_the_op(mode, index):
    x = torch.zeros(12, 6).to("tpu")
    x[3]  # a plan exists for this shape: the bad index must still be checked
    with pytest.raises(IndexError) as tpu_err:
        x.select(0, index)
    with pytest.raises(IndexError) as cpu_err:
        torch.zeros(12, 6).select(0, index)
    assert str(tpu_err.value) == str(cpu_err.value)
    with pytest.raises(IndexError, match="out of bounds"):
        x[index] = 1.0
    with pytest.raises(IndexError):
        torch.unbind(x, 0)[index]


def test_narrow_out_of_range_raises_at_the_op(mode):
    x = torch.zeros(12, 6).to("tpu")
    x.narrow(0, 4, 3)
    with pytest.raises(RuntimeError, match=r"start \(11\) \+ length \(3\) exceeds"):
        x.narrow(0, 11, 3)


def test_view_offsets_follow_positions(mode):
    """Storage offsets and strides as on the CPU, for views of views at positions."""
    x_cpu = torch.arange(60.0).reshape(5, 4, 3)
    x = x_cpu.to("tpu")
    for i in range(1, 4):
        for t, c in [(x[i], x_cpu[i]), (x[i][2], x_cpu[i][2]), (x[i, 1:3], x_cpu[i, 1:3]),
                     (x[i].t(), x_cpu[i].t()), (x[:, i], x_cpu[:, i]),
                     (x[i:i + 2].transpose(0, 2), x_cpu[i:i + 2].transpose(0, 2))]:
            assert (t.shape, t.stride(), t.storage_offset()) == \
                (c.shape, c.stride(), c.storage_offset())
            assert_close(t, c)


def test_metrics_count_programs_per_op(mode, compile_at_first_run):
    """Programs compiled per op family: one per position-free signature; an int operand of
    ``mul`` is a runtime value of the program too (``value_ints``): one program for all."""
    lazyrt.metrics.reset()
    x = torch.zeros(16, 4).to("tpu")
    v = torch.ones(4).to("tpu")
    lazyrt.sync()
    for i in range(8):
        x[i] = v * i
        lazyrt.sync()
    by_op = lazyrt.metrics.counters()["compiles_by_op"]
    assert sum(by_op.values()) == COUNTERS["cache_misses"]
    if mode == "strict":
        assert by_op == {"mul": 1, "copy_": 1, "write_through_view": 1}
    else:
        assert by_op == {"flush": 1}
    assert "programs compiled by op:" in lazyrt.metrics.report()


def test_explain_recompile_names_a_new_position(capsys):
    """A compile caused by an int value (not a shape): said so. Positions no longer cause
    one, nor an int operand of ``mul``; an int exponent of ``pow`` (static: an exact
    product, as on the CPU) still does."""
    prev = lazyrt.config.explain_recompile
    lazyrt.config.explain_recompile = True
    try:
        with lazyrt.set_mode("defer"):
            x = torch.ones(8, 4).to("tpu")
            (x[0] + 1).cpu()
            capsys.readouterr()
            for i in range(1, 4):
                (x[i] + 1).cpu()  # a position: no recompile, nothing to explain
            assert "recompiling" not in capsys.readouterr().err
            (x.sum(0) * 2).cpu()
            capsys.readouterr()
            (x.sum(0) * 3).cpu()
            assert "recompiling" not in capsys.readouterr().err
            for k in (2, 3):
                (x.sum(0) ** k).cpu()
            err = capsys.readouterr().err
    finally:
        lazyrt.config.explain_recompile = prev
    assert "recompiling" in err and "the same op at a new position" in err


@pytest.mark.parametrize("form", ["select", "roll"])
def test_compiled_graph_takes_positions_as_runtime_ints(mode, form):
    """In a torch.compile graph the position (a symbolic int once Dynamo sees it change)
    is a runtime input: one graph program for every later position."""
    def f(x, i):
        return x[i] * 2 if form == "select" else torch.roll(x, i, 0) + 1

    torch._dynamo.reset()
    cf = torch.compile(f)
    x = torch.randn(8, 4)
    xt = x.to("tpu")
    for i in (1, 2):  # Dynamo: the first value static, the second makes it symbolic
        assert_close(cf(xt, i), f(x, i))
    c0 = _compiles()
    for i in range(3, 8):
        assert_close(cf(xt, i), f(x, i))
    assert _compiles() == c0


# ---- warm keys: an executable found by lazyrt's own signature, without tracing -------------


def _sig(op, *args, **kwargs):
    from lazyrt._ops.plan import plan_for
    from lazyrt._ops.resolve import resolve

    return plan_for(resolve(op), args, kwargs)[0].prog.sig


def test_a_plans_signature_changes_with_each_component():
    aten = torch.ops.aten
    a = torch.ones(4, 3).to("tpu")
    base = _sig(aten.add.Tensor, a, a, alpha=2)
    assert base is not None and base == _sig(aten.add.Tensor, a, a, alpha=2)
    others = {
        "op": _sig(aten.sub.Tensor, a, a, alpha=2),
        "static argument": _sig(aten.add.Tensor, a, a, alpha=True),
        "input shape": _sig(aten.add.Tensor, a, torch.ones(3).to("tpu"), alpha=2),
        "input dtype": _sig(aten.add.Tensor, a, a.double(), alpha=2),
        "runtime float": _sig(aten.add.Tensor, a, a, alpha=2.0),
    }
    assert len({base, *others.values()}) == len(others) + 1, others
    # a static int is part of it, a value int (``value_ints``) and a position are not
    assert _sig(aten.pow.Tensor_Scalar, a, 2) != _sig(aten.pow.Tensor_Scalar, a, 3)
    assert base == _sig(aten.add.Tensor, a, a, alpha=3)
    x = torch.zeros(8, 3).to("tpu")
    assert _sig(aten.mul.Tensor, x[1], a[0]) == _sig(aten.mul.Tensor, x[5], a[2])


def test_a_replaced_function_is_never_found_under_the_lowerings_signature(tmp_path,
                                                                            monkeypatch):
    """An entry whose function is replaced (``invalidate_compiled``'s ``change``) runs that
    function: its programs are not stored or found under the lowering's signature (GELU
    lowered as ReLU in one test was later loaded by every GELU plan of the process:
    silently wrong values), and once the lowering is back GELU is GELU again."""
    import jax

    from lazyrt._ops import control as _control
    from lazyrt._ops import resolve as _resolve

    monkeypatch.setattr(lazyrt.config, "cache_dir", str(tmp_path))
    op = torch.ops.aten.gelu.default
    entry = _resolve.resolve(op)
    fn = entry.fn
    x = torch.linspace(-3, 3, 13)
    t = x.to("tpu")
    base = _sig(op, t)

    def swap(new):
        _control.invalidate_compiled([op], change=lambda: setattr(entry, "fn", new))

    swap(lambda self, approximate="none": jax.nn.relu(self))
    try:
        assert _sig(op, t) != base
        torch.testing.assert_close(torch.nn.functional.gelu(t).cpu(), torch.relu(x))
    finally:
        swap(fn)
    from lazyrt._exec import tiers

    tiers.drain()
    _control.invalidate_compiled([op])  # the next plan compiles or loads from disk
    assert _sig(op, t) == base
    torch.testing.assert_close(torch.nn.functional.gelu(t).cpu(), torch.nn.functional.gelu(x))


def test_a_signature_key_changes_with_each_component(monkeypatch, tmp_path):
    import jax
    import jax.numpy as jnp

    from lazyrt._exec import diskcache

    args = (jnp.ones((4, 3), jnp.float32), 2)
    base = diskcache.signature_key("S", args, (), {})
    assert base == diskcache.signature_key("S", args, (), {})
    keys = {
        "signature": diskcache.signature_key("T", args, (), {}),
        "argument shape": diskcache.signature_key("S", (jnp.ones((4, 4)), 2), (), {}),
        "argument dtype": diskcache.signature_key("S", (jnp.ones((4, 3), jnp.bfloat16), 2), (),
                                                  {}),
        "argument count": diskcache.signature_key("S", args + (1.0,), (), {}),
        "donation": diskcache.signature_key("S", args, (0,), {}),
        "compile options": diskcache.signature_key("S", args, (), {"xla_cpu_prefer_vector_width":
                                                                   256}),
    }
    monkeypatch.setattr(lazyrt.config, "pallas", "off" if lazyrt.config.pallas != "off" else "on")
    keys["lazyrt switch"] = diskcache.signature_key("S", args, (), {})
    monkeypatch.undo()
    prec = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium" if prec != "medium" else "high")
        keys["matmul precision"] = diskcache.signature_key("S", args, (), {})
    finally:
        torch.set_float32_matmul_precision(prec)
    monkeypatch.setattr(diskcache, "source_key", lambda: "another lazyrt")
    keys["lazyrt source"] = diskcache.signature_key("S", args, (), {})
    monkeypatch.undo()
    assert diskcache.signature_key("S", args, (), {}) == base
    assert len({base, *keys.values()}) == len(keys) + 1, keys
    assert jax.devices()  # one device here: keys are made


def test_an_executable_under_the_wrong_key_never_runs(tmp_path, monkeypatch):
    """An entry whose executable takes other arguments than the program's (a forged or
    colliding key) is refused and the program compiled: the result is the program's."""
    import jax.numpy as jnp

    from lazyrt._exec import diskcache
    from lazyrt._exec import xla as _xla

    monkeypatch.setattr(lazyrt.config, "cache_dir", str(tmp_path))

    def double(x):
        return (x * 2,)

    def plus_one(x):
        return (x + 1,)

    small, big = jnp.ones((4,), jnp.float32), jnp.ones((8,), jnp.float32)
    exe_small = _xla.compile_program(double, (small,))[0]
    name = _xla.signed_name("plus_one", (big,), ())
    assert diskcache.put(name, diskcache.serialize_signed(exe_small))
    before = COUNTERS["disk_cache_mismatches"]
    assert diskcache.load_signed(name, (big,), ()) is None  # another shape: refused
    assert COUNTERS["disk_cache_mismatches"] == before + 1
    exe = _xla.compile_program(plus_one, (big,), sig="plus_one")[0]
    assert (exe(big)[0] == 2).all()
    # the same arguments but another program under the key: what the key names is what runs
    # (every component of the program is in it); a right entry is found without tracing
    name2 = _xla.signed_name("double8", (big,), ())
    diskcache.put(name2, diskcache.serialize_signed(_xla.compile_program(double, (big,))[0]))
    hits = COUNTERS["disk_cache_signed_hits"]
    exe2 = _xla.compile_program(lambda x: (_ for _ in ()).throw(AssertionError("traced")),
                                (big,), sig="double8")[0]
    assert COUNTERS["disk_cache_signed_hits"] == hits + 1
    assert (exe2(big)[0] == 2).all()


@pytest.mark.subprocess
def test_a_warm_process_finds_every_program_by_signature(tmp_path):
    import os
    import subprocess
    import sys

    code = ("import torch, lazyrt, sys\n"
            "lazyrt.set_mode(sys.argv[1]); torch.manual_seed(0)\n"
            "x = torch.zeros(16, 4).to('tpu'); s = torch.randn(16, 4).to('tpu')\n"
            "for i in range(4):\n"
            "    x[i] = s[i] * 2 + x[i + 1]\n"
            "    lazyrt.sync()\n"
            "c = lazyrt.metrics.counters()\n"
            "print(x.sum().item(), c['cache_misses'], c['disk_cache_signed_hits'],\n"
            "      c['disk_cache_plan_hits'])\n")
    env = dict(os.environ, JAX_PLATFORMS="cpu", LAZYRT_CACHE_DIR=str(tmp_path))
    for mode in ("strict", "defer"):
        runs = [subprocess.run([sys.executable, "-c", code, mode], capture_output=True,
                               text=True, timeout=300, env=env) for _ in range(2)]
        for r in runs:
            assert r.returncode == 0, r.stderr[-2000:]
        (v0, n0, h0, _), (v1, n1, h1, p1) = [r.stdout.split() for r in runs]
        assert v0 == v1 and n0 == n1 and h0 == "0"
        assert int(h1) == int(n1) > 0, (mode, runs[1].stdout)
        assert int(p1) > 0, (mode, runs[1].stdout)  # its plans are not traced again


def test_a_signature_entry_written_from_a_loaded_program_runs(tmp_path, monkeypatch):
    """A program found under its text key and stored under its signature: the signature
    entry holds the bytes read, never the loaded executable written again (XLA:CPU writes
    that without its kernels: "Function wrapped_add not found" in the next process)."""
    import jax.numpy as jnp

    from lazyrt._exec import diskcache, tiers
    from lazyrt._exec import xla as _xla

    monkeypatch.setattr(lazyrt.config, "cache_dir", str(tmp_path))

    def add(a, b):
        return (a + b,)

    args = (jnp.ones((1, 4), jnp.float32), jnp.full((1, 4), 2.0, jnp.float32))
    _xla.compile_program(add, args)  # stored under its text key only
    assert tiers.drain(60)
    hits = COUNTERS["disk_cache_hits"]
    exe = _xla.compile_program(add, args, sig="add14")[0]  # a text hit, stored signed
    assert COUNTERS["disk_cache_hits"] == hits + 1
    assert diskcache.serialize(exe) is None  # a loaded executable is never written again
    assert tiers.drain(60)
    loaded = diskcache.load_signed(_xla.signed_name("add14", args, ()), args, ())
    assert loaded is not None
    assert (loaded(*args)[0] == 3).all()


def test_a_plans_verdict_is_kept_under_its_signature_source_and_switches(tmp_path, monkeypatch):
    """A plan checked once is not traced again by a process with the same lazyrt; another
    signature, source or switch is unknown (traced and checked as before)."""
    from lazyrt._exec import diskcache

    monkeypatch.setattr(lazyrt.config, "cache_dir", str(tmp_path))
    assert diskcache.plan_checked("P") is None
    diskcache.note_plan("P", False)
    diskcache.note_plan("C", True)
    assert diskcache.plan_checked("P") is False and diskcache.plan_checked("C") is True
    assert diskcache.plan_checked("Q") is None
    monkeypatch.setattr(diskcache, "source_key", lambda: "another lazyrt")
    assert diskcache.plan_checked("P") is None
    monkeypatch.undo()
    monkeypatch.setattr(lazyrt.config, "cache_dir", str(tmp_path))
    monkeypatch.setattr(lazyrt.config, "pallas", "off" if lazyrt.config.pallas != "off" else "on")
    assert diskcache.plan_checked("P") is None
    monkeypatch.setattr(lazyrt.config, "cache_dir", "off")
    assert diskcache.plan_checked("P") is None


def test_a_checked_programs_signature_changes_with_each_component():
    import types

    from lazyrt._ops.bounds import _checked_sig

    def step(sig, i=0, pos=None):
        plan = types.SimpleNamespace(prog=types.SimpleNamespace(sig=sig))
        return (plan, i) if pos is None else (plan, i, pos)

    base = _checked_sig("B", ((0, (step("v", 0, (1,)),), 5, False, None),))
    assert base == _checked_sig("B", ((0, (step("v", 0, (1,)),), 5, False, None),))
    others = {
        "plan": _checked_sig("C", ((0, (step("v", 0, (1,)),), 5, False, None),)),
        "position": _checked_sig("B", ((1, (step("v", 0, (1,)),), 5, False, None),)),
        "view step": _checked_sig("B", ((0, (step("w", 0, (1,)),), 5, False, None),)),
        "view output": _checked_sig("B", ((0, (step("v", 1, (1,)),), 5, False, None),)),
        "view position": _checked_sig("B", ((0, (step("v", 0, (2,)),), 5, False, None),)),
        "no view": _checked_sig("B", ((0, None, 5, False, None),)),
        "bound": _checked_sig("B", ((0, (step("v", 0, (1,)),), 6, False, None),)),
        "negatives": _checked_sig("B", ((0, (step("v", 0, (1,)),), 5, True, None),)),
        "ignored": _checked_sig("B", ((0, (step("v", 0, (1,)),), 5, False, -100),)),
        "checks": _checked_sig("B", ((0, (step("v", 0, (1,)),), 5, False, None),) * 2),
    }
    assert len({base, *others.values()}) == len(others) + 1, others
    assert _checked_sig(None, ((0, None, 5, False, None),)) is None
    assert _checked_sig("B", ((0, (step(None),), 5, False, None),)) is None

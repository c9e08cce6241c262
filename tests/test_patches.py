"""Each of lazyrt's patches of torch and client libraries does what it is there for, and
``LAZYRT_DISABLE_PATCH=name[,name]`` turns one off (docs/architecture.md, "Patches").

One test per patch here, asserting the behaviour it gives (against PyTorch CPU where there
is a value to compare); patches whose behaviour needs ranks or a client library's whole
run are asserted by the tests named in ``ELSEWHERE``.
"""
import io
import os
import pickle
import subprocess
import sys
import warnings

import pytest
import torch
from _util import needs

import lazyrt
from lazyrt._base.metrics import COUNTERS
from lazyrt._exec import defer as _defer
from lazyrt._torch import clients as _clients
from lazyrt._torch import patches as _patches
from lazyrt._torch import serialization as _serialization

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# patch -> the test (file::name) that asserts its behaviour
ELSEWHERE = {
    "dlpack_tpu": "test_creation_fixes.py::test_dlpack_capsule_of_a_tpu_tensor",
    "recompile_limit_hook": "test_compile_edges.py::test_recompile_limit_on_tpu_warns_with_its_cause",
    # fused FSDP2: one flush per step needs the rank-dependent shards flushed at fully_shard
    "fsdp_init": "test_distributed.py::test_ddp_fsdp2_dtensor_match_single_process",
    # DTensor in fused mode: Replicate -> Shard(1) gives each rank its chunk
    "dtensor_local_chunks": "test_distributed.py::test_ddp_fsdp2_dtensor_match_single_process",
    "cb_memory": "test_clients.py::test_generate_batch_sizes_its_cache_from_the_tpu_budget",
    "cb_host_inputs": "test_clients.py::test_generate_batch_equals_cpu_and_compiles_per_size_not_per_step",
    "cb_padding": "test_clients.py::test_generate_batch_equals_cpu_and_compiles_per_size_not_per_step",
    "cb_paged_attention": "test_paged_serving.py::test_generate_batch_decodes_with_paged_attention",
    "profiler_ranges": "test_profiler.py::test_ranges_in_key_averages",
}


def _all_names():
    return set(_patches.NAMES) | set(_clients.NAMES) | {_serialization.PATCH}


def test_every_patch_has_a_behaviour_test():
    """Every patch name has a test here (``test_<name>``) or one named in ``ELSEWHERE``."""
    here = {n[len("test_"):] for n in globals() if n.startswith("test_")}
    missing = sorted(n for n in _all_names() if n not in here and n not in ELSEWHERE)
    assert missing == []
    for test in ELSEWHERE.values():
        path, name = test.split("::")
        with open(os.path.join(ROOT, "tests", path)) as f:
            assert f"def {name}(" in f.read(), test


def test_linalg_checks_in_compiled_graphs():
    """``torch.compile`` keeps ``_linalg_check_errors`` (an ordered effect, on every torch
    of the range): a singular solve raises PyTorch's eager error, as on the CPU."""
    from torch._higher_order_ops import effects

    assert effects._get_effect("aten::_linalg_check_errors") is not None
    f = torch.compile(lambda a, b: torch.linalg.solve(a, b))
    with pytest.raises(RuntimeError, match="singular") as e:
        f(torch.zeros(3, 3, device="tpu"), torch.ones(3, 1, device="tpu")).cpu()
    with pytest.raises(RuntimeError) as eager:
        torch.linalg.solve(torch.zeros(3, 3), torch.ones(3, 1))
    assert str(e.value) == str(eager.value)


def test_backward_error_hold():
    """An op that raises inside ``backward()`` is PyTorch's error, raised by
    ``backward()`` (torch 2.13 aborts the process without the patch)."""
    class Fails(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, g):
            torch.ones(2, device="tpu") @ torch.ones(3, device="tpu")
            return g

    x = torch.ones(2, device="tpu", requires_grad=True)
    # PyTorch's error (its meta kernel's wording: CPU's says "the same", it "thesame")
    with pytest.raises(RuntimeError, match=r"inconsistent tensor size, expected tensor \[2\] "
                                           r"and src \[3\]"):
        Fails.apply(x).sum().backward()
    y = torch.ones(2, device="tpu", requires_grad=True)
    (y * 3).sum().backward()  # autograd goes on working
    assert y.grad.cpu().tolist() == [3.0, 3.0]


def test_fast_dispatch_rule_lookup():
    """No torch_dispatch rule is looked up for TpuTensor (lazyrt registers none), even if
    one is registered; other classes' rules are still found."""
    import torch._library.simple_registry as sr

    lib = torch.library.Library("lazyrt_patch_test", "FRAGMENT")
    lib.define("f(Tensor x) -> Tensor")
    op = torch.ops.lazyrt_patch_test.f.default

    class Other(torch.Tensor):
        pass

    def rule(mode, func, types, args, kwargs):
        return args[0]

    torch.library.register_torch_dispatch(op, Other, rule, lib=lib)
    torch.library.register_torch_dispatch(op, lazyrt.TpuTensor, rule, lib=lib)
    assert sr.find_torch_dispatch_rule(op, Other) is rule
    assert sr.find_torch_dispatch_rule(op, lazyrt.TpuTensor) is None
    lib._destroy()


def test_matmul_precision():
    """``torch.set_float32_matmul_precision`` flushes work recorded under the old
    precision first."""
    prev = torch.get_float32_matmul_precision()
    with lazyrt.set_mode("defer"):
        y = torch.ones(4, 4, device="tpu") @ torch.ones(4, 4, device="tpu")
        assert _defer.pending_count() > 0
        torch.set_float32_matmul_precision("high" if prev != "high" else "highest")
        assert _defer.pending_count() == 0
        torch.set_float32_matmul_precision(prev)
    assert torch.get_float32_matmul_precision() == prev
    assert torch.equal(y.cpu(), torch.full((4, 4), 4.0))


def test_keep_parameter_objects():
    """``model.to("tpu")`` keeps each Parameter object (as CUDA does), tied ones tied."""
    m = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False))
    m[1].weight = m[0].weight
    w = m[0].weight
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m.to("tpu")
    assert m[0].weight is w and m[1].weight is w and w.device.type == "tpu"
    assert opt.param_groups[0]["params"][0] is w


def test_foreach_for_tpu_parameters():
    """torch.optim picks its foreach path for tpu parameters, as for CUDA ones."""
    from torch.optim.optimizer import _default_to_fused_or_foreach

    p = torch.nn.Parameter(torch.ones(3, device="tpu"))
    assert _default_to_fused_or_foreach([p], differentiable=False, use_fused=False) == (False, True)


def test_tpu_generators():
    """``torch.Generator(device="tpu")`` is a tpu generator whose seed decides the draws."""
    g = torch.Generator(device="tpu")
    assert g.device == torch.device("tpu", 0) and isinstance(g, torch.Generator)
    a = torch.randn(4, device="tpu", generator=g.manual_seed(3)).cpu()
    torch.manual_seed(1)
    b = torch.randn(4, device="tpu", generator=g.manual_seed(3)).cpu()
    assert torch.equal(a, b)
    assert torch.Generator().device.type == "cpu"


def test_accelerator_api():
    """``torch.accelerator``'s calls answer for tpu (torch 2.13 raises without the patch)."""
    torch.accelerator.synchronize()
    before = torch.accelerator.memory_allocated()
    x = torch.ones(1000, device="tpu") * 2
    torch.accelerator.synchronize()
    assert torch.accelerator.memory_allocated() >= before + 4000
    assert torch.accelerator.get_memory_info() == torch.tpu.mem_get_info()
    del x


def test_flex_attention_devices():
    """FlexAttention accepts tpu tensors (torch 2.13's device check refuses them)."""
    from torch.nn.attention.flex_attention import _validate_device

    q = torch.ones(1, 1, 4, 8, device="tpu")
    _validate_device(q, q, q)
    with pytest.raises(ValueError, match="FlexAttention"):
        _validate_device(q.to("meta"), q.to("meta"), q.to("meta"))


def test_load_to_tpu():
    """``torch.load(map_location="tpu")`` gives tpu tensors holding the saved values."""
    b = io.BytesIO()
    cpu = {"w": torch.arange(6.0).reshape(2, 3), "p": torch.nn.Parameter(torch.ones(2))}
    torch.save(cpu, b)
    b.seek(0)
    out = torch.load(b, map_location="tpu")
    assert out["w"].device.type == "tpu" and torch.equal(out["w"].cpu(), cpu["w"])
    assert isinstance(out["p"], torch.nn.Parameter) and out["p"].device.type == "tpu"


def test_rebuild_tpu_tensors_sharing():
    """A saved tpu tensor and its view load onto one tpu storage: a write through the
    view shows in the base, as on the CPU."""
    base = torch.arange(6.0, device="tpu")
    b = io.BytesIO()
    torch.save([base, base[2:4]], b)
    b.seek(0)
    lb, lv = torch.load(b, map_location="tpu")
    lv.fill_(-1)
    assert lb.device.type == "tpu" and lb.cpu().tolist() == [0, 1, -1, -1, 4, 5]


def test_tpu_storage_guards():
    """Allocating a tpu storage directly is lazyrt's error (torch 2.13 segfaults)."""
    with pytest.raises(RuntimeError, match="lazyrt: a tpu storage holds no bytes"):
        torch.UntypedStorage(8, device="tpu")
    assert torch.UntypedStorage(8).device.type == "cpu"


class _Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 3, 3)

    def forward(self, x):
        return self.conv(x).relu().flatten(1).sum(1)


def test_jit_trace_untraced_dispatch():
    """``torch.jit.trace`` of a conv model on tpu traces, and its trace runs like CPU."""
    torch.manual_seed(0)
    m, x = _Conv().eval(), torch.randn(2, 2, 5, 5)
    tr = torch.jit.trace(m.to("tpu"), (x.to("tpu"),))
    torch.testing.assert_close(tr(x.to("tpu")).cpu(), m.cpu()(x))


@needs("storage_swap_data_ptr")
def test_jit_save_load():
    """``torch.jit.save`` of a tpu ScriptModule and ``torch.jit.load(map_location="tpu")``
    give a tpu module computing what the CPU one does."""
    torch.manual_seed(0)
    m, x = _Conv().eval(), torch.randn(2, 2, 5, 5)
    ref = m(x)
    sm = torch.jit.script(m.to("tpu"))
    b = io.BytesIO()
    torch.jit.save(sm, b)
    b.seek(0)
    loaded = torch.jit.load(b, map_location="tpu")
    assert next(loaded.parameters()).device.type == "tpu"
    torch.testing.assert_close(loaded(x.to("tpu")).cpu(), ref)


def test_tensor_pickling():
    """A tpu tensor pickles and unpickles with its values, dtype and device."""
    t = torch.arange(5, dtype=torch.int32, device="tpu")
    back = pickle.loads(pickle.dumps(t))
    assert back.device.type == "tpu" and back.dtype == torch.int32
    assert torch.equal(back.cpu(), torch.arange(5, dtype=torch.int32))


def test_fsdp_storage():
    """FSDP2's ``free_storage`` leaves a tpu tensor's value (it has no byte storage to
    resize); for a CPU tensor it frees the storage."""
    from lazyrt.distributed import _engine, _rt

    _rt.install_torch_patches(_engine)
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    t, c = torch.ones(4, device="tpu"), torch.ones(4)
    _fsdp_param.free_storage(t)
    _fsdp_param.free_storage(c)
    assert c.untyped_storage().size() == 0
    assert t.cpu().tolist() == [1.0] * 4
    _fsdp_param.alloc_storage(t)
    assert t.cpu().tolist() == [1.0] * 4


def _graphs():
    return COUNTERS["compiled_graphs"]


def test_compile_picks_tpu():
    """``torch.compile(backend="inductor")`` of tpu work compiles with lazyrt's backend:
    lazyrt counts the graph, and the result equals CPU eager."""
    before = _graphs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = torch.compile(lambda x: (x * 3).sum(0), backend="inductor")
        out = f(torch.ones(2, 3, device="tpu"))
    assert _graphs() == before + 1
    assert torch.equal(out.cpu(), torch.full((3,), 6.0))


def test_dynamo_wraps_tpu_tensors():
    """Dynamo traces tpu ops into one graph (``fullgraph=True`` raises on a graph break)."""
    f = torch.compile(lambda a, b: (a @ b).relu() + 1, fullgraph=True)
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    torch.testing.assert_close(f(a.to("tpu"), b.to("tpu")).cpu(), (a @ b).relu() + 1)


def test_static_tpu_shapes():
    """Each new tpu tensor shape compiles its own static graph (Dynamo would make the
    second shape dynamic and reuse that graph for the third)."""
    f = torch.compile(lambda x: x.cumsum(0) * 2)
    before = _graphs()
    for n in (3, 4, 5):
        assert f(torch.ones(n, device="tpu")).cpu().tolist() == [2.0 * i for i in range(1, n + 1)]
    assert _graphs() == before + 3


def test_dynamo_traces_rnn():
    """A compiled LSTM on tpu is one graph (``fullgraph=True``), equal to CPU's."""
    torch.manual_seed(0)
    lstm, x = torch.nn.LSTM(3, 4, batch_first=True), torch.randn(2, 5, 3)
    ref = lstm(x)[0]
    f = torch.compile(lstm.to("tpu"), fullgraph=True)
    torch.testing.assert_close(f(x.to("tpu"))[0].cpu(), ref, rtol=1e-4, atol=1e-5)


def test_trainer_rng(tmp_path):
    """transformers ``Trainer`` saves the tpu generator's state in a checkpoint's RNG file
    and restores it: tpu draws after a resume are those of the uninterrupted run."""
    transformers = pytest.importorskip("transformers")
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                          report_to=[])
    trainer = transformers.Trainer(model=torch.nn.Linear(2, 2), args=args)
    torch.tpu.manual_seed(7)
    trainer._save_rng_state(str(tmp_path))
    want = torch.rand(3, device="tpu").cpu()
    torch.rand(5, device="tpu")  # the stream moves on
    trainer._load_rng_state(str(tmp_path))
    assert torch.equal(torch.rand(3, device="tpu").cpu(), want)


_DISABLED_RUN = r"""
import io, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as rec:
    import torch, lazyrt
msgs = [str(w.message) for w in rec if "LAZYRT_DISABLE_PATCH" in str(w.message)]
from lazyrt._torch import patchset
assert sorted(patchset.skipped) == ["keep_parameter_objects", "tpu_generators"], patchset.skipped
assert any("no patch bogus" in m and "tpu_generators" in m for m in msgs), msgs
assert any("not applying keep_parameter_objects, tpu_generators" in m for m in msgs), msgs
# tpu_generators is off: torch.Generator is PyTorch's, which makes no tpu generator
assert torch.Generator is torch._C.Generator
try:
    torch.Generator(device="tpu")
    raise AssertionError("a tpu generator was made")
except RuntimeError:
    pass
# keep_parameter_objects is off: model.to("tpu") makes new Parameter objects
m = torch.nn.Linear(2, 3)
w = m.weight
m.to("tpu")
assert m.weight is not w and m.weight.device.type == "tpu" and w.device.type == "cpu"
# the rest works: ops, autograd, an optimizer step, other patches (load onto tpu)
x = torch.ones(4, 2, device="tpu", requires_grad=True)
cpu = torch.nn.Linear(2, 3)
cpu.load_state_dict({k: v.cpu() for k, v in m.state_dict().items()})
m(x).sum().backward()
cpu(torch.ones(4, 2)).sum().backward()
torch.testing.assert_close(m.weight.grad.cpu(), cpu.weight.grad)
b = io.BytesIO()
torch.save({"w": torch.arange(3.0)}, b)
b.seek(0)
assert torch.load(b, map_location="tpu")["w"].device.type == "tpu"
print("ok")
"""


@pytest.mark.subprocess
def test_disabled_patches_are_not_applied_and_the_rest_works():
    """``LAZYRT_DISABLE_PATCH=tpu_generators,keep_parameter_objects,bogus``: those two
    behaviours are PyTorch's own again, the unknown name is a warning listing the valid
    ones, and everything else works (one fresh interpreter)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               LAZYRT_DISABLE_PATCH=" tpu_generators,keep_parameter_objects, bogus",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", _DISABLED_RUN], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("ok")

"""The shape of the runtime: packages by stage, imports pointing one way (function-level
imports included), no import circle, observers importing nothing above them, modules small,
every torch monkeypatch in ``_torch.patches``."""
from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

import pytest
import torch

PKG = pathlib.Path(__file__).resolve().parent.parent / "lazyrt"
MAX_LINES = 500

# The stages, lowest first: a module imports only modules of its own stage or of stages
# below it. The top (``lazyrt/*.py``: the installer and the public surface) may import all.
STAGES = ["_base", "lowering", "_exec", "_ops", "_torch", "_compile", "distributed", "_memcli"]


def _modules():
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), p


def _imports(name: str, path: pathlib.Path, top_level_only: bool) -> set:
    """lazyrt modules that ``name`` imports: at module level, or anywhere (functions too)."""
    tree = ast.parse(path.read_text())
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in (tree.body if top_level_only else ast.walk(tree)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                if node.level > 1:
                    base = base[:-(node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("lazyrt"):
                continue
            if node.module is None or _is_package(mod):
                for a in node.names:
                    sub = f"{mod}.{a.name}"
                    out.add(sub if _exists(sub) else mod)
            else:
                out.add(mod)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("lazyrt"))
    out.discard(name)
    return out


def _exists(mod: str) -> bool:
    p = PKG.parent.joinpath(*mod.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def _is_package(mod: str) -> bool:
    return (PKG.parent.joinpath(*mod.split(".")) / "__init__.py").exists()


def _stage(mod: str) -> int:
    """Index of ``mod``'s stage in STAGES; the top (``lazyrt``, ``lazyrt.x``) is above all."""
    parts = mod.split(".")
    if len(parts) > 2 or (len(parts) == 2 and _is_package(mod)):
        return STAGES.index(parts[1])
    return len(STAGES)


GRAPH = {name: _imports(name, path, top_level_only=False) for name, path in _modules()}


def test_every_package_is_a_stage():
    pkgs = {p.name for p in PKG.iterdir() if (p / "__init__.py").exists()}
    assert pkgs == set(STAGES)


def test_imports_point_down():
    """No module imports a module of a stage above its own (function-level imports count)."""
    up = sorted(f"{m} -> {d}" for m, deps in GRAPH.items() for d in deps
                if _stage(d) > _stage(m))
    assert up == []


def test_imports_form_no_cycle():
    """No import circle anywhere, function-level imports included (a package's
    ``__init__`` importing its own submodules is not a dependency back)."""
    seen, stack, cycles = set(), [], []

    def visit(m):
        if m in stack:
            cycles.append(stack[stack.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        stack.append(m)
        for d in GRAPH.get(m, ()):
            if d != "lazyrt" and not (m.startswith(d + ".") and _is_package(d)):
                visit(d)
        stack.pop()

    for m in GRAPH:
        if m != "lazyrt":
            visit(m)
    assert cycles == []


def test_the_layering_test_sees_function_level_imports(tmp_path):
    """The checks above read imports inside functions too (a circle closed by a
    function-level import is still a circle)."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from lazyrt._compile import api\n")
    assert "lazyrt._compile.api" in _imports("lazyrt._torch.m", f, top_level_only=False)
    assert _stage("lazyrt._compile.api") > _stage("lazyrt._torch.patches")


@pytest.mark.parametrize("observer", ["lazyrt._base.memory", "lazyrt._base.metrics"])
def test_observers_import_nothing_above_them(observer):
    allowed = {"lazyrt._base.metrics", "lazyrt._base.source"}
    assert GRAPH[observer] <= allowed


def test_lowerings_import_only_ground_facts():
    """Lowerings are pure JAX over ground facts: they import nothing of the executors or
    the dispatcher (``_base`` and ``lowering`` only)."""
    bad = {m: deps for m, deps in GRAPH.items() if m.startswith("lazyrt.lowering")
           and any(_stage(d) > STAGES.index("lowering") for d in deps)}
    assert bad == {}


def test_modules_are_small():
    big = []
    for name, path in _modules():
        if name.startswith("lazyrt.lowering."):
            continue  # lowering families hold one function per op
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            big.append((name, n))
    assert big == []


def test_torch_is_patched_only_in_patches():
    """No module but ``patches`` (and its parts ``patches_io``, ``patches_dist``) assigns to an attribute of
    torch."""
    offenders = []
    for name, path in _modules():
        if name in ("lazyrt._torch.patches", "lazyrt._torch.patches_io",
                    "lazyrt._torch.patches_dist"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    root = t
                    while isinstance(root, ast.Attribute):
                        root = root.value
                    if (isinstance(t, ast.Attribute) and isinstance(root, ast.Name)
                            and root.id in ("torch", "sr", "optim_mod")):
                        offenders.append(f"{name}:{node.lineno}")
    assert offenders == []


def test_patched_torch_attributes_still_exist():
    """Each patch targets an attribute of torch 2.13; a torch upgrade that moves one fails
    here, by name, rather than silently unpatched."""
    import torch._library.simple_registry as sr
    import torch.autograd.graph
    import torch.optim.optimizer as optim_mod

    from lazyrt._torch import patches as _patches

    assert _patches._installed
    assert torch.autograd.graph._engine_run_backward.__name__ == "_engine_run_backward"
    assert sr.find_torch_dispatch_rule.__module__ == "lazyrt._torch.patches"
    assert torch.set_float32_matmul_precision.__module__ == "lazyrt._torch.patches"
    assert torch.nn.Module._apply.__module__ == "lazyrt._torch.patches"
    assert torch.accelerator.synchronize.__module__ == "lazyrt._torch.patches"
    assert torch.accelerator.memory.memory_allocated.__module__ == "lazyrt._torch.patches"
    assert torch.Generator is not torch._C.Generator
    assert torch.load is torch.serialization.load and hasattr(torch.load, "__wrapped__")
    assert lazyrt_tensor() in optim_mod._foreach_supported_types
    import torch.nn.attention.flex_attention as fa

    assert any(isinstance(c, frozenset) and {"cuda", "tpu"} <= c
               for c in fa._validate_device.__code__.co_consts)
    assert torch._utils._rebuild_device_tensor_from_cpu_tensor.__wrapped__
    assert torch.UntypedStorage.__new__.__module__ == "lazyrt._torch.patches_io"
    assert torch.UntypedStorage.new.__wrapped__ is torch._C.StorageBase.new
    # NOTE: Dynamo's first compile wraps torch.jit.trace once more (TorchPatcher: disabled
    # under Dynamo), around lazyrt's wrapper
    assert torch.jit._trace.trace.__wrapped__
    assert torch.jit.trace in (torch.jit._trace.trace,) or \
        torch.jit.trace.__wrapped__ is torch.jit._trace.trace
    assert torch.jit.trace_module.__wrapped__
    # the private calls the storage identity and the jit patch make
    assert callable(torch._C._construct_storage_from_data_pointer)
    from lazyrt._base import compat

    # (a torch without it gives storages another way: compat's storage_swap_data_ptr)
    assert not compat.has("storage_swap_data_ptr") or callable(torch.UntypedStorage._swap_data_ptr_)
    assert callable(torch._C._dispatch_tls_set_dispatch_key_excluded)
    assert torch._C._dispatch_key_name(torch._C._parse_dispatch_key("Tracer")) == "Tracer"


def test_distributed_patch_targets_still_exist():
    """What ``_patches.install_distributed`` wraps (FSDP2, DTensor) is still in torch."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group, _fsdp_state
    from torch.distributed.tensor import placement_types as pt

    assert callable(_fsdp_param.alloc_storage) and callable(_fsdp_param.free_storage)
    assert callable(_fsdp_param_group.alloc_storage)
    assert "__init__" in _fsdp_param_group.FSDPParamGroup.__dict__
    assert "_lazy_init" in _fsdp_state.FSDPState.__dict__
    assert "_select_split_tensor" in pt.Shard.__dict__


def lazyrt_tensor():
    import lazyrt

    return lazyrt.TpuTensor


@pytest.mark.subprocess
def test_any_module_can_be_imported_first():
    """Importing any lazyrt module first (in a fresh interpreter) leaves a working device."""
    # (``import lazyrt.x`` runs lazyrt/__init__ first anyway; the acyclic import graph
    # above is the real check. A few starts, each ~2 s.)
    names = ["lazyrt._exec.values", "lazyrt.lowering.pointwise", "lazyrt._compile.graph"]
    code = ("import importlib, sys, torch\n"
            "importlib.import_module(sys.argv[1])\n"
            "x = torch.ones(3, device='tpu')\n"
            "assert (x + 1).cpu().tolist() == [2.0, 2.0, 2.0]\n")
    for n in names:
        r = subprocess.run([sys.executable, "-c", code, n], capture_output=True, text=True,
                           timeout=120, env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin",
                                              "PYTHONPATH": str(PKG.parent),
                                              "LAZYRT_CACHE_DIR": os.environ["LAZYRT_CACHE_DIR"]})
        assert r.returncode == 0, (n, r.stderr[-2000:])


def test_tpu_module_api():
    assert torch.tpu.device_count() == 1
    assert torch.tpu.eager_mode in tuple(torch.tpu.EagerMode)


def test_perf_targets_table_is_the_one_in_perf_readme():
    """perf/README.md shows the targets of ``perf/targets.py`` (``python -m perf.targets``)."""
    root = PKG.parent
    sys.path.insert(0, str(root))
    try:
        from perf import targets
    finally:
        sys.path.remove(str(root))
    assert targets.table() in (root / "perf" / "README.md").read_text()

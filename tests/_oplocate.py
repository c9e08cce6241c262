"""Find the ATen op a tpu run gets wrong: rerun every ATen op of a forward + backward
on the CPU from the very same inputs (copied before the op runs, so in-place ops are
compared too) and report the ops whose results differ.

Each op is compared in isolation (same inputs on both sides), so a rounding difference
never propagates: an op listed here is wrong on its own. Used by the model suites to
name the culprit when a model's outputs or gradients do not match CPU eager.
"""
from __future__ import annotations

import re

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

import lazyrt

# Ops whose results are not a function of their inputs (or not comparable).
_SKIP = re.compile(r"empty|rand|bernoulli|dropout|normal|uniform|exponential|cauchy|"
                   r"geometric|multinomial|poisson|_local_scalar_dense|^aten\._to_copy|"
                   r"^aten\.copy_|lift_fresh|^aten\.set_|_has_compatible_shallow_copy_type")

OP_RE = re.compile(r"aten[.:]+[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)?")


def _is_tpu(x):
    return isinstance(x, torch.Tensor) and x.device.type == "tpu"


def _cpu(x):
    """The CPU twin of an op argument: tensors copied, ``device=tpu`` (factories) -> cpu."""
    if _is_tpu(x):
        return x.detach().cpu().clone()
    if isinstance(x, torch.device) and x.type == "tpu":
        return torch.device("cpu")
    return x


def _differs(got, ref, rtol, atol):
    """None when equal, else max abs difference (inf for shape/dtype mismatch)."""
    if got.shape != ref.shape:
        return float("inf")
    if ref.dtype.is_floating_point or ref.dtype.is_complex:
        g, r = got.to(ref.dtype), ref
        scale = max(1.0, float(r.abs().max())) if r.numel() else 1.0
        if torch.allclose(g, r, rtol=rtol, atol=atol * scale, equal_nan=True):
            return None
        return float((g.double() - r.double()).abs().nan_to_num(float("inf")).max())
    return None if torch.equal(got.to(ref.dtype), ref) else float(
        (got.double() - ref.double()).abs().max())


class OpCompare(TorchDispatchMode):
    """Compares every ATen op that touches a tpu tensor with the same op on the CPU."""

    def __init__(self, rtol=1e-3, atol=1e-5):
        super().__init__()
        self.rtol, self.atol = rtol, atol
        self.diverging: list[tuple[str, float]] = []  # (op, max abs diff), in order
        self.errors: list[tuple[str, str]] = []  # (op, exception) raised by the tpu op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)  # aten.gelu.default
        flat, _ = tree_flatten((args, kwargs))
        check = any(_is_tpu(x) for x in flat) and not _SKIP.search(name)
        cpu_args = cpu_kwargs = None
        if check:
            cpu_args, cpu_kwargs = tree_map(_cpu, args), tree_map(_cpu, kwargs)
        try:
            out = func(*args, **kwargs)
        except Exception as ex:
            self.errors.append((name, f"{type(ex).__name__}: {ex}"))
            raise
        if check:
            try:
                ref = func(*cpu_args, **cpu_kwargs)
            except Exception:
                return out
            gots, _ = tree_flatten(out)
            refs, _ = tree_flatten(ref)
            worst = None
            for g, r in zip(gots, refs):
                if isinstance(r, torch.Tensor) and isinstance(g, torch.Tensor):
                    d = _differs(_cpu(g), _cpu(r), self.rtol, self.atol)
                    if d is not None:
                        worst = d if worst is None else max(worst, d)
            if worst is not None:
                self.diverging.append((name, worst))
        return out


def locate(model, inputs, targets, loss_fn, limit=4):
    """Run one forward + backward of ``model`` (on tpu, strict mode) under
    ``OpCompare``; return a sentence naming the diverging ATen ops."""
    model.zero_grad(set_to_none=True)
    mode = OpCompare()
    note = ""
    with lazyrt.set_mode("strict"):
        try:
            with mode:
                loss = loss_fn(model(*inputs), *targets)
                loss.backward()
        except Exception as ex:  # a raising op is a culprit too
            if mode.errors:
                op, msg = mode.errors[0]
                return f"ATen op {op} raises ({msg[:300]})"
            # An error held until backward() returns (lazyrt cannot raise inside a C++
            # autograd node): compare the forward ops only.
            note = (f"; the backward could not be compared op by op ({type(ex).__name__}: "
                    f"{str(ex)[:200]})")
            diverging = list(mode.diverging)
            model.zero_grad(set_to_none=True)
            mode = OpCompare()
            try:
                with mode:
                    loss_fn(model(*inputs), *targets)
            except Exception as ex2:
                return f"raised outside an ATen op: {type(ex2).__name__}: {str(ex2)[:300]}"
            mode.diverging = diverging or mode.diverging
    if not mode.diverging:
        return ("no single ATen op differs from CPU eager (each compared on its own inputs, "
                "rtol 1e-3): the difference builds up across ops, or is specific to the mode"
                + note)
    seen, parts = set(), []
    for op, d in mode.diverging:
        if op not in seen:
            seen.add(op)
            parts.append(f"{op} (max abs diff {d:.3g})")
    more = f", +{len(seen) - limit} more" if len(seen) > limit else ""
    return "ATen op(s) differing from CPU eager: " + ", ".join(parts[:limit]) + more + note

"""Choices that depend on the backend, as data beside the measurement each came from.

Each section is self-contained: its table, the names it is read by, and where the numbers
came from. Nothing here imports JAX or starts a backend; the readers ask the platform.
"""
from __future__ import annotations

# ---------------------------------------------------------------------------
# compile options
# ---------------------------------------------------------------------------
# XLA options (``Lowered.compile(compiler_options=...)``) per platform and program class,
# read in one place: ``lazyrt._exec.xla.program_options``. They are given per compile,
# never through ``XLA_FLAGS``, so the user's own JAX code keeps XLA's defaults. On the CPU
# ``_exec.xla`` adds its host-dependent vector-width rule on top.
#
# Program classes (``program_class``):
#   "op":    a strict program (one ATen op, a view, a compiled graph run strictly) with no
#            dot or convolution in it
#   "dot":   a strict program with a dot or a convolution
#   "flush": a defer flush (the fused program of a trace), whatever it holds
PROGRAM_CLASSES = ("op", "dot", "flush")

COMPILE_OPTIONS: dict[str, dict[str, dict]] = {
    "cpu": {
        # XLA:CPU's defaults (jaxlib 0.10.2): no measurement here showed a per-class option
        # worth its keep (python -m perf.tier_options measured the cheap-compile knobs;
        # docs/compile-cache.md). The vector width is the host's rule (_exec.xla).
        "op": {},
        "dot": {},
        "flush": {},
    },
    "gpu": {
        # UNMEASURED until the next device run. The first H200 run (shared notes/gpu.md,
        # torch 2.11, JAX 0.11.2, main at e7c9e70) compiled small per-op programs in
        # about 1.3 s each (73 programs, 97.8 s of a 99 s first gpt_train step), mostly
        # autotuning. Autotuning (level 4 by default) picks among GEMM/convolution
        # implementations: a program without a dot or convolution has nothing to tune.
        "op": {"xla_gpu_autotune_level": 0},
        # A per-op GEMM runs as cuBLAS or a Triton GEMM; level 1 tunes without
        # initializing, re-initializing and checking the candidates' buffers.
        "dot": {"xla_gpu_autotune_level": 1},
        # A fused flush runs at every step: XLA's defaults (full autotuning).
        "flush": {},
    },
    "tpu": {
        # No TPU run yet: XLA's defaults.
        "op": {},
        "dot": {},
        "flush": {},
    },
}


def compile_options_for(platform: str, program_class: str) -> dict:
    """The table's options for ``program_class`` on ``platform`` (a copy; empty for a
    platform the table does not list)."""
    if program_class not in PROGRAM_CLASSES:
        raise ValueError(f"lazyrt: unknown program class {program_class!r} "
                         f"(one of {PROGRAM_CLASSES})")
    return dict(COMPILE_OPTIONS.get(platform, {}).get(program_class, {}))

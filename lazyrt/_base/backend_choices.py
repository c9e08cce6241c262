"""Choices lazyrt makes per backend, kept as data, each row naming the run that decided it.

Sections (each self-contained: its table, the names it is read by, where the numbers came
from). Nothing here imports JAX or starts a backend; the readers ask the platform.

* **Pallas routing**: under ``LAZYRT_PALLAS=auto``, which path runs an op that a
  ``kernels_pallas`` kernel could take, per platform and shape class.
* **compile options**: XLA compile options per platform and program class.
"""
from __future__ import annotations

import dataclasses

# ---------------------------------------------------------------------------------------
# Pallas routing
# ---------------------------------------------------------------------------------------
#
# Rule (issue 38): ``auto`` runs a Pallas kernel on a platform only for the shape classes
# where the device check (``python -m perf.device``) measured it at least as fast as XLA's
# own path. Everything else runs XLA's path; on GPU, attention in float16/bfloat16 first
# tries XLA's fused cuDNN attention (``jax.nn.dot_product_attention(implementation=
# "cudnn")``, where its constraints allow: ``lowering/attention.py``), then the jnp path.
# ``LAZYRT_PALLAS=on`` ignores this table (the kernels wherever they fit), ``off`` never
# runs a kernel. To change a row, run the device check, add the run to ``PALLAS_RUNS``
# and name it in the row.
#
# Shape classes: the input dtype ("float32", or "half" for bfloat16/float16) and the work
# ("small" below ``LARGE_WORK`` multiply-adds, else "large"): a matmul's M*N*K (times the
# batch), an attention's B*Hq*L*S*E. At the measured d1024 GPT (seq 512, batch 16) every
# matmul and attention is "large"; at the small GPT (d256, seq 128, batch 8) every one is
# "small".

# Routes: "pallas" (the kernels_pallas kernel), "cudnn" (XLA's fused cuDNN attention,
# attention on GPU only), "xla" (XLA's own path: the jnp lowering).
ROUTES = ("pallas", "cudnn", "xla")
KERNELS = ("matmul", "attention", "paged_attention")
DTYPE_CLASSES = ("float32", "half")
SIZE_CLASSES = ("small", "large")
PLATFORMS = ("cpu", "gpu", "tpu")
# Multiply-adds from which an op is "large" (2**30: a 1024^3 matmul).
LARGE_WORK = 1 << 30

# The runs the rows cite.
PALLAS_RUNS: dict[str, str] = {
    "h200-2026-12-03": (
        "python -m perf.device and a prepared script on one NVIDIA H200 (torch 2.11.0+cu130, "
        "JAX 0.11.2 with the CUDA 13 plugin, main at e7c9e70; float32, TF32 off): defer "
        "gpt_train d1024 seq 512 batch 16 vocab 8192 895.8 ms/step with LAZYRT_PALLAS=auto "
        "(Pallas matmul and attention) vs 64.2 ms with off (XLA); gpt_infer at that size "
        "400.8 vs 20.8 ms (docs/performance.md, 'GPU')"),
    "unmeasured": (
        "no device check has timed the kernels against XLA for this class: XLA's path, "
        "by the rule"),
    "interpret-only": (
        "on the CPU Pallas runs only in interpret mode (for tests), never fast"),
    "cudnn-default": (
        "not timed by lazyrt yet: XLA's fused cuDNN attention is JAX's fast attention on "
        "NVIDIA GPUs for float16/bfloat16; used where its constraints hold and a one-time "
        "compile probe passes (perf.device_kernels times it against the jnp path and the "
        "kernel)"),
}


@dataclasses.dataclass(frozen=True)
class Route:
    """One row's decision: the routes to try in order (the first that applies runs; "xla"
    always applies), and the run (a ``PALLAS_RUNS`` key) that decided it."""

    order: tuple[str, ...]
    run: str

    def __post_init__(self) -> None:
        if not self.order or self.order[-1] != "xla" or any(r not in ROUTES for r in self.order):
            raise ValueError(f"route order {self.order!r} must end with 'xla'")
        if self.run not in PALLAS_RUNS:
            raise ValueError(f"route run {self.run!r} is not in PALLAS_RUNS")


_XLA_MEASURED = Route(("xla",), "h200-2026-12-03")
_XLA_UNMEASURED = Route(("xla",), "unmeasured")
_CUDNN = Route(("cudnn", "xla"), "cudnn-default")

# (platform, kernel, dtype class, size class) -> Route. Every combination has a row.
PALLAS_ROUTING: dict[tuple[str, str, str, str], Route] = {}
for _k in KERNELS:
    for _d in DTYPE_CLASSES:
        for _s in SIZE_CLASSES:
            PALLAS_ROUTING["cpu", _k, _d, _s] = Route(("xla",), "interpret-only")
            # TPU: no device check has run on a TPU: XLA by the rule (the kernels were
            # used there before issue 38 without a measurement).
            PALLAS_ROUTING["tpu", _k, _d, _s] = _XLA_UNMEASURED
            PALLAS_ROUTING["gpu", _k, _d, _s] = _XLA_UNMEASURED
# GPU, measured: the kernels 14-19x slower than XLA on the large float32 GPT steps.
PALLAS_ROUTING["gpu", "matmul", "float32", "large"] = _XLA_MEASURED
PALLAS_ROUTING["gpu", "attention", "float32", "large"] = _XLA_MEASURED
# GPU attention in half precision: cuDNN where it applies, else XLA (no Pallas row
# measured faster).
PALLAS_ROUTING["gpu", "attention", "half", "small"] = _CUDNN
PALLAS_ROUTING["gpu", "attention", "half", "large"] = _CUDNN
del _k, _d, _s


def platform_class(backend: str) -> str:
    """'cpu', 'gpu' or 'tpu' for a JAX backend or device platform name."""
    return "gpu" if backend in ("gpu", "cuda", "rocm") else backend


def dtype_class(dtype) -> str:
    """'half' for bfloat16/float16 (a JAX, NumPy or torch dtype), else 'float32' (the
    kernels take no other dtype)."""
    name = str(dtype).removeprefix("torch.")
    try:
        import numpy as np

        name = np.dtype(dtype).name
    except TypeError:
        pass
    return "half" if name in ("bfloat16", "float16", "half") else "float32"


def size_class(work: int) -> str:
    return "large" if work >= LARGE_WORK else "small"


def pallas_route(platform: str, kernel: str, dtype, work: int) -> Route:
    """The table's row for this op (``work``: its multiply-adds)."""
    return PALLAS_ROUTING[platform_class(platform), kernel, dtype_class(dtype), size_class(work)]


def uses_pallas(platform: str) -> bool:
    """Whether any row of this platform runs a kernel (``auto``)."""
    p = platform_class(platform)
    return any("pallas" in r.order for (q, *_), r in PALLAS_ROUTING.items() if q == p)


def pallas_table_markdown() -> str:
    """The table as markdown (docs, ``perf.device``'s report)."""
    lines = ["| platform | kernel | dtype | size | auto runs | decided by |",
             "| --- | --- | --- | --- | --- | --- |"]
    for (p, k, d, s), r in PALLAS_ROUTING.items():
        lines.append(f"| {p} | {k} | {d} | {s} | {' > '.join(r.order)} | {r.run} |")
    return "\n".join(lines) + "\n"


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

"""XLA compile options lazyrt passes to every executable it builds.

They are given per compile (``Lowered.compile(compiler_options=...)``), never through the
process-wide ``XLA_FLAGS``, so the user's own JAX code keeps XLA's defaults.

On XLA:CPU the elementwise loops XLA emits itself (not the matmuls, which go to its
kernel libraries) are vectorized for 256-bit registers by default. On a CPU with AVX-512,
asking for 512-bit vectors makes a long fused elementwise chain about 2x faster (measured
on the ew_chain benchmark: 6.2 -> 3.2 ms on one core). ``LAZYRT_XLA_CPU_VECTOR_WIDTH``
overrides the choice (``auto``, ``256``, ``512`` or ``off``); a ``--xla_cpu_prefer_vector_width``
in ``XLA_FLAGS`` wins over both.
"""
from __future__ import annotations

import functools
import os
import re
import time
import warnings

import jax

from .._base.memory import MemoryAnalysis
from .._base.metrics import COUNTERS
from .._base.platform import on_cpu
from . import lean as _lean


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _vector_width() -> int | None:
    if "xla_cpu_prefer_vector_width" in os.environ.get("XLA_FLAGS", ""):
        return None
    v = os.environ.get("LAZYRT_XLA_CPU_VECTOR_WIDTH", "auto").strip().lower() or "auto"
    if v == "off":
        return None
    if v == "auto":
        return 512 if "avx512f" in _cpu_flags() else None
    if v not in ("256", "512"):
        raise ValueError(f"lazyrt: LAZYRT_XLA_CPU_VECTOR_WIDTH={v!r} must be one of "
                         "'auto', '256', '512', 'off'")
    return int(v)


@functools.cache
def compile_options() -> dict:
    """Options for ``Lowered.compile`` (empty off CPU)."""
    if not on_cpu():
        return {}
    w = _vector_width()
    return {} if w is None else {"xla_cpu_prefer_vector_width": w}


# NOTE: XLA:CPU (jaxlib 0.10.2) miscompiles atan at 512-bit vector width: arctan of 400 or
# 4096 float32 values comes back as zeros and garbage (tests/test_xla_cpu.py checks it stays
# right). A program with an atan in it is compiled at XLA's default width instead. A scan of
# 55 elementwise ops in 4 dtypes, and of 300 random 5-op fused chains of them, found no
# other op that differs between the two widths.
_WIDTH_UNSAFE = re.compile(r"\.atan\b")


def compile(lowered):
    """Compile a ``jax.stages.Lowered`` with lazyrt's options."""
    opts = compile_options()
    if opts and "xla_cpu_prefer_vector_width" in opts and _WIDTH_UNSAFE.search(lowered.as_text()):
        opts = {k: v for k, v in opts.items() if k != "xla_cpu_prefer_vector_width"}
    return lowered.compile(compiler_options=opts) if opts else lowered.compile()


def compile_program(fn, args: tuple, donate_argnums: tuple = (), lean: bool = False):
    """Lower ``fn`` at ``args`` and compile it with lazyrt's options: the one place every
    lazyrt executable (a strict op, a defer flush) is built. Returns ``(executable,
    memory analysis, seconds)`` and counts the compile in ``lazyrt._base.metrics``. ``lean``:
    simplify the traced program first (``_lean``: a flush's common subexpressions).

    Lowered with x64 on, so int64/float64 stay exact (lazyrt enables x64 only locally)."""
    t0 = time.perf_counter()
    with jax.enable_x64(True), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        jitted = jax.jit(fn, donate_argnums=donate_argnums)
        lowered = _lean.lower(jitted, args) if lean else jitted.lower(*args)
        exe = compile(lowered)
    seconds = time.perf_counter() - t0
    COUNTERS["cache_misses"] += 1
    COUNTERS["compile_seconds"] += seconds
    return exe, MemoryAnalysis.of(exe), seconds


def enable_persistent_cache(path: str) -> None:
    """Compiled executables persist across processes in JAX's compilation cache
    (``LAZYRT_CACHE_DIR``)."""
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

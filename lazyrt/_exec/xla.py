"""XLA compile options lazyrt passes to every executable it builds.

They are given per compile (``Lowered.compile(compiler_options=...)``), never through the
process-wide ``XLA_FLAGS``, so the user's own JAX code keeps XLA's defaults. Which options
a program gets depends on the platform and the program's class (a strict program with or
without a dot or convolution, a defer flush): the table ``_base.backend_choices``
(section "compile options"), read here only (``program_options``).

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
from jax.experimental import serialize_executable as _se

from .._base import backend_choices as _choices
from .._base.config import config
from .._base.memory import MemoryAnalysis
from .._base.metrics import COUNTERS
from .._base.platform import on_cpu, platform
from . import diskcache as _diskcache
from . import lean as _lean
from . import profile as _profile
from . import tiers as _tiers


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
    """The host's options for every program (the CPU's vector width; empty off CPU); the
    per-class ones are ``program_options``'s."""
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


_DOT_OR_CONV = re.compile(r"stablehlo\.(?:dot_general|dot|convolution)\b")


def program_class(kind: str, text: str | None) -> str:
    """The class of a program (``_choices.PROGRAM_CLASSES``): ``kind`` is "flush" for a
    defer flush, "op" for a strict program, which is "dot" if its StableHLO ``text`` holds
    a dot or a convolution."""
    if kind == "flush":
        return "flush"
    return "dot" if text is not None and _DOT_OR_CONV.search(text) else "op"


def _class_needs_text(kind: str) -> bool:
    """Whether telling "op" from "dot" changes the options on this platform."""
    if kind == "flush":
        return False
    p = platform()
    return _choices.compile_options_for(p, "op") != _choices.compile_options_for(p, "dot")


def program_options(text: str | None, kind: str = "op") -> dict:
    """The options a program is compiled with: its class's row of the table for this
    platform, and on the CPU the host's vector width (``text``: its StableHLO, for the
    class and the width rule)."""
    opts = {**_choices.compile_options_for(platform(), program_class(kind, text)),
            **compile_options()}
    if "xla_cpu_prefer_vector_width" in opts and _WIDTH_UNSAFE.search(text or ""):
        del opts["xla_cpu_prefer_vector_width"]
    return opts


def full_options(text: str | None, kind: str = "op") -> dict:
    """``program_options`` (the name perf scripts use)."""
    return program_options(text, kind)


# The first tier: LLVM at -O0. Measured on this project's programs (XLA:CPU, jaxlib 0.10.2;
# python -m perf.tier_options, docs/compile-cache.md): about 37% less compile time than the
# default, the same results bit for bit except reductions (may differ in the last bits:
# vectorized and scalar loops sum in a different order), and 2-2.5x slower to run.
# XLA's other cheap-compile knobs measured no faster:
# xla_llvm_disable_expensive_passes, exec_time_optimization_effort, optimization_level,
# xla_cpu_opt_preset=CPU_OPT_PRESET_FAST_COMPILE, xla_cpu_parallel_codegen_split_count;
# xla_cpu_use_fusion_emitters=False halves a one-op program's compile (a [3, 5] mul: 28 ->
# 14 ms) but not gpt_train's 40 strict programs' (3.55 -> 3.58 CPU s), 2 of which then
# differ in the last bits, and its defer flush ran 24% slower (python -m perf.tier_options).
FIRST_TIER = {"xla_backend_optimization_level": 0}


def _needs_text(opts: dict, kind: str = "op") -> bool:
    return ("xla_cpu_prefer_vector_width" in opts or _diskcache.directory() is not None
            or _class_needs_text(kind))


def compile(lowered, opts: dict | None = None, kind: str = "flush"):
    """Compile a ``jax.stages.Lowered`` with lazyrt's options for a program of ``kind``
    (or ``opts``)."""
    if opts is None:
        base = compile_options()
        need = "xla_cpu_prefer_vector_width" in base or _class_needs_text(kind)
        opts = program_options(lowered.as_text() if need else None, kind)
    return lowered.compile(compiler_options=opts) if opts else lowered.compile()


def _load(name: str | None, lowered):
    """``(executable, payload)`` stored under ``name`` in the persistent cache, or
    ``(None, None)``."""
    if name is None:
        return None, None
    payload = _diskcache.get(name)
    if payload is None:
        return None, None
    try:
        exe = _se.deserialize_and_load(payload, lowered.in_tree, lowered.out_tree,
                                       execution_devices=_diskcache.devices_of(lowered))
    except Exception:  # an entry this jaxlib cannot load is a miss
        COUNTERS["disk_cache_damaged"] += 1
        return None, None
    _diskcache.mark_loaded(exe)
    COUNTERS["disk_cache_hits"] += 1
    return exe, payload


def _store(name: str | None, exe, now: bool = False) -> None:
    """Write ``exe`` to the persistent cache under ``name``: serialized here, before it
    first runs (``_diskcache.serialize``), written on the compile worker, or ``now``."""
    if name is not None:
        _store_payload(name, _diskcache.serialize(exe), now)


# A first-tier program is rebuilt optimized once it runs this many times: a program run
# once (start-up, a one-off shape) never costs a second compile.
UPGRADE_AFTER_CALLS = 2


class FirstTier:
    """A first-tier executable: runs as the executable it wraps, and queues its program's
    optimized build (``Upgrade``) at its ``UPGRADE_AFTER_CALLS``-th call."""

    __slots__ = ("exe", "upgrade", "calls")

    def __init__(self, exe, upgrade: Upgrade):
        self.exe, self.upgrade, self.calls = exe, upgrade, 0

    def __call__(self, *args):
        self.calls += 1
        if self.calls >= UPGRADE_AFTER_CALLS and not self.upgrade.submitted:
            self.upgrade.submit()  # again on later calls if the worker's queue was full
        return self.exe(*args)

    def memory_analysis(self):
        return self.exe.memory_analysis()


class Upgrade:
    """The optimized build of a program that runs at the first tier for now. The caller
    ``arm``s it with ``install(executable, memory analysis)``, which rebinds its executable
    slot; once the program is hot (``FirstTier``) the compile worker builds it, installs it
    and stores it in the persistent cache."""

    __slots__ = ("lowered", "opts", "name", "install", "submitted", "signed")

    def __init__(self, lowered, opts: dict, name: str | None, signed: str | None = None):
        self.lowered, self.opts, self.name = lowered, opts, name
        self.signed = signed
        self.install = None
        self.submitted = False

    def arm(self, install) -> None:
        self.install = install
        if UPGRADE_AFTER_CALLS <= 1:
            self.submit()

    def submit(self) -> None:
        if self.install is not None and not self.submitted:
            self.submitted = _tiers.submit(_tiers.COMPILE, self)

    def __call__(self) -> None:
        t0 = time.perf_counter()
        with jax.enable_x64(True):
            exe = compile(self.lowered, self.opts)
        COUNTERS["tier_compile_seconds"] += time.perf_counter() - t0
        _store(self.name, exe, now=True)  # before install: the caller may run it at once
        _store_signed(self.signed, exe, now=True)
        self.install(exe, MemoryAnalysis.of(exe))
        COUNTERS["tier_swaps"] += 1
        self.lowered = self.install = None


def signed_name(sig: str, args, donate_argnums: tuple, kind: str = "op") -> str | None:
    """The disk cache entry of the program of signature ``sig`` at ``args`` (None where such
    programs are not stored). Its options' row follows from the program and the table is in
    the key's source hash, so the key names the host's options and the kind."""
    return _diskcache.signature_key(sig, args, donate_argnums,
                                    {**compile_options(), "lazyrt_kind": kind})


def _load_signed(sig, args, donate_argnums, kind: str):
    """``(entry name, executable or None)`` of a program with signature ``sig``."""
    if sig is None or _diskcache.directory() is None:
        return None, None
    name = signed_name(sig, args, donate_argnums, kind)
    if name is None:
        return None, None
    with jax.enable_x64(True):
        exe = _diskcache.load_signed(name, args, donate_argnums)
    if exe is not None:
        COUNTERS["disk_cache_hits"] += 1
        COUNTERS["disk_cache_signed_hits"] += 1
    return name, exe


def _store_signed(name: str | None, exe, now: bool = False) -> None:
    """``_store`` for a signature entry (serialized here, before ``exe`` first runs)."""
    if name is not None:
        _store_payload(name, _diskcache.serialize_signed(exe), now)


def _store_payload(name: str, payload: bytes | None, now: bool = False) -> None:
    if payload is None:
        return
    if now:
        _diskcache.put(name, payload)
    else:
        _tiers.submit(_tiers.WRITE, lambda: _diskcache.put(name, payload))


def compile_program(fn, args: tuple, donate_argnums: tuple = (), lean: bool = False,
                    tiered: bool = False, kind: str = "op", sig: str | None = None):
    """Lower ``fn`` at ``args`` and compile it with lazyrt's options: the one place every
    lazyrt executable (a strict op, a defer flush) is built. Returns ``(executable,
    memory analysis, seconds)`` and counts the compile in ``lazyrt._base.metrics``. ``lean``:
    simplify the traced program first (``_lean``: a flush's common subexpressions).

    The persistent cache (``_diskcache``) is looked up first, and a program compiled here
    is stored there. ``tiered``: the caller can swap executables (strict's ``prog.exe``,
    defer's ``Exe.compiled``); then, with ``LAZYRT_COMPILE=tiered``, a program not in the
    cache is compiled at the first tier (``FIRST_TIER``; stored too, so that a short
    process leaves the next one warm), returned as a ``FirstTier``, and a fourth value is
    returned: an ``Upgrade`` (None when the executable is already the optimized one) that
    the caller ``arm``s once the executable is in its slot.

    ``kind``: "op" (a strict program) or "flush" (a defer flush): with the program's
    StableHLO it picks the options' row (``program_options``).

    ``sig``: the program's signature in lazyrt's terms (``Prog.sig``): its executable is
    looked up by it first, without tracing (``_diskcache.signature_key``), and stored under
    it once compiled.

    Lowered with x64 on, so int64/float64 stay exact (lazyrt enables x64 only locally)."""
    t0 = time.perf_counter()
    upgrade = None
    signed, exe = _load_signed(sig, args, donate_argnums, kind)
    if exe is not None:
        return _built(exe, t0, tiered, None)
    with jax.enable_x64(True), warnings.catch_warnings(), _profile.span(_profile.COMPILE):
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        jitted = jax.jit(fn, donate_argnums=donate_argnums)
        lowered = _lean.lower(jitted, args) if lean else jitted.lower(*args)
        text = lowered.as_text() if _needs_text(compile_options(), kind) else None
        opts = program_options(text, kind)
        name = None if text is None or _diskcache.directory() is None else \
            _diskcache.key(lowered, text, opts)
        if signed is not None and _diskcache.key(lowered, "", {}) is None:
            signed = None  # host callbacks (or no device list): never stored, signed neither
        exe, payload = _load(name, lowered)
        if exe is None:
            if tiered and config.compile == "tiered" and _tiers.has_room():
                name0 = None if name is None else name + "-tier0"
                exe = _load(name0, lowered)[0]
                if exe is None:
                    exe = compile(lowered, {**opts, **FIRST_TIER})
                    _store(name0, exe)
                upgrade = Upgrade(lowered, opts, name, signed)
                exe = FirstTier(exe, upgrade)
            else:
                exe = compile(lowered, opts)
                _store(name, exe)
                _store_signed(signed, exe)
        elif signed is not None:
            # NOTE: the payload read, never ``exe`` serialized again: XLA:CPU (jaxlib 0.10.2)
            # writes a loaded executable without its kernels ("Function wrapped_add not
            # found" when the next process runs it)
            _store_payload(signed, _diskcache.signed_payload(payload, lowered.in_tree,
                                                             lowered.out_tree))
    return _built(exe, t0, tiered, upgrade)


def _built(exe, t0: float, tiered: bool, upgrade):
    """``compile_program``'s result, counted (a program not in memory: a cache miss)."""
    seconds = time.perf_counter() - t0
    COUNTERS["cache_misses"] += 1
    COUNTERS["compile_seconds"] += seconds
    if tiered:
        return exe, _diskcache.analysis_of(exe), seconds, upgrade
    return exe, _diskcache.analysis_of(exe), seconds

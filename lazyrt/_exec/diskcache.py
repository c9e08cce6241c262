"""The persistent compile cache: compiled executables kept on disk across processes.

On by default, in ``$XDG_CACHE_HOME/lazyrt`` (``~/.cache/lazyrt``); ``LAZYRT_CACHE_DIR``
names another directory, ``LAZYRT_CACHE_DIR=off`` turns it off (nothing is read or
written). Entries live in a subdirectory named by a hash of what an executable depends on
besides its program: lazyrt's, JAX's, jaxlib's and PyTorch's versions, the platform and
its device kind, and on the CPU the host's instruction-set features (an executable built
for AVX-512 must not run on a host without it). Within it, an entry's name is a hash of
the program itself (its StableHLO text, every argument's shape, dtype and donation, argument
and result structure, devices and compile options), so a changed lowering is a different entry, never a stale one.

Several processes may share the directory (``torchrun`` ranks, two runs at once): an entry
is written to a temporary file and renamed into place, so a reader sees a whole entry or
none; each entry carries its length and a SHA-256 of its payload, and one that fails the
check is deleted and counted as a miss. The directory is bounded (``LAZYRT_CACHE_MAX_MB``,
default 2048): a read touches the entry's modification time, and after every 1/16 of the
bound written, one process at a time (an advisory lock) deletes the least recently used
entries down to 90% of the bound.

A warm process finds most executables without tracing: a program with a signature in
lazyrt's own terms (``Prog.sig``: the op, its static arguments, the avals, the scalars'
kinds; a flush: its nodes' signatures and wiring) is also stored under ``signature_key``:
a hash of that signature, the program's argument avals and donation, the compile options,
the switches lowerings read (``switches``) and a hash of lazyrt's own source
(``source_key``: any change to a lowering, to the plan or view machinery, is a new key).
Such an entry carries the executable's argument and result structure, and a loaded one is
used only if its arguments (count, shapes, dtypes, donation) are exactly the program's
(``load_signed``); otherwise the program is traced and compiled as before. It also
carries the executable's memory analysis (``analysis_of``). Plans keep their verdicts
(``plan_checked``) and their meta kernels' output specs (``meta_specs``) here too, so a warm
process builds them without tracing a lowering or running a meta kernel.

As with JAX's own compilation cache, the directory is trusted: an entry is machine code
this process will run. It is created private to the user (mode 0700).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pickle
import struct
import threading
import time
import warnings
import weakref

import jax
from jax.experimental import serialize_executable as _se

from .._base.config import OFF, config
from .._base.memory import MemoryAnalysis
from .._base.metrics import COUNTERS
from .._base.platform import VERSION, platform

try:  # advisory locks (POSIX); without them eviction still runs, just not one at a time
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

_MAGIC = b"LZRTX1\n"
_HEAD = struct.Struct("<Q32s")  # payload length, sha256(payload)
_SUFFIX = ".exe"
_TMP_PREFIX = ".tmp-"
_written = {"bytes": 0}
_lock = threading.Lock()


def _cpu_features() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    import platform as _pl

    return _pl.machine() + " " + _pl.processor()


@functools.cache
def environment_key() -> str:
    """What every entry depends on besides its program (the subdirectory's name)."""
    import jaxlib
    import torch

    dev = jax.devices()[0]
    parts = [VERSION, jax.__version__, jaxlib.__version__, torch.__version__, platform(),
             getattr(dev, "device_kind", ""), getattr(dev.client, "platform_version", "")]
    if platform() == "cpu":
        parts.append(_cpu_features())
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def directory() -> str | None:
    """This environment's entry directory (created on first use), or None when off (or
    when it cannot be created: then one warning, and the process runs without it)."""
    root = config.cache_dir
    if not root or root.strip().lower() in OFF:  # set in code as ``LAZYRT_CACHE_DIR`` reads
        return None
    return _make_dir(root, os.getcwd() if not os.path.isabs(root) else "")


@functools.cache
def _make_dir(root: str, cwd: str) -> str | None:
    # NOTE: cached per (root, working directory of a relative root): every entry read and
    # written asks for the directory, and a warm process reads one per plan and program
    path = os.path.join(os.path.abspath(os.path.expanduser(root)), "xla-" + environment_key())
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as e:
        warnings.warn(f"lazyrt: the compile cache directory {path!r} cannot be created "
                      f"({e}); running without a persistent compile cache "
                      "(LAZYRT_CACHE_DIR names another directory, or 'off')",
                      RuntimeWarning, stacklevel=2)
        return None
    return path


def key(lowered, text: str, options: dict, tag: str = "") -> str | None:
    """An entry's name: a hash of the program (``text``: its StableHLO) and how it is
    compiled; None for a program that is not stored (host callbacks, no device list)."""
    devices = devices_of(lowered)
    if devices is None or lowered._lowering.compile_args.get("host_callbacks"):
        return None
    h = hashlib.sha256()
    # NOTE: ``args_info`` too: jit drops unused arguments from the program, so two
    # programs whose texts are equal can take differently shaped (or donated) arguments.
    for part in (text, str(lowered.args_info), str(lowered.in_tree), str(lowered.out_tree),
                 repr(sorted(options.items())), ",".join(str(d.id) for d in devices), tag):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


@functools.cache
def source_key() -> str:
    """A hash of lazyrt's own source (every module, the Pallas kernels beside it): what
    a signature does not spell out (how a lowering computes) changes with it."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for root in (pkg, os.path.join(os.path.dirname(pkg), "kernels_pallas")):
        paths = []
        for d, _, files in os.walk(root):
            paths += [os.path.join(d, f) for f in files if f.endswith(".py")]
        for path in sorted(paths):
            h.update(os.path.relpath(path, os.path.dirname(pkg)).encode())
            h.update(b"\0")
            with open(path, "rb") as f:
                h.update(f.read())
            h.update(b"\0")
    return h.hexdigest()


def switches() -> str:
    """What lowerings read besides their arguments: lazyrt's switches, PyTorch's float32
    matmul precision, JAX's default matmul precision."""
    import torch

    return "|".join((repr(config), torch.get_float32_matmul_precision(),
                     str(jax.config.jax_default_matmul_precision)))


_DTYPE_NAMES: dict = {}


def _dtype_name(dt) -> str:
    """``str(dt)``, remembered (NumPy builds a dtype's name anew each time: ~10 us, and a
    warm process names every argument of every program it loads, twice)."""
    s = _DTYPE_NAMES.get(dt)
    if s is None:
        s = _DTYPE_NAMES[dt] = str(dt)
    return s


def _arg_avals(args) -> list:
    out = []
    for a in jax.tree_util.tree_leaves(args):
        if hasattr(a, "shape") and hasattr(a, "dtype"):
            out.append((tuple(a.shape), _dtype_name(a.dtype),
                        bool(getattr(a, "weak_type", False))))
        else:
            out.append(type(a).__name__)
    return out


def signature_key(sig: str, args, donate_argnums: tuple, options: dict) -> str | None:
    """The entry name of the program of signature ``sig`` at ``args`` (module docstring);
    None where the program is not stored so (several devices: placement is not in it)."""
    if len(jax.devices()) != 1:
        return None
    h = hashlib.sha256()
    for part in ("signed-1", sig, repr(_arg_avals(args)), repr(tuple(donate_argnums)),
                 repr(sorted(options.items())), switches(), source_key(),
                 str(jax.devices()[0].id)):
        h.update(part.encode())
        h.update(b"\0")
    return "s" + h.hexdigest()


def _plan_name(sig: str) -> str | None:
    if directory() is None:
        return None
    h = hashlib.sha256()
    for part in ("plan-1", sig, switches(), source_key()):
        h.update(part.encode())
        h.update(b"\0")
    return "p" + h.hexdigest()


def plan_checked(sig: str) -> bool | None:
    """Whether the plan of signature ``sig`` makes a constant, if an earlier process with
    this lazyrt checked it (traced its lowering abstractly without an error), else None."""
    name = _plan_name(sig)
    payload = None if name is None else get(name)
    if payload not in (b"0", b"1"):
        return None
    COUNTERS["disk_cache_plan_hits"] += 1
    return payload == b"1"


def note_plan(sig: str, const: bool) -> None:
    """Record that the plan of signature ``sig`` was checked (``plan_checked``)."""
    name = _plan_name(sig)
    if name is not None:
        put(name, b"1" if const else b"0", count=False)


def meta_specs(text: str | None):
    """``(name, kept)``: the entry name of an op's meta inputs ``text`` (the op and
    ``_ops.args.meta_text`` of its arguments) and what an earlier process with this lazyrt,
    PyTorch and default dtype kept of that op's meta kernel there (``note_meta``), or
    None; ``(None, None)`` where nothing is kept (no cache, no stable text)."""
    if text is None or directory() is None:
        return None, None
    import torch

    h = hashlib.sha256()
    for part in ("meta-1", text, str(torch.get_default_dtype()), switches(), source_key()):
        h.update(part.encode())
        h.update(b"\0")
    name = "m" + h.hexdigest()
    payload = get(name)
    if payload is None:
        return name, None
    try:
        kept = pickle.loads(payload)
    except Exception:  # a damaged entry is a miss
        COUNTERS["disk_cache_damaged"] += 1
        return name, None
    COUNTERS["disk_cache_meta_hits"] += 1
    return name, kept


def note_meta(name: str, kept) -> None:
    """Keep ``kept`` (a plan's output specs from the meta kernel) under ``name``."""
    with contextlib.suppress(pickle.PicklingError, TypeError, AttributeError):
        put(name, pickle.dumps(kept), count=False)


def _expected_avals(args, donate_argnums: tuple) -> list:
    """(shape, dtype, donated) per flat argument, as an executable for ``args`` takes them."""
    out = []
    for i, a in enumerate(args):
        donated = i in donate_argnums
        for leaf in jax.tree_util.tree_leaves(a):
            aval = leaf if isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)) else \
                jax.typeof(leaf)
            out.append((tuple(aval.shape), _dtype_name(aval.dtype), donated))
    return out


def load_signed(name: str, args, donate_argnums: tuple):
    """The executable stored under signature key ``name``, if it takes exactly ``args``
    (count, shapes, dtypes, donation), else None."""
    payload = get(name)
    if payload is None:
        return None
    from jax.experimental import serialize_executable as se

    try:
        exe_bytes, in_tree, out_tree, *rest = pickle.loads(payload)
        exe = se.deserialize_and_load(exe_bytes, in_tree, out_tree,
                                      execution_devices=jax.devices()[:1])
        mark_loaded(exe)
        if rest and rest[0] is not None:
            with contextlib.suppress(TypeError):
                _analyses[exe] = MemoryAnalysis(*rest[0])
        got = [(tuple(ai._aval.shape), _dtype_name(ai._aval.dtype), bool(ai.donated))
               for ai in jax.tree_util.tree_leaves(exe.args_info)]
    except Exception:  # an entry this jaxlib cannot load is a miss
        COUNTERS["disk_cache_damaged"] += 1
        return None
    if got != _expected_avals(args, donate_argnums):
        COUNTERS["disk_cache_mismatches"] += 1
        return None
    return exe


def signed_payload(exe_bytes: bytes | None, in_tree, out_tree,
                   memory: MemoryAnalysis | None = None) -> bytes | None:
    """A signature entry's payload: an executable's bytes with its argument/result
    structure, and its memory analysis where known (a loaded executable's is then read
    from the entry: XLA:CPU takes ~0.4 ms per program, 0.1 s for a large flush)."""
    if exe_bytes is None:
        return None
    mem = None if memory is None else (
        memory.argument_bytes, memory.output_bytes, memory.temp_bytes, memory.alias_bytes,
        memory.peak_bytes, memory.generated_code_bytes)
    try:
        return pickle.dumps((exe_bytes, in_tree, out_tree, mem))
    except (AttributeError, TypeError, pickle.PicklingError):
        return None


# Executables loaded from the cache: never serialized again (``serialize``).
_loaded: weakref.WeakSet = weakref.WeakSet()
# ... and their memory analyses, as their entries carry them
_analyses: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def analysis_of(exe) -> MemoryAnalysis:
    """``MemoryAnalysis.of(exe)``, read from its entry for an executable loaded with one."""
    try:
        m = _analyses.get(exe)
    except TypeError:  # not weakly referable: never loaded here
        m = None
    return MemoryAnalysis.of(exe) if m is None else m


def mark_loaded(exe) -> None:
    with contextlib.suppress(TypeError):
        _loaded.add(exe)


def serialize_signed(exe) -> bytes | None:
    """``exe``'s payload for a signature entry (its argument/result structure with it), or
    None where it cannot be stored; like ``serialize``, call it before ``exe`` first runs."""
    exe_bytes = serialize(exe)
    if exe_bytes is None:
        return None
    return signed_payload(exe_bytes, exe.in_tree, exe.out_tree, MemoryAnalysis.of(exe))


def devices_of(lowered):
    """The devices ``lowered`` runs on (an executable is loaded onto exactly these)."""
    try:
        return list(lowered._lowering._device_list)
    except (AttributeError, TypeError):
        return None


def serialize(exe) -> bytes | None:
    """``exe``'s payload for ``put``, or None for an executable that cannot be stored
    (constants or host callbacks in it; a kind of XLA:CPU step jaxlib cannot write out),
    which the next process compiles again (``disk_cache_unstorable`` counts them).

    Call it before ``exe`` first runs: XLA:CPU (jaxlib 0.10.2) swaps a sort's comparator for
    its built-in one on the first run, and from then on refuses to serialize the executable
    ("UNIMPLEMENTED: `LessThan` is not serializable": every program with a sort, argsort,
    topk or kthvalue, written after it ran). A program compiled a second time in one
    process comes back from JAX as the executable it built the first time, which may have
    run: then it is not stored. Nor is an executable loaded from the cache: XLA:CPU
    (jaxlib 0.10.2) writes one without its kernels, and the process that loads that fails
    at its first call ("NOT_FOUND: Function wrapped_add not found")."""
    if exe in _loaded:
        COUNTERS["disk_cache_unstorable"] += 1
        return None
    try:
        return _se.serialize(exe)[0]
    except (ValueError, NotImplementedError):
        pass
    except jax.errors.JaxRuntimeError as e:
        if not str(e).startswith("UNIMPLEMENTED"):
            raise
    COUNTERS["disk_cache_unstorable"] += 1
    return None


def get(name: str) -> bytes | None:
    """The payload stored under ``name``, or None (missing, unreadable or damaged)."""
    d = directory()
    if d is None:
        return None
    path = os.path.join(d, name + _SUFFIX)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    n0 = len(_MAGIC) + _HEAD.size
    ok = len(data) >= n0 and data.startswith(_MAGIC)
    if ok:
        length, digest = _HEAD.unpack_from(data, len(_MAGIC))
        payload = data[n0:]
        ok = len(payload) == length and hashlib.sha256(payload).digest() == digest
    if not ok:
        COUNTERS["disk_cache_damaged"] += 1
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # least recently used goes first
    return payload


def put(name: str, payload: bytes, count: bool = True) -> bool:
    """Store ``payload`` under ``name`` (atomically; an existing entry is kept); ``count``:
    in ``disk_cache_writes`` (executables are, plans' verdicts are not)."""
    d = directory()
    if d is None:
        return False
    path = os.path.join(d, name + _SUFFIX)
    if os.path.exists(path):
        return False
    tmp = os.path.join(d, f"{_TMP_PREFIX}{os.getpid()}-{threading.get_ident()}-{name[:16]}")
    try:
        with open(tmp, "wb") as f:
            f.write(_MAGIC)
            f.write(_HEAD.pack(len(payload), hashlib.sha256(payload).digest()))
            f.write(payload)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
    if count:
        COUNTERS["disk_cache_writes"] += 1
    with _lock:
        _written["bytes"] += len(payload)
        due = _written["bytes"] >= max_bytes() // 16
        if due:
            _written["bytes"] = 0
    if due:
        evict()
    return True


def max_bytes() -> int:
    return int(config.cache_max_mb * 2**20)


def evict(target: float = 0.9) -> int:
    """If the directory holds more than ``LAZYRT_CACHE_MAX_MB``, delete the least recently
    used entries down to ``target`` of it; returns how many were deleted. One process at a
    time: another that holds the lock is already doing it."""
    d = directory()
    if d is None:
        return 0
    with open(os.path.join(d, ".evict.lock"), "a") as lf:
        if fcntl is not None:
            try:
                fcntl.flock(lf, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return 0
        entries, total = [], 0
        now = time.time()
        for e in os.scandir(d):
            try:
                st = e.stat()
            except OSError:
                continue
            if e.name.startswith(_TMP_PREFIX):
                if now - st.st_mtime > 3600:  # left by a process that died mid-write
                    with contextlib.suppress(OSError):
                        os.unlink(e.path)
                continue
            if e.name.endswith(_SUFFIX):
                entries.append((st.st_mtime, st.st_size, e.path))
                total += st.st_size
        limit = max_bytes()
        if total <= limit:
            return 0
        n = 0
        for _, size, path in sorted(entries):
            if total <= target * limit:
                break
            with contextlib.suppress(OSError):
                os.unlink(path)
                total -= size
                n += 1
        COUNTERS["disk_cache_evictions"] += n
        return n

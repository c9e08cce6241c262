"""Device-memory (HBM) accounting.

One choke point: every ``jax.Array`` lazyrt materializes for a ``tpu`` tensor
goes through ``track``; a weak reference uncounts it when the last holder lets
it go. For every computation (a strict op or a defer flush) the executor calls
``record_execution`` (or, for an unlogged strict op, ``note_peak``) with XLA's own
memory analysis of the compiled executable; the HBM peak of that computation is

    live bytes before it + what it allocates beyond its arguments (outputs + temps - aliased)

(its arguments are live arrays already, each buffer counted once however often it is
passed: ``MemoryAnalysis.extra_bytes``), and the running maximum is the process peak.
Strict and defer use the same accounting, so their peaks compare fairly.

What is exact, and when: live bytes at every moment (``track`` on materialization, a
weakref callback on release); the process peak whenever it is read (every computation
is folded in as it runs: one addition and a compare per strict op); the per-computation
log (defer flushes always, strict ops when ``LOG_STRICT`` is on).
"""
from __future__ import annotations

import dataclasses
import sys
import threading
import time
import weakref

import jax

from . import source as _source
from .metrics import COUNTERS


class _Tracked(weakref.ref):
    """A weak reference to a tracked array, with its id and bytes (one shared callback,
    ``_release``, rather than a closure per array: tracking is on every op's path)."""

    __slots__ = ("key", "nbytes")


_live: dict[int, _Tracked] = {}  # id(array) -> its _Tracked
# NOTE: threads. The live-byte count is kept exact without a lock on the hot path: an entry of
# ``_live`` is added (``track``: ``setdefault``) and removed (``_release``, ``untrack``,
# ``_purge_deleted``: ``pop``) by single dict operations, only the one that added it adds its
# bytes and only the one that removed it subtracts them; each counter update (``_state[k] +=
# n``, ``-=``, a compare and a store) is a run of bytecodes with no call in it, which CPython
# (3.11-3.13, with the GIL) never interleaves with another thread or with a weakref callback.
# Taking a lock instead cost ~0.5 us per op (two lock round trips: track and release). Without
# the GIL (a free-threaded build) every one of these functions runs under ``_LOCK``
# (``_locked``, at the end of this block).
_LOCK = threading.RLock()
_state = {"live": 0, "peak": 0, "peak_where": "", "peak_index": -1, "live_peak": 0}
# Counters already attributed to a logged execution (strict mode learns its
# compiles from them; see record_execution).
LIVE_WHERE = "live tensors (between computations)"
_log: list[FlushRecord] = []
_listeners: list = []
LOG_LIMIT = 100_000
# Log every strict-mode execution too (the memory profiler turns this on).
LOG_STRICT = [False]
_T0 = time.perf_counter()
# While a torch profiler records with ``profile_memory=True`` (``_exec.profile``): a list
# that gets ``(unix ns, bytes allocated (+) or released (-), live bytes after, address)``
# for every counted allocation and release; None otherwise (one global read per array).
EVENTS: list | None = None


def _observe(live: int) -> None:
    """``live`` bytes were resident at once: fold them into the peaks."""
    if live > _state["live_peak"]:
        _state["live_peak"] = live
    if live > _state["peak"]:
        _state["peak"] = live
        _state["peak_where"] = f"{LIVE_WHERE}, until {_source.user_line(3)}"
        _state["peak_index"] = _log_index[0] - 1


def _release(ref: _Tracked) -> None:
    """The array of ``ref`` is garbage (its weakref callback)."""
    # NOTE: the entry is this ref's unless ``untrack``/``_purge_deleted`` took it (then
    # they uncounted it); no other array can have this id while this one is not freed.
    if _live.pop(ref.key, None) is ref:
        live = _state["live"]
        # NOTE: live bytes peak just before they drop; observing here (and at each
        # computation and each read) rather than in ``track`` keeps a flush's outputs,
        # tracked while its donated inputs are not yet uncounted, from double-counting.
        if live > _state["peak"] or live > _state["live_peak"]:
            _observe(live)
        _state["live"] -= ref.nbytes
        if EVENTS is not None:
            EVENTS.append((time.time_ns(), -ref.nbytes, _state["live"], ref.key))


def _purge_deleted() -> int:
    """Uncount tracked arrays that XLA has deleted (donated inputs); returns their bytes."""
    freed = 0
    for key, ref in list(_live.items()):
        a = ref()
        if a is not None and a.is_deleted() and _live.pop(key, None) is ref:
            # The weakref callback pops nothing later: the entry is gone.
            freed += ref.nbytes
            if EVENTS is not None:
                EVENTS.append((time.time_ns(), -ref.nbytes, _state["live"] - freed, key))
    _state["live"] -= freed
    return freed


def track_outputs(arrays, nbytes) -> None:
    """Count the fresh outputs of a computation (``nbytes``: their sizes, known from the
    program), as ``track`` does each."""
    for a, nb in zip(arrays, nbytes):
        ref = _Tracked(a, _release)
        ref.key = key = id(a)
        ref.nbytes = nb
        if _live.setdefault(key, ref) is ref:  # (an array tracked already is counted)
            _state["live"] += nb
            if EVENTS is not None:
                EVENTS.append((time.time_ns(), nb, _state["live"], key))


def count_run(arrays, nbytes, live_before: int, extra_bytes: int, where: str) -> None:
    """An unlogged computation (a strict op) ran: count its fresh outputs (as
    ``track_outputs``) and fold its peak (``computation_peak``) into the process peak."""
    track_outputs(arrays, nbytes)
    peak = live_before + extra_bytes
    if peak > _state["peak"]:
        _state["peak"] = peak
        _state["peak_where"] = where


def track(arr, nbytes: int | None = None) -> None:
    """Count a materialized device array until it is garbage (``nbytes`` if the caller
    knows it: ``jax.Array.nbytes`` costs microseconds, which add up over a flush's outputs)."""
    key = id(arr)
    if key in _live:
        return
    if nbytes is None:
        nbytes = arr.nbytes
    try:
        ref = _Tracked(arr, _release)
    except TypeError:  # not weak-referenceable (a Python scalar); nothing to count
        return
    ref.key = key
    ref.nbytes = nbytes
    if _live.setdefault(key, ref) is ref:
        _state["live"] += nbytes
        if EVENTS is not None:
            EVENTS.append((time.time_ns(), nbytes, _state["live"], key))


def untrack(arrays) -> int:
    """Uncount ``arrays`` now (donated inputs an executable consumed); returns the bytes."""
    freed = 0
    for a in arrays:
        key = id(a)
        e = _live.get(key)
        if e is not None and _live.pop(key, None) is e:
            freed += e.nbytes
            if EVENTS is not None:
                EVENTS.append((time.time_ns(), -e.nbytes, _state["live"] - freed, key))
    _state["live"] -= freed
    _state["untracked"] = True
    return freed


def _locked(f):
    def locked(*args):
        with _LOCK:
            return f(*args)
    locked.__doc__ = f.__doc__
    return locked


if not getattr(sys, "_is_gil_enabled", lambda: True)():
    _release = _locked(_release)
    _purge_deleted = _locked(_purge_deleted)
    track_outputs = _locked(track_outputs)
    count_run = _locked(count_run)
    track = _locked(track)
    untrack = _locked(untrack)


def live_bytes() -> int:
    return _state["live"]


def live_arrays() -> list:
    """Every tracked array still alive and not donated away: the values tpu tensors hold
    (``lazyrt.sync`` waits for them)."""
    with _LOCK:
        refs = list(_live.values())
    out = []
    for ref in refs:
        a = ref()
        if a is not None and not a.is_deleted():
            out.append(a)
    return out


@dataclasses.dataclass
class MemoryAnalysis:
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    peak_bytes: int
    generated_code_bytes: int = 0
    # what running it allocates beyond its arguments (which are live already)
    extra_bytes: int = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        self.extra_bytes = max(self.peak_bytes - self.argument_bytes, 0)

    @classmethod
    def of(cls, compiled) -> MemoryAnalysis:
        try:
            m = compiled.memory_analysis()
        except Exception:
            m = None
        if m is None:
            return cls(0, 0, 0, 0, 0)
        arg = int(getattr(m, "argument_size_in_bytes", 0))
        out = int(getattr(m, "output_size_in_bytes", 0))
        tmp = int(getattr(m, "temp_size_in_bytes", 0))
        alias = int(getattr(m, "alias_size_in_bytes", 0))
        peak = getattr(m, "peak_memory_in_bytes", None)
        if not peak:
            # NOTE: XLA:CPU does not report a peak; arguments, outputs and temps
            # can all be live at once, minus outputs that reuse donated inputs.
            peak = arg + out + tmp - alias
        return cls(arg, out, tmp, alias, int(peak),
                   int(getattr(m, "generated_code_size_in_bytes", 0)))


@dataclasses.dataclass
class FlushRecord:
    index: int
    mode: str
    trace_hash: str
    num_ops: int
    cache_hit: bool
    compile_seconds: float
    execute_seconds: float
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    live_bytes_before: int
    live_bytes_after: int
    hbm_peak_bytes: int
    source: str
    largest_tensors: list
    start_seconds: float
    name: str = ""

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


_log_index = [0]  # index of the next logged execution (FlushRecord.index)


def computation_peak(live_before: int, analysis: MemoryAnalysis) -> int:
    """THE peak rule of one computation: the live bytes before it (its arguments among
    them) + what it allocates beyond its arguments."""
    return live_before + analysis.extra_bytes


def note_peak(peak: int, where: str) -> None:
    """An unlogged computation (a strict op) peaked at ``peak`` bytes (``computation_peak``),
    more than the process peak so far: it is the new peak. The caller compares first (an
    addition and a compare on every strict op)."""
    if peak > _state["peak"]:
        _state["peak"] = peak
        _state["peak_where"] = where


def record_execution(*, mode: str, name: str, trace_hash: str, num_ops: int, cache_hit: bool,
                     compile_seconds: float, execute_seconds: float, analysis: MemoryAnalysis,
                     live_before: int, source: str = "",
                     largest: list | None = None, log: bool = True, t_start: float = 0.0) -> int:
    """Account one computation; returns its HBM peak in bytes.

    Call it after the computation's outputs are tracked. Inputs XLA deleted
    (donated) are uncounted here, so live bytes never hold a donated input and the
    output that reuses its buffer at once.
    """
    _observe(live_before)
    if analysis.alias_bytes and not _state.pop("untracked", False):
        # Donated inputs: deleted by XLA but maybe still referenced (by the trace).
        # NOTE: a scan of every tracked array; an executor that calls ``untrack``
        # on the arrays it donated (before this call) skips it.
        _purge_deleted()
    _state.pop("untracked", None)
    peak = computation_peak(live_before, analysis)
    idx = _log_index[0]
    _log_index[0] = idx + 1
    if log and not source:
        source = _source.user_line(2)
    st = _state
    # NOTE: an unlogged computation (``note_peak``) names itself ("where" = its op
    # name); a tie with it takes this call's source line.
    where = st["peak_where"]
    if peak > st["peak"] or (peak == st["peak"] and (where in (name, "")
                                                     or where.startswith(LIVE_WHERE))):
        st["peak"] = peak
        st["peak_where"] = source or name
        st["peak_index"] = idx
    _observe(st["live"])
    if log and len(_log) < LOG_LIMIT:
        rec = FlushRecord(
            index=idx, mode=mode, trace_hash=trace_hash, num_ops=num_ops, cache_hit=cache_hit,
            compile_seconds=compile_seconds, execute_seconds=execute_seconds,
            argument_bytes=analysis.argument_bytes, output_bytes=analysis.output_bytes,
            temp_bytes=analysis.temp_bytes, alias_bytes=analysis.alias_bytes,
            live_bytes_before=live_before, live_bytes_after=_state["live"], hbm_peak_bytes=peak,
            source=source, largest_tensors=largest or [],
            start_seconds=(t_start or time.perf_counter()) - _T0, name=name,
        )
        _log.append(rec)
        for cb in _listeners:
            cb(rec)
    return peak


def flush_log() -> list[FlushRecord]:
    """Every recorded flush (defer) or logged execution, oldest first."""
    return list(_log)


def clear_log() -> None:
    _log.clear()


def add_listener(cb) -> None:
    _listeners.append(cb)


def max_memory_allocated() -> int:
    _observe(_state["live"])
    return _state["peak"]


def reset_peak_memory_stats() -> None:
    _state["peak"] = _state["live"]
    _state["live_peak"] = _state["live"]
    _state["peak_where"] = ""
    _state["peak_index"] = -1


def peak_info() -> dict:
    _observe(_state["live"])
    return {"peak_bytes": _state["peak"], "where": _state["peak_where"], "index": _state["peak_index"]}


def device_stats() -> dict | None:
    """The device's own memory stats where JAX exposes them (GPU/TPU); None on CPU."""
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:
        return None
    return dict(stats) if stats else None


def device_memory_info() -> tuple[int, int] | None:
    """(free, total) bytes of the device as its runtime reports them (GPU/TPU: ``bytes_limit``
    minus ``bytes_in_use``, every array counted, not only lazyrt's); None where JAX reports
    no limit (the CPU platform)."""
    stats = device_stats() or {}
    total = int(stats.get("bytes_limit", 0) or 0)
    if total <= 0:
        return None
    return max(0, total - int(stats.get("bytes_in_use", 0) or 0)), total


def memory_stats() -> dict:
    """Counters in the style of ``torch.cuda.memory_stats()``."""
    _observe(_state["live"])
    out = {
        "allocated_bytes.all.current": _state["live"],
        "allocated_bytes.all.peak": _state["peak"],
        "live_bytes.all.peak": _state["live_peak"],
        "active_bytes.all.current": _state["live"],
        "active_bytes.all.peak": _state["live_peak"],
        # no caching allocator in front of XLA's: what is reserved is what is allocated
        "reserved_bytes.all.current": _state["live"],
        "reserved_bytes.all.peak": _state["peak"],
        "allocation.all.current": len(_live),
        "num_tracked_arrays": len(_live),
        "num_executions": int(COUNTERS["executions"]),
        "num_flushes": int(COUNTERS["flushes"]),
        "num_logged_flushes": len(_log),
        "num_compiles": int(COUNTERS["cache_misses"]),
        "compile_seconds": float(COUNTERS["compile_seconds"]),
        "execute_seconds": float(COUNTERS["execute_seconds"]),
    }
    dev = device_stats()
    if dev:
        for k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit"):
            if k in dev:
                out[f"device.{k}"] = dev[k]
    return out


def fmt_bytes(n) -> str:
    """``1536`` -> ``"1.5 KiB"`` (``None`` -> ``"-"``): the one byte formatter."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def memory_summary() -> str:
    s = memory_stats()
    lines = [
        "lazyrt memory summary",
        f"  allocated (live tpu tensors): {fmt_bytes(s['allocated_bytes.all.current'])}",
        f"  peak (HBM, incl. computation temporaries): {fmt_bytes(s['allocated_bytes.all.peak'])}",
        f"  peak where: {_state['peak_where'] or '-'}",
        f"  live peak (tensors only): {fmt_bytes(s['active_bytes.all.peak'])}",
        f"  live arrays: {s['allocation.all.current']}",
        (f"  computations run: {s['num_executions']} ({s['num_flushes']} defer flushes, "
         f"{s['num_compiles']} compiles)"),
    ]
    dev = device_stats()
    if dev:
        lines.append(f"  device bytes_in_use: {fmt_bytes(dev.get('bytes_in_use', 0))}, "
                     f"peak_bytes_in_use: {fmt_bytes(dev.get('peak_bytes_in_use', 0))}")
    else:
        lines.append(f"  device stats: none on the {jax.default_backend()} backend; "
                     "only lazyrt's accounting exists")
    return "\n".join(lines)

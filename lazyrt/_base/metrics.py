"""Counters: ``lazyrt._base.metrics.counters()``, ``reset()``, ``report()``.

The hot path increments plain dict entries (``COUNTERS[name] += 1``); nothing
here is computed per op. An observer: this module imports nothing of lazyrt's.
Values that are state rather than counts (``pending_ops``) are gauges: a module
registers a function that reads them, called only when a snapshot is taken.
"""
from __future__ import annotations

import collections

_ZERO = {
    "ops_dispatched": 0,
    "ops_recorded": 0,
    "executions": 0,
    "flushes": 0,
    "cache_hits": 0,
    "cache_misses": 0,
    "hash_collisions": 0,
    "compile_seconds": 0.0,
    "execute_seconds": 0.0,
    "transfers_to_device": 0,
    "transfers_to_host": 0,
    "cpu_fallbacks": 0,
    "pending_ops": 0,
    "max_trace_ops": 0,
    "window_flushes": 0,  # segments launched by LAZYRT_FUSION_WINDOW
    "window_cut_failures": 0,  # segments that failed (recording went on in the same trace)
    "wait_seconds": 0.0,  # host time blocked on device results (reads, lazyrt.sync)
    "decompositions": 0,
    "compiled_modules": 0,  # graphs Dynamo handed the tpu backend
    "compiled_graphs": 0,  # AOT forward/backward/inference graphs made into programs
    "compiled_calls": 0,  # calls of those graphs
    "compiled_eager_calls": 0,  # calls run eagerly (a graph lazyrt cannot lower whole)
    "pallas_attention_calls": 0,
    "pallas_matmul_calls": 0,
    "pallas_fallbacks": 0,
    "paged_attention_calls": 0,  # transformers' attention layer calls run by lazyrt::paged_attention
    "lean_eqns_removed": 0,
    "lean_fallbacks": 0,
    # the persistent compile cache (``_exec.diskcache``): programs loaded instead of
    # compiled (each also a cache miss: not in this process's memory), entries written,
    # damaged entries dropped, entries evicted by its size bound, executables that cannot
    # be stored (compiled again by the next process)
    "disk_cache_hits": 0,
    "disk_cache_writes": 0,
    "disk_cache_damaged": 0,
    "disk_cache_evictions": 0,
    "disk_cache_unstorable": 0,
    # executables found by their signature (no tracing: ``_exec.diskcache.signature_key``)
    # and signed entries refused because their arguments differ from the program's
    "disk_cache_signed_hits": 0,
    "disk_cache_mismatches": 0,
    "disk_cache_plan_hits": 0,
    # plans whose output specs an earlier process's meta kernel gave (no meta kernel run)
    "disk_cache_meta_hits": 0,
    # tiered compiles (``_exec.tiers``): optimized executables swapped in, the seconds the
    # worker spent building them, builds that failed, were skipped at exit or not queued
    "tier_swaps": 0,
    "tier_compile_seconds": 0.0,
    "tier_failures": 0,
    "tier_skipped": 0,
    "tier_dropped": 0,
    # constants made on the host instead of by a compiled program (``_exec.consts``)
    "host_constants": 0,
    # programs run on the host on their first calls (CPU platform, ``_exec.consts``)
    "host_runs": 0,
    "flat_draws": 0,
    # defer flushes of a new trace run op by op (CPU platform, ``_exec.coldflush``)
    "cold_flushes": 0,
    # explicit transfers of runtime scalars (``_exec.scalars``): one per strict op whose
    # scalars held a value not on the device yet, one per flush whose scalars changed
    "scalar_transfers": 0,
}

COUNTERS: dict[str, float] = dict(_ZERO)
FALLBACK_OPS: collections.Counter = collections.Counter()
# Programs compiled (cache misses) per op family: a strict program's name (the op's
# packet, ``view``, ``write_through_view``), ``flush`` for a defer flush.
COMPILES_BY_OP: collections.Counter = collections.Counter()
_GAUGES: dict = {}


def register_gauge(name: str, read) -> None:
    """``read()`` gives counter ``name``'s current value in every snapshot."""
    _GAUGES[name] = read


def counters() -> dict:
    """A snapshot of every counter, plus ``cpu_fallback_ops`` (op name -> count) and
    ``compiles_by_op`` (op family -> programs compiled)."""
    out = dict(COUNTERS)
    for name, read in _GAUGES.items():
        out[name] = read()
    out["cpu_fallback_ops"] = dict(FALLBACK_OPS)
    out["compiles_by_op"] = dict(COMPILES_BY_OP)
    return out


def reset() -> None:
    """Zero every counter (the compile caches are kept)."""
    COUNTERS.update(_ZERO)
    FALLBACK_OPS.clear()
    COMPILES_BY_OP.clear()


def report() -> str:
    """The counters as readable text. ``cache_misses`` counts programs that were not in
    this process's memory; the report splits them into those compiled and those loaded
    from the persistent compile cache (``disk_cache_hits``)."""
    c = counters()
    lines = ["lazyrt metrics"]
    width = max(len(k) for k in c)
    for k, v in c.items():
        if k in ("cpu_fallback_ops", "compiles_by_op"):
            continue
        if isinstance(v, float):
            lines.append(f"  {k:<{width}}  {v:.4f}")
        else:
            lines.append(f"  {k:<{width}}  {v}")
    hits, misses = c["cache_hits"], c["cache_misses"]
    if hits + misses:
        lines.append(f"  {'cache_hit_rate':<{width}}  {hits / (hits + misses):.1%}")
    if misses:
        # NOTE: a miss is a program not in this process's memory; the disk cache may
        # still have it. Split them, so a warm second run does not read as compiling.
        loaded = min(c["disk_cache_hits"], misses)
        lines.append(f"  {'cache_misses_compiled':<{width}}  {misses - loaded}")
        lines.append(f"  {'cache_misses_loaded':<{width}}  {loaded}  (from the disk cache)")
    if c["compiles_by_op"]:
        lines.append("  programs compiled by op:")
        for name, n in sorted(c["compiles_by_op"].items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"    {name}: {n}")
    if c["cpu_fallback_ops"]:
        lines.append("  cpu fallbacks by op:")
        for name, n in sorted(c["cpu_fallback_ops"].items()):
            lines.append(f"    {name}: {n}")
    return "\n".join(lines)

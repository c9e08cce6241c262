"""Device-memory (HBM) accounting: the public side (``lazyrt.memory``).

The accounting itself is ``lazyrt._base.memory`` (one choke point every materialized
buffer passes through); this module re-exports what users read.
"""
from ._base.memory import (
    FlushRecord,
    MemoryAnalysis,
    add_listener,
    clear_log,
    device_memory_info,
    device_stats,
    flush_log,
    live_arrays,
    live_bytes,
    max_memory_allocated,
    memory_stats,
    memory_summary,
    peak_info,
    reset_peak_memory_stats,
)
from ._torch.tpu_module import mem_get_info

__all__ = [
    "FlushRecord", "MemoryAnalysis", "add_listener", "clear_log", "device_memory_info",
    "device_stats", "flush_log", "live_arrays", "live_bytes", "max_memory_allocated",
    "mem_get_info", "memory_stats", "memory_summary", "peak_info", "reset_peak_memory_stats",
]

"""Counters: ``lazyrt.metrics.counters()``, ``reset()``, ``report()``.

The counters live in ``lazyrt._base.metrics`` (every stage increments them); this module
re-exports what users read.
"""
from ._base.metrics import COUNTERS, counters, report, reset

__all__ = ["COUNTERS", "counters", "report", "reset"]

"""Helpers of the ``lazyrt-mem`` CLI (``lazyrt.mem``): report text and file exports."""

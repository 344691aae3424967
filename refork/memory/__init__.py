"""Where memory is measured and shared: heap preparation before fork, /proc accounting, allocators."""

from refork.memory.accounting import ProcessMemory, format_bytes, read_memory, read_rss
from refork.memory.heap import (
    HeapReport,
    after_fork_in_child,
    disable_gc_early,
    immortalize_support,
    prepare_heap_for_fork,
)

__all__ = [
    "HeapReport",
    "ProcessMemory",
    "after_fork_in_child",
    "disable_gc_early",
    "format_bytes",
    "immortalize_support",
    "prepare_heap_for_fork",
    "read_memory",
    "read_rss",
]

"""memviz.sim: an exact pure-Python replica of PyTorch's CUDA caching allocator (native backend).

No torch needed::

    >>> from memviz.sim import CachingAllocator
    >>> a = CachingAllocator(80 << 30, alloc_conf="expandable_segments:True")
    >>> p = a.malloc(6 << 20)
    >>> a.memory_stats()["reserved_bytes.all.current"]
    20971520
"""

from .allocator import CachingAllocator, format_size
from .config import AllocatorConfig, parse_alloc_conf
from .errors import AllocatorConfigError, InvalidFreeError, OutOfMemoryError

__all__ = [
    "AllocatorConfig",
    "AllocatorConfigError",
    "CachingAllocator",
    "InvalidFreeError",
    "OutOfMemoryError",
    "format_size",
    "parse_alloc_conf",
]

"""memviz.sim: an exact pure-Python replica of PyTorch's CUDA caching allocator (native backend).

No torch needed::

    >>> from memviz.sim import CachingAllocator
    >>> a = CachingAllocator(80 << 30, alloc_conf="expandable_segments:True")
    >>> p = a.malloc(6 << 20)
    >>> a.memory_stats()["reserved_bytes.all.current"]
    20971520

The public API, stable for the tools built on it (what-if replays, OOM explanations, the predictor):

- :class:`CachingAllocator`: ``malloc``, ``free``, ``empty_cache``, ``memory_stats``, ``snapshot``,
  ``segments``, ``memory_summary`` and the read-only queries (``memory_allocated``, ``round_size``, ...).
- streams and private pools: ``malloc(size, stream=...)``, ``record_stream``, ``synchronize``;
  :class:`MemPool` / :func:`use_mem_pool`, :class:`CUDAGraph` / :func:`graph` / :func:`graph_pool_handle`.
- :class:`Op` and :func:`replay`: run a workload's allocator calls through an allocator.
- :func:`fraction_for_cap`, :data:`MAX_DEVICE_BYTES`: the limits (:mod:`memviz.sim.limits`).
- :data:`CANDIDATE_CONFIGS`, :data:`RECORDED_CONFIGS`, :data:`WORKLOAD_CONFIGS`: the config lists.
- :func:`parse_alloc_conf` / :class:`AllocatorConfig`: ``PYTORCH_CUDA_ALLOC_CONF`` as torch reads it.
"""

from memviz.errors import AllocatorConfigError, InvalidFreeError, OutOfMemoryError

from .allocator import CachingAllocator, format_size
from .config import AllocatorConfig, parse_alloc_conf
from .graphs import CUDAGraph, MemPool, graph, graph_pool_handle, use_mem_pool
from .limits import MAX_DEVICE_BYTES, fraction_for_cap
from .presets import CANDIDATE_CONFIGS, RECORDED_CONFIGS, WORKLOAD_CONFIGS
from .replay import OP_KINDS, Op, ReplayOutcome, replay

__all__ = [
    "CANDIDATE_CONFIGS",
    "MAX_DEVICE_BYTES",
    "OP_KINDS",
    "RECORDED_CONFIGS",
    "WORKLOAD_CONFIGS",
    "AllocatorConfig",
    "AllocatorConfigError",
    "CUDAGraph",
    "CachingAllocator",
    "InvalidFreeError",
    "MemPool",
    "Op",
    "OutOfMemoryError",
    "ReplayOutcome",
    "format_size",
    "fraction_for_cap",
    "graph",
    "graph_pool_handle",
    "parse_alloc_conf",
    "replay",
    "use_mem_pool",
]

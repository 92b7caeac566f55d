"""What the keys of ``torch.cuda.memory_stats()`` mean, in the words the lessons use.

A key is ``FAMILY.POOL.METRIC`` (e.g. ``reserved_bytes.all.current``) or a bare counter
(``num_alloc_retries``). POOL is ``all``, ``large_pool`` or ``small_pool`` (blocks of at most 1 MiB);
METRIC is ``current``, ``peak``, ``allocated`` (total ever added) or ``freed`` (total ever removed).
There is no ``cached_bytes``: "cached" memory is ``reserved_bytes`` (``torch.cuda.memory_reserved()``).
"""

from __future__ import annotations

from collections.abc import Mapping

from memviz.units import format_bytes

__all__ = ["COUNTERS", "FAMILIES", "POOLS", "explain_key", "stats_table"]

POOLS = ("all", "large_pool", "small_pool")

FAMILIES: dict[str, str] = {
    "allocated_bytes": "bytes in blocks that hold live tensors, after rounding (memory_allocated())",
    "reserved_bytes": "bytes the cache holds from the driver: cudaMalloc'd segments (memory_reserved(), "
    "the 'cached' memory)",
    "active_bytes": "bytes in active blocks: allocated, or freed but waiting on another stream",
    "requested_bytes": "bytes the tensors asked for, before rounding",
    "inactive_split_bytes": "free bytes stranded in segments that still hold live blocks: empty_cache() "
    "cannot release them",
    "allocation": "number of allocated blocks",
    "segment": "number of segments (cudaMalloc calls still held)",
    "active": "number of active blocks",
    "inactive_split": "number of free blocks stranded beside live ones",
    "oversize_allocations": "allocations of at least max_split_size (never split)",
    "oversize_segments": "segments of at least max_split_size",
}
"""Each stat family: what it counts."""

COUNTERS: dict[str, str] = {
    "num_alloc_retries": "mallocs that released the whole cache and retried (the step before an OOM)",
    "num_ooms": "out-of-memory errors raised",
    "num_device_alloc": "cudaMalloc calls (or page maps with expandable segments)",
    "num_device_free": "cudaFree calls (or page unmaps)",
    "num_sync_all_streams": "full synchronizations: each empty_cache() and each release-and-retry",
    "max_split_size": "the max_split_size_mb setting in bytes when CUDA started; -1 means unlimited",
    "num_oom_rejections": "allocations rejected before cudaMalloc (throw_on_cudamalloc_oom, torch 2.12+)",
}
"""The scalar counters."""


def explain_key(key: str) -> str:
    """One line on what ``key`` means, e.g. ``explain_key("reserved_bytes.small_pool.peak")``.

    Raises:
        KeyError: a key torch does not have (``cached_bytes`` among them).
    """
    if key in COUNTERS:
        return COUNTERS[key]
    family, _, rest = key.partition(".")
    if family not in FAMILIES:
        hint = " — 'cached' memory is reserved_bytes" if "cache" in key else ""
        raise KeyError(f"{key!r} is not a memory_stats() key{hint}")
    if family.startswith("oversize"):
        metric, pool = rest, "all"
    else:
        pool, _, metric = rest.partition(".")
    where = {"all": "", "large_pool": " (large pool)", "small_pool": " (small pool: blocks <= 1 MiB)"}[pool]
    how = {"current": "now", "peak": "highest since the last reset", "allocated": "total ever added",
           "freed": "total ever removed"}[metric]  # fmt: skip
    return f"{FAMILIES[family]}{where}; {how}"


def stats_table(stats: Mapping[str, int], families: tuple[str, ...] = tuple(FAMILIES)[:5]) -> str:
    """A small table of ``current`` and ``peak`` per family and pool (bytes shown with units)."""
    lines = [f"{'':<22}{'pool':<12}{'current':>14}{'peak':>14}"]
    for family in families:
        for pool in POOLS:
            cur = stats.get(f"{family}.{pool}.current", 0)
            peak = stats.get(f"{family}.{pool}.peak", 0)
            show = format_bytes if family.endswith("bytes") else str
            lines.append(f"{family if pool == 'all' else '':<22}{pool:<12}{show(cur):>14}{show(peak):>14}")
    return "\n".join(lines)

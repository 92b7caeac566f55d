"""Allocator statistics: torch's ``Stat`` record and the flat ``memory_stats()`` dict.

A stat is a 4-item list ``[current, peak, allocated, freed]`` (``c10::CachingDeviceAllocator::Stat``):

- ``increase_stat(stat, n)``: current += n; peak = max(peak, current); allocated += n.
- ``decrease_stat(stat, n)``: current -= n; freed += n (peak unchanged).

A ``StatArray`` is three stats indexed by :data:`AGGREGATE`, :data:`SMALL_POOL`, :data:`LARGE_POOL`.
The allocator's hot paths inline these two functions (same arithmetic, no call).

Key grammar of ``memory_stats()`` (torch/cuda/memory.py):
``"{family}.{all,large_pool,small_pool}.{allocated,current,freed,peak}"`` for the StatArray families
below, ``"oversize_{allocations,segments}.{allocated,current,freed,peak}"``, and six scalars.
"""

from __future__ import annotations

__all__ = [
    "AGGREGATE",
    "ARRAY_FAMILIES",
    "LARGE_POOL",
    "SCALARS",
    "SMALL_POOL",
    "DeviceStats",
    "decrease_stat",
    "increase_stat",
    "stat_keys",
]

CURRENT, PEAK, ALLOCATED, FREED = 0, 1, 2, 3
AGGREGATE, SMALL_POOL, LARGE_POOL = 0, 1, 2  # StatType::AGGREGATE, SMALL_POOL, LARGE_POOL

# StatArray families: COUNT = number of blocks/segments, SUM = bytes.
ARRAY_FAMILIES = (
    "active",  # COUNT: allocated or pending-free blocks (equal to allocation here: no cross-stream frees)
    "active_bytes",  # SUM: bytes of active blocks
    "allocated_bytes",  # SUM: bytes of allocated blocks (rounded sizes)
    "allocation",  # COUNT: allocated blocks
    "inactive_split",  # COUNT: free blocks that share a segment with other blocks (non-releasable)
    "inactive_split_bytes",  # SUM: bytes of those blocks
    "requested_bytes",  # SUM: bytes the callers asked for (unrounded)
    "reserved_bytes",  # SUM: bytes of all segments (cudaMalloc / mapped pages)
    "segment",  # COUNT: segments (cudaMalloc calls still alive)
)
OVERSIZE_FAMILIES = ("oversize_allocations", "oversize_segments")  # COUNT: blocks/segments >= max_split_size
SCALARS = ("max_split_size", "num_alloc_retries", "num_device_alloc", "num_device_free", "num_ooms",
           "num_sync_all_streams")


def increase_stat(stat: list[int], amount: int) -> None:
    """Add ``amount`` to ``stat``: current, allocated and (if exceeded) peak move."""
    c = stat[0] + amount
    stat[0] = c
    if c > stat[1]:
        stat[1] = c
    stat[2] += amount


def decrease_stat(stat: list[int], amount: int) -> None:
    """Subtract ``amount`` from ``stat``: current drops, freed grows, peak stays."""
    stat[0] -= amount
    stat[3] += amount


def _new_array() -> tuple[list[int], list[int], list[int]]:
    return ([0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0])


class DeviceStats:
    """All counters of one device (``DeviceStats`` in CachingDeviceAllocator.h).

    ``active`` and ``active_bytes`` are not stored: without ``record_stream`` a block stops being
    active in the same call that frees it, so they always equal ``allocation`` / ``allocated_bytes``.
    """

    __slots__ = ("allocated_bytes", "allocation", "inactive_split", "inactive_split_bytes", "max_split_size",
                 "num_alloc_retries", "num_device_alloc", "num_device_free", "num_ooms",
                 "num_sync_all_streams", "oversize_allocations", "oversize_segments", "requested_bytes",
                 "reserved_bytes", "segment")

    def __init__(self, max_split_size: int) -> None:
        self.allocation = _new_array()
        self.allocated_bytes = _new_array()
        self.inactive_split = _new_array()
        self.inactive_split_bytes = _new_array()
        self.requested_bytes = _new_array()
        self.reserved_bytes = _new_array()
        self.segment = _new_array()
        self.oversize_allocations = [0, 0, 0, 0]
        self.oversize_segments = [0, 0, 0, 0]
        # Fixed at construction; SIZE_MAX (unlimited) reads back as -1 (cast to int64).
        self.max_split_size = max_split_size if max_split_size < (1 << 63) else -1
        self.num_alloc_retries = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self.num_ooms = 0
        self.num_sync_all_streams = 0

    def _all_stats(self) -> list[list[int]]:
        stats = [s for name in ("allocation", "allocated_bytes", "inactive_split", "inactive_split_bytes",
                                "requested_bytes", "reserved_bytes", "segment")
                 for s in getattr(self, name)]
        return [*stats, self.oversize_allocations, self.oversize_segments]

    def reset_peak(self) -> None:
        """``resetPeakStats``: peak = current for every stat."""
        for s in self._all_stats():
            s[1] = s[0]

    def reset_accumulated(self) -> None:
        """``resetAccumulatedStats``: allocated = freed = 0 and the event counters to 0."""
        for s in self._all_stats():
            s[2] = s[3] = 0
        self.num_alloc_retries = self.num_device_alloc = self.num_device_free = 0
        self.num_ooms = self.num_sync_all_streams = 0

    def as_dict(self) -> dict[str, int]:
        """Return the flat, key-sorted dict that ``torch.cuda.memory_stats()`` returns (122 keys in 2.11)."""
        values: list[int] = []
        for arr in (self.allocation, self.allocated_bytes, self.allocated_bytes, self.allocation,
                    self.inactive_split, self.inactive_split_bytes):
            for t in (AGGREGATE, LARGE_POOL, SMALL_POOL):
                s = arr[t]
                values += (s[2], s[0], s[3], s[1])
        values += (self.max_split_size, self.num_alloc_retries, self.num_device_alloc, self.num_device_free,
                   self.num_ooms, self.num_sync_all_streams)
        for s in (self.oversize_allocations, self.oversize_segments):
            values += (s[2], s[0], s[3], s[1])
        for arr in (self.requested_bytes, self.reserved_bytes, self.segment):
            for t in (AGGREGATE, LARGE_POOL, SMALL_POOL):
                s = arr[t]
                values += (s[2], s[0], s[3], s[1])
        return dict(zip(_KEYS, values, strict=True))


def _sorted_keys() -> tuple[str, ...]:
    keys = []
    for name in ARRAY_FAMILIES[:6]:
        keys += [f"{name}.{t}.{f}" for t in ("all", "large_pool", "small_pool")
                 for f in ("allocated", "current", "freed", "peak")]
    keys += SCALARS
    keys += [f"{name}.{f}" for name in OVERSIZE_FAMILIES for f in ("allocated", "current", "freed", "peak")]
    for name in ARRAY_FAMILIES[6:]:
        keys += [f"{name}.{t}.{f}" for t in ("all", "large_pool", "small_pool")
                 for f in ("allocated", "current", "freed", "peak")]
    assert keys == sorted(keys) and len(keys) == 122
    return tuple(keys)


_KEYS = _sorted_keys()  # torch 2.11's 122 keys, in memory_stats() (sorted) order


def stat_keys() -> list[str]:
    """Return the 122 sorted keys of ``torch.cuda.memory_stats()`` in torch 2.9-2.11."""
    return list(_KEYS)

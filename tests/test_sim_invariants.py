"""``CachingAllocator._check()`` must fail on a corrupted allocator: each test breaks one thing on purpose.

A check that passes on every state proves nothing; these make sure each class of corruption is seen
(the stat counters, the peaks, the totals, the pools, the block links, the addresses).
"""

from __future__ import annotations

import pytest

from memviz.sim import CachingAllocator
from memviz.sim.stats import (
    AGGREGATE,
    ALLOCATED_BYTES,
    ALLOCATED_BYTES_PEAK,
    ALLOCATION_TOTAL,
    INACTIVE_SPLIT_BYTES,
    REQUESTED_BYTES_TOTAL,
    RESERVED_BYTES_PEAK,
)

MiB = 1 << 20


def _busy(conf: str = "") -> CachingAllocator:
    """An allocator with split segments, free holes, both pools and a released segment."""
    a = CachingAllocator(4 << 30, alloc_conf=conf)
    ptrs = [a.malloc(n) for n in (1000, 300_000, 3 * MiB, 7 * MiB, 30 * MiB, 5 * MiB)]
    a.free(ptrs[1])
    a.free(ptrs[3])
    a.free(a.malloc(64 * MiB))
    a.empty_cache()
    a._check()
    return a


def test_a_sound_allocator_passes() -> None:
    for conf in ("", "expandable_segments:True", "max_split_size_mb:20"):
        _busy(conf)._check()


@pytest.mark.parametrize("corrupt", [
    pytest.param(lambda a: a.stats.large.__setitem__(ALLOCATED_BYTES, a.stats.large[ALLOCATED_BYTES] + 512),
                 id="allocated current"),
    pytest.param(lambda a: a.stats.agg.__setitem__(ALLOCATED_BYTES_PEAK, a.memory_allocated()),
                 id="aggregate peak at its current, below the pools' peaks"),
    pytest.param(lambda a: a.stats.agg.__setitem__(RESERVED_BYTES_PEAK, a.stats.large[RESERVED_BYTES_PEAK] - 1),
                 id="aggregate reserved peak below the large pool's"),
    pytest.param(lambda a: a.stats.small.__setitem__(ALLOCATION_TOTAL, a.stats.small[ALLOCATION_TOTAL] + 1),
                 id="allocation total"),
    pytest.param(lambda a: a.stats.large.__setitem__(REQUESTED_BYTES_TOTAL, a.stats.large[REQUESTED_BYTES_TOTAL] + 7),
                 id="requested total"),
    pytest.param(lambda a: a.stats.large.__setitem__(INACTIVE_SPLIT_BYTES, a.stats.large[INACTIVE_SPLIT_BYTES] + 512),
                 id="inactive split bytes"),
    pytest.param(lambda a: setattr(a, "total_allocated_memory", a.total_allocated_memory + 2 * MiB),
                 id="total allocated memory"),
    pytest.param(lambda a: setattr(a.stats, "num_device_alloc", a.stats.num_device_alloc + 1), id="cudaMalloc count"),
    pytest.param(lambda a: a.large_blocks.keys.pop(), id="free block missing from its pool"),
    pytest.param(lambda a: setattr(next(a.iter_segments()).head, "size", next(a.iter_segments()).head.size + 512),
                 id="blocks do not tile"),
    pytest.param(lambda a: setattr(next(a.iter_segments()), "ptr", -(2 << 20)), id="negative address"),
])
def test_each_corruption_is_caught(corrupt) -> None:
    a = _busy()
    corrupt(a)
    with pytest.raises(AssertionError):
        a._check()


def test_totals_are_checked_against_the_trace_only_while_complete() -> None:
    a = _busy()
    a.reset_accumulated_memory_stats()  # the trace now holds more than the totals count
    a._check()
    assert a.stats.get("allocation", AGGREGATE)["allocated"] == 0

"""``fragmentation().releasable_bytes`` is exactly what ``empty_cache()`` releases, on fuzzed states.

The page and segment sizes come from the config (``large_segment_size_mb`` included), so every config
that changes them is fuzzed: random mallocs and frees on a small device, then one measurement against
the allocator's own ``empty_cache()``.
"""

from __future__ import annotations

import contextlib
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from memviz.fragmentation import fragmentation
from memviz.sim import CachingAllocator, OutOfMemoryError

MiB = 1 << 20
CONFIGS = [
    "",
    "expandable_segments:True",
    "expandable_segments:True,large_segment_size_mb:32",
    "expandable_segments:True,large_segment_size_mb:11",
    "large_segment_size_mb:48",
    "max_split_size_mb:40",
    "expandable_segments:True,roundup_power2_divisions:4,large_segment_size_mb:64",
]


def _fuzzed(conf: str, seed: int) -> CachingAllocator:
    rng = random.Random(seed)
    a = CachingAllocator(rng.choice([256, 1024]) * MiB, alloc_conf=conf)
    live: list[int] = []
    for _ in range(rng.randint(1, 120)):
        if rng.random() < 0.6 or not live:
            size = rng.choice([rng.randint(1, 4096), rng.randint(4096, 3 * MiB), rng.randint(3 * MiB, 70 * MiB)])
            with contextlib.suppress(OutOfMemoryError):
                live.append(a.malloc(size))
        else:
            a.free(live.pop(rng.randrange(len(live))))
    return a


@settings(max_examples=300, deadline=None)
@given(conf=st.sampled_from(CONFIGS), seed=st.integers(0, 2**32))
def test_releasable_bytes_are_what_empty_cache_releases(conf: str, seed: int) -> None:
    a = _fuzzed(conf, seed)
    from_snapshot = fragmentation(a.snapshot())  # the config read from allocator_settings
    from_segments = fragmentation(a.segments(), conf)
    before = a.memory_reserved()
    a.empty_cache()
    released = before - a.memory_reserved()
    assert from_snapshot.releasable_bytes == from_segments.releasable_bytes == released
    assert fragmentation(a.segments(), conf).releasable_bytes == 0  # nothing left to release


def test_the_issue_case_large_segment_32_mib() -> None:
    a = CachingAllocator(1 << 30, alloc_conf="expandable_segments:True,large_segment_size_mb:32")
    keep = a.malloc(3 * MiB)
    a.free(a.malloc(60 * MiB))
    want = fragmentation(a.segments(), a.config).releasable_bytes
    before = a.memory_reserved()
    a.empty_cache()
    assert want == before - a.memory_reserved() == 32 * MiB * 2 - 32 * MiB
    a.free(keep)

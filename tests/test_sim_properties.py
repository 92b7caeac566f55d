"""Property tests: long random op sequences with tiny capacities, ``_check()`` after every step.

``_check()`` verifies that blocks tile each segment exactly, that no two free blocks are adjacent in a
non-expandable segment, that each free block is in exactly one pool, that allocated <= reserved <=
allowed, and that every ``*.current`` stat equals what the snapshot implies.
"""

from __future__ import annotations

import contextlib
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from memviz.sim import CachingAllocator, OutOfMemoryError

MiB = 1 << 20
CONFIGS = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:40",
    "garbage_collection_threshold:0.5,max_split_size_mb:20",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:[1:2,4:8,>:4],max_non_split_rounding_mb:30",
    "expandable_segments:True,roundup_power2_divisions:[2:4,>:2]",
]
SIZES = st.one_of(st.integers(1, 4096), st.integers(4097, 2 * MiB), st.integers(2 * MiB, 24 * MiB),
                  st.integers(24 * MiB, 130 * MiB))


def _snapshot_totals(a: CachingAllocator) -> tuple[int, int]:
    segs = a.snapshot()["segments"]
    return sum(s["allocated_size"] for s in segs), sum(s["total_size"] for s in segs)


class AllocatorMachine(RuleBasedStateMachine):
    """Random malloc/free/empty_cache against a naive model of live rounded sizes."""

    blocks = Bundle("blocks")

    @initialize(conf=st.sampled_from(CONFIGS), capacity_mb=st.integers(40, 400),
                fraction=st.sampled_from([None, 0.5, 0.9]))
    def setup(self, conf: str, capacity_mb: int, fraction: float | None) -> None:
        self.a = CachingAllocator(capacity_mb * MiB, memory_fraction=fraction, alloc_conf=conf)
        self.live: dict[int, int] = {}

    @rule(target=blocks, size=SIZES)
    def malloc(self, size: int) -> int:
        try:
            p = self.a.malloc(size)
        except OutOfMemoryError as e:
            assert "CUDA out of memory. Tried to allocate" in str(e)
            return 0
        assert p not in self.live
        self.live[p] = self.a.block_size(p)
        return p

    @rule(p=consumes(blocks))
    def free(self, p: int) -> None:
        if p:
            self.a.free(p)
            del self.live[p]

    @rule()
    def empty_cache(self) -> None:
        self.a.empty_cache()

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "a"):
            return
        self.a._check()
        assert self.a.memory_allocated() == sum(self.live.values())
        allocated, reserved = _snapshot_totals(self.a)
        assert allocated == self.a.memory_allocated() and reserved == self.a.memory_reserved()


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(max_examples=25, stateful_step_count=60, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=len(CONFIGS) * 2, deadline=None)
@given(conf=st.sampled_from(CONFIGS), seed=st.integers(0, 2**32))
def test_long_random_sequences(conf: str, seed: int) -> None:
    """Seeded 1,500-op sequences with a tiny device to hit OOM, retry, release and gc paths; checked every step."""
    rng = random.Random(seed)
    a = CachingAllocator(rng.choice([64, 160, 512]) * MiB, memory_fraction=rng.choice([None, 0.6]),
                         alloc_conf=conf)
    live: list[int] = []
    for _ in range(1500):
        r = rng.random()
        if r < 0.55:
            size = rng.choice([rng.randint(1, 8192), rng.randint(8192, 3 * MiB),
                               rng.randint(3 * MiB, 40 * MiB)])
            with contextlib.suppress(OutOfMemoryError):
                live.append(a.malloc(size))
        elif r < 0.97 and live:
            a.free(live.pop(rng.randrange(len(live))))
        else:
            a.empty_cache()
        a._check()
    for p in live:
        a.free(p)
    a.empty_cache()
    a._check()
    assert a.memory_reserved() == 0 and a.snapshot()["segments"] == []

"""memviz.sim.stats: the flat counter layout reads back as torch's Stat fields.

``freed`` and the aggregate's current/allocated/freed are derived, not stored (see the stats module
docstring); these tests pin the derivation against a plain four-field model of torch's ``Stat``.
"""

import contextlib
import random

import pytest

from memviz.sim import CachingAllocator, OutOfMemoryError

MiB = 1 << 20
POOLS = ("all", "large_pool", "small_pool")
FAMILIES = ("active", "active_bytes", "allocated_bytes", "allocation", "inactive_split", "inactive_split_bytes",
            "requested_bytes", "reserved_bytes", "segment")


def _check_identities(s: dict[str, int]) -> None:
    for fam in FAMILIES:
        for field in ("current", "allocated", "freed"):
            all_ = s[f"{fam}.all.{field}"]
            assert all_ == s[f"{fam}.large_pool.{field}"] + s[f"{fam}.small_pool.{field}"], (fam, field)
        for pool in POOLS:
            assert s[f"{fam}.{pool}.peak"] >= s[f"{fam}.{pool}.current"] >= 0, (fam, pool)
            assert s[f"{fam}.{pool}.freed"] >= 0 and s[f"{fam}.{pool}.allocated"] >= 0, (fam, pool)
    for fam in ("oversize_allocations", "oversize_segments"):
        assert s[f"{fam}.peak"] >= s[f"{fam}.current"] >= 0 and s[f"{fam}.freed"] >= 0


@pytest.mark.parametrize("conf", ["", "max_split_size_mb:64", "expandable_segments:True"])
def test_random_ops_keep_torch_stat_identities(conf: str) -> None:
    rng = random.Random(7)
    a = CachingAllocator(4 << 30, alloc_conf=conf)
    live: list[int] = []
    before = a.memory_stats()
    for step in range(3000):
        r = rng.random()
        if r < 0.55 or not live:
            with contextlib.suppress(OutOfMemoryError):
                live.append(a.malloc(rng.choice([rng.randint(1, 1 * MiB), rng.randint(1, 200 * MiB)])))
        elif r < 0.98:
            a.free(live.pop(rng.randrange(len(live))))
        else:
            a.empty_cache()
        if step == 1500:
            pre = a.memory_stats()
            a.reset_accumulated_memory_stats()
            s = a.memory_stats()
            assert all(s[k] == 0 for k in s if k.endswith((".allocated", ".freed")))
            assert all(s[k] == pre[k] for k in s if k.endswith((".current", ".peak")))
        if step == 2000:
            a.reset_peak_memory_stats()
            s = a.memory_stats()
            assert all(s[k[:-len("peak")] + "current"] == s[k] for k in s if k.endswith(".peak"))
        s = a.memory_stats()
        _check_identities(s)
        # one op moves current by allocated - freed (a Stat's two updates), family by family
        for k in s:
            if k.endswith(".current") and step != 1500:
                stem = k[:-len("current")]
                assert s[k] - before[k] == (s[stem + "allocated"] - before[stem + "allocated"]) - (
                    s[stem + "freed"] - before[stem + "freed"]), k
        before = s
    a._check()


def test_free_after_reset_counts_freed_bytes_only() -> None:
    a = CachingAllocator(16 << 30)
    p = a.malloc(4 * MiB)
    a.reset_accumulated_memory_stats()
    a.free(p)
    s = a.memory_stats()
    assert (s["allocated_bytes.all.allocated"], s["allocated_bytes.all.freed"]) == (0, 4 * MiB)
    assert (s["allocation.large_pool.allocated"], s["allocation.large_pool.freed"]) == (0, 1)
    assert s["allocated_bytes.all.peak"] == 4 * MiB and s["allocated_bytes.all.current"] == 0
    assert a.max_memory_allocated() == 4 * MiB and a.memory_reserved() == 20 * MiB

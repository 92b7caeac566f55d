"""Where torch's own CUDACachingAllocator fails, the simulator fails the same way (TorchAllocatorError).

- ``release_available_cached_blocks`` releases any cached block of at least ``max_split_size`` bytes without
  checking that it is a whole segment. Lowered at run time below a block split off before, ``max_split_size``
  sends a split block to ``release_block``: torch counts the ``cudaFree`` and records its ``segment_free``, then
  the CUDA runtime refuses the pointer ("CUDA error: invalid argument") and the block stays cached.
- With expandable segments a private pool's ``cudaMalloc_count`` goes up once per ``alloc_block`` (however many
  pages it maps) and down once per unmapped range (``unmap_block``). ``empty_cache`` deletes a pool nobody holds
  when the count reaches 0, even with blocks still in it: torch keeps pointers into the deleted pool, and a free of
  such a block is undefined there (the simulator refuses it, changing nothing). Pages mapped in one call and freed
  as two ranges run the count out first: torch's ``TORCH_INTERNAL_ASSERT(cudaMalloc_count > 0)`` fails.
"""

from __future__ import annotations

import pytest

from memviz.errors import MemvizError, TorchAllocatorError
from memviz.sim import CachingAllocator, MemPool

MiB = 1 << 20


def _both(*args: object, **kwargs: object) -> list[CachingAllocator]:
    """The fast paths and the readable methods (tests/test_sim_fastpath.py holds them equal op by op)."""
    return [CachingAllocator(*args, **kwargs), CachingAllocator(*args, fast_paths=False, **kwargs)]


@pytest.mark.parametrize("a", _both(80 * MiB, record_history=True), ids=["fast", "readable"])
def test_max_split_size_lowered_below_a_split_block_fails_as_cuda_does(a: CachingAllocator) -> None:
    a.free(a.malloc(40 * MiB))
    kept = a.malloc(2 * MiB)  # splits the cached 40 MiB segment: 38 MiB free after it
    a.set_allocator_settings("max_split_size_mb:20")
    before = a.memory_stats()
    with pytest.raises(TorchAllocatorError, match=r"^CUDA error: invalid argument \(torch's "
                                                  r"release_available_cached_blocks called cudaFree on the free "
                                                  r"39,845,888 B block"):
        a.malloc(45 * MiB)  # 40 + 45 MiB > 80 MiB: torch releases oversize cached blocks first
    after = a.memory_stats()
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {"num_device_free"} and after["num_device_free"] == before["num_device_free"] + 1
    assert list(a.trace_entries())[-1][:3] == ("segment_free", kept + 2 * MiB, 38 * MiB)  # recorded, not done
    assert [s["total_size"] for s in a.segments()] == [40 * MiB]
    a._check()
    a.free(kept)  # the program goes on, as it can after torch's exception
    assert a.malloc(30 * MiB) and a.memory_reserved() == 40 * MiB
    a._check()


def _pool_with_two_maps(a: CachingAllocator) -> tuple[MemPool, int, int]:
    """A MemPool with two alloc_block calls (60 MiB, then 20 MiB mapped at its end), left holding two live 20 MiB
    blocks between free ranges, released by its last user: the repro of the erased pool."""
    pool = MemPool(a)
    a.begin_allocate_to_pool(pool.id)
    x, y = a.malloc(60 * MiB), a.malloc(20 * MiB)
    a.free(x)
    p, q = a.malloc(20 * MiB), a.malloc(20 * MiB)  # inside x's old block: [p q free] y
    a.free(p)
    a.end_allocate_to_pool(pool.id)
    a.release_pool(pool.id)  # use_mem_pool's own hold
    return pool, q, y


@pytest.mark.parametrize("a", _both(300 * MiB, alloc_conf="expandable_segments:True"), ids=["fast", "readable"])
def test_an_expandable_pool_deleted_with_live_blocks_refuses_their_free(a: CachingAllocator) -> None:
    pool, q, y = _pool_with_two_maps(a)
    assert a.graph_pools[pool.id].cudaMalloc_count == 2
    pool.release()  # ~MemPool: releasePool, then emptyCache(id) unmaps [0, 20) and [40, 60) MiB: 2 - 2 = 0
    assert pool.id not in a.graph_pools and pool.id not in a.graph_pools_freeable  # torch erased it
    assert a.live_count() == 2 and a.memory_allocated() == 40 * MiB and a.memory_reserved() == 40 * MiB
    a._check()
    before = (a.memory_stats(), a.segments())
    for ptr in (q, y):
        with pytest.raises(TorchAllocatorError, match=r"^undefined in torch: the free of the 20,971,520 B block "
                                                      r"at 0x[0-9a-f]+ would return it to private pool \(0, 1\), "
                                                      "which torch deleted"):
            a.free(ptr)
    assert (a.memory_stats(), a.segments()) == before
    a._check()
    assert a.block_size(q) == 20 * MiB and a.live_block(y) is not None


def test_without_expandable_segments_the_pool_waits_for_its_live_blocks() -> None:
    """The same program with cudaMalloc segments: the count is the segments still held, so the pool stays
    (freeable) until its last block is freed and empty_cache releases the segment."""
    a = CachingAllocator(300 * MiB)
    pool, q, y = _pool_with_two_maps(a)
    pool.release()
    assert a.graph_pools[pool.id].cudaMalloc_count == 2 and pool.id in a.graph_pools_freeable
    a.free(q), a.free(y)
    a.empty_cache()
    assert pool.id not in a.graph_pools and a.memory_reserved() == 0
    a._check()


@pytest.mark.parametrize("a", _both(300 * MiB, alloc_conf="expandable_segments:True", record_history=True),
                         ids=["fast", "readable"])
def test_pages_mapped_at_once_and_freed_as_two_ranges_fail_torchs_assertion(a: CachingAllocator) -> None:
    pool = MemPool(a)
    a.begin_allocate_to_pool(pool.id)
    x = a.malloc(60 * MiB)  # one alloc_block, three 20 MiB pages: cudaMalloc_count 1
    a.free(x)
    p, _kept, r = (a.malloc(20 * MiB) for _ in range(3))  # the middle page stays live
    a.free(p), a.free(r)
    a.end_allocate_to_pool(pool.id)
    a.release_pool(pool.id)
    with pytest.raises(TorchAllocatorError, match=r"^INTERNAL ASSERT FAILED: block->pool->owner_PrivatePool->"
                                                  r"cudaMalloc_count > 0 \(torch's unmap_block"):
        pool.release()
    # torch stopped after unmapping the second range, before counting it: one unmap counted and recorded
    assert a.memory_reserved() == 20 * MiB and a.memory_stats()["num_device_free"] == 1
    assert [e[0] for e in a.trace_entries()].count("segment_unmap") == 1
    a._check()


def test_the_error_is_memviz_and_runtime() -> None:
    assert issubclass(TorchAllocatorError, MemvizError) and issubclass(TorchAllocatorError, RuntimeError)


def test_a_replay_stops_where_torch_fails_and_says_why() -> None:
    """memviz.sim.replay (every what-if) ends at the op where torch's allocator fails, with its message."""
    from memviz.sim import Op, replay

    pool = (0, 1)
    ops = [Op("begin_allocate_to_pool", pool), Op("malloc", 0, 60 * MiB), Op("malloc", 1, 20 * MiB), Op("free", 0),
           Op("malloc", 2, 20 * MiB), Op("malloc", 3, 20 * MiB), Op("free", 2), Op("end_allocate_to_pool", pool),
           Op("release_pool", pool), Op("empty_cache", pool), Op("free", 3), Op("malloc", 4, MiB)]
    outcome = replay(ops, CachingAllocator(300 * MiB, alloc_conf="expandable_segments:True"))
    assert outcome.failure_step == 10 and outcome.steps == 10 and not outcome.last_ok
    assert outcome.failure.startswith("undefined in torch: the free of the 20,971,520 B block")
    clean = replay(ops, CachingAllocator(300 * MiB))  # cudaMalloc segments: the pool waits for its blocks
    assert clean.failure is None and clean.steps == len(ops)

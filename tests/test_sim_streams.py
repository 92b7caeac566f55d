"""Streams through the snapshot tools: a multi-stream program's snapshot replays exactly in check_fidelity.

The programs run on memviz.sim itself (its snapshots carry each trace entry's and segment's ``stream``, as
torch's do), so the recorded truth is the simulator's; what is tested is that the replay keeps each request
on its stream. H200 recordings of such programs are planned in scripts/record_streams.py.
"""

from __future__ import annotations

import pytest

from memviz.errors import InputError
from memviz.sim import CachingAllocator, CUDAGraph, MemPool, OutOfMemoryError, graph, use_mem_pool
from memviz.snapshots import SnapshotHistory, check_fidelity, load_snapshot

MiB = 1 << 20
SIDE = 0x5A00
CONFIGS = [pytest.param("", id="native"), pytest.param("expandable_segments:True", id="expandable")]


def _side_stream_training(a: CachingAllocator, steps: int = 6) -> None:
    """Batches copied in on a side stream (non_blocking) and used on the default one (record_stream);
    30 MiB blocks freed on one stream and asked for on the other."""
    weights = a.malloc(48 * MiB)
    for step in range(steps):
        batch = a.malloc((6 + step % 3) * MiB, stream=SIDE)
        a.record_stream(batch, 0)
        act = a.malloc(30 * MiB)
        a.free(batch)  # the default stream still reads it
        a.free(act)
        out = a.malloc(30 * MiB, stream=SIDE)  # act's cached block is the default stream's: a new segment
        a.free(out)
        if step % 2:
            a.synchronize()
    a.free(weights)


@pytest.mark.parametrize("conf", CONFIGS)
def test_multi_stream_snapshot_replays_exactly(conf: str) -> None:
    a = CachingAllocator(80 << 30, alloc_conf=conf)
    _side_stream_training(a)
    snap = load_snapshot(a.snapshot())
    assert {e["stream"] for e in snap["device_traces"][0]} == {0, SIDE}
    report = check_fidelity(snap, device_total_bytes=80 << 30, progress=False)
    assert report.events_compared > 0
    assert report.reserved_matches == report.events_compared
    assert report.states_matching == report.states_compared


def test_replay_without_streams_would_differ() -> None:
    """The check can fail: the same requests all on the default stream reuse each other's blocks."""
    a = CachingAllocator(80 << 30)
    _side_stream_training(a)
    snap = a.snapshot()
    for e in snap["device_traces"][0]:
        e["stream"] = 0
    for seg in snap["segments"]:
        seg["stream"] = 0
    report = check_fidelity(load_snapshot(snap), device_total_bytes=80 << 30, progress=False)
    assert report.reserved_matches < report.events_compared


def test_private_pool_program_replays_in_the_pools_the_snapshot_and_the_rules_give() -> None:
    """torch 2.11's trace entries name no pool: the snapshot names the graph's and the MemPool's segments, and the
    one gone by then (keep's, freed and released by empty_cache) is placed by the allocator's rules, not by the
    allocations around it (the MemPool's): the pool made a new segment for its 8 MiB although that segment had a
    free 12 MiB block, so it was the device's own. The replay reproduces the recording, and says that what-ifs
    under other configs rest on that placement."""
    a = CachingAllocator(80 << 30)
    g = CUDAGraph(a)
    keep = a.malloc(8 * MiB)
    with graph(a, g):
        out = a.malloc(8 * MiB, stream=g.capture_stream)
        a.free(a.malloc(8 * MiB, stream=g.capture_stream))
    pool = MemPool(a)
    with use_mem_pool(a, pool):
        x = a.malloc(8 * MiB)
    a.free(keep)
    a.free(x)
    a.empty_cache()
    assert {seg["segment_pool_id"] for seg in a.segments()} == {g.pool(), pool.id, (0, 0)}  # (0, 0): the generator's
    history = SnapshotHistory(load_snapshot(a.snapshot()), progress=False)
    assert history.pools.alloc_pool[1] == (0, 0) and history.pools.segment_pool[0] == (0, 0)  # keep's segment
    report = check_fidelity(history, device_total_bytes=80 << 30, progress=False)
    assert report.exact and report.replayable and any("no recorded pool" in c for c in report.caveats)
    assert a.live_block(out) is not None


def test_graph_pool_is_refused_until_the_capture_ends() -> None:
    """torch's CUDAGraph::pool() raises until capture_end (seen on the H200); then it names the pool."""
    a = CachingAllocator(80 << 30)
    g = CUDAGraph(a)
    with graph(a, g):
        a.malloc(8 * MiB, stream=g.capture_stream)
        with pytest.raises(InputError, match="without a preceding successful capture"):
            g.pool()
    assert sorted(seg["segment_pool_id"] for seg in a.segments()) == [(0, 0), g.pool()]  # (0, 0): the generator's


def test_expandable_segments_per_pool_and_stream() -> None:
    """CUDACachingAllocator.cpp find_expandable_block: the unmapped blocks searched are those of the pool and
    stream asked for (``BlockComparatorAddress`` orders by stream first), so each (pool, stream) grows its own
    expandable segment: here the default stream, a side stream and a MemPool each reserve one."""
    a = CachingAllocator(80 << 30, alloc_conf="expandable_segments:True")
    x = a.malloc(30 * MiB)
    y = a.malloc(30 * MiB, stream=SIDE)
    pool = MemPool(a)
    with use_mem_pool(a, pool):
        z = a.malloc(30 * MiB)
    w = a.malloc(30 * MiB)  # grows the default stream's segment
    segs = list(a.iter_segments())
    assert len(segs) == 3 and all(s.expandable for s in segs)
    assert sorted((s.pool.stream, s.pool.owner is None) for s in segs) == [(0, False), (0, True), (SIDE, True)]
    # 20 MiB pages: x, y and z map two each; w uses x's free 10 MiB and maps one more
    assert a.memory_reserved() == 7 * 20 * MiB
    for p in (x, y, z, w):
        a.free(p)
    pool.release()
    a.empty_cache()
    assert a.memory_reserved() == 0
    a._check()


def test_oom_message_counts_free_private_pool_bytes_as_allocated() -> None:
    """CUDACachingAllocator.cpp malloc's OOM text: free cached blocks of private pools count as allocated
    ("with X allocated in private pools (e.g., CUDA Graphs)"), and the reserved-but-unallocated figure drops by
    as much; empty_cache's retry could not release them while the pool is held."""
    a = CachingAllocator(1 << 30)
    pool = MemPool(a)
    with use_mem_pool(a, pool):
        a.free(a.malloc(300 * MiB))
    keep = a.malloc(500 * MiB)
    with pytest.raises(OutOfMemoryError) as e:
        a.malloc(400 * MiB)
    text = str(e.value)
    assert "Of the allocated memory 800.00 MiB is allocated by PyTorch, with 300.00 MiB allocated in private " \
           "pools (e.g., CUDA Graphs), and 0 bytes is reserved by PyTorch but unallocated." in text
    a.free(keep)
    pool.release()
    assert a.memory_reserved() == 500 * MiB  # the pool's segment went with it; keep's stays cached


def test_gc_clock_is_one_per_pool_across_streams() -> None:
    """CUDACachingAllocator.cpp get_free_block: ``++pool.get_free_blocks_call_count`` counts every search of the
    (large) pool whatever the stream, so a block's age is the same whichever stream asks; garbage collection then
    frees the oldest cached segments first, those of a side stream included."""
    a = CachingAllocator(1 << 30, memory_fraction=0.5, alloc_conf="garbage_collection_threshold:0.5")
    old = a.malloc(200 * MiB)
    a.free(old)  # cached on the default stream, aged by every later search
    for _ in range(3):
        a.free(a.malloc(60 * MiB, stream=SIDE))
    assert a.large_blocks.get_free_blocks_call_count == a.own_pools.large[SIDE].get_free_blocks_call_count
    a.malloc(150 * MiB, stream=SIDE)  # 260 MiB reserved, past 0.5 * 512 MiB: the gc runs before cudaMalloc
    segs = {(s["stream"], s["total_size"] >> 20) for s in a.segments()}
    assert segs == {(SIDE, 60), (SIDE, 150)}  # the oldest, on the other stream, went first
    a._check()


@pytest.mark.parametrize("bad", [-1, 1.5, "side", True])
def test_bad_stream_is_refused_and_changes_nothing(bad: object) -> None:
    a = CachingAllocator(1 << 30)
    p = a.malloc(MiB)
    a.record_stream(p, SIDE)
    a.free(p)
    a.synchronize()
    before = a.memory_stats()
    with pytest.raises(ValueError, match="stream"):
        a.malloc(MiB, stream=bad)
    assert a.memory_stats() == before and a.is_pending_free(p)  # not even process_events ran
    q = a.malloc(MiB)
    with pytest.raises(ValueError, match="stream"):
        a.record_stream(q, bad)
    a.free(q)
    assert not a.pending_blocks()  # q had no stream recorded: freed at once

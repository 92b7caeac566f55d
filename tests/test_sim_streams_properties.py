"""Property tests for streams and private pools: random programs, ``_check()`` after every step.

The programs mix requests on three streams, ``record_stream`` on live blocks, frees (some of them waiting on
events), ``synchronize``, ``empty_cache``, graph captures into a shared pool and ``use_mem_pool``, on small
devices so that out-of-memory retries (which wait for every event) happen too. ``_check()`` verifies the
structure and every current stat, active (= allocated + pending frees) included; the test also checks that
no pending free is reused and that each pool's segments keep their stream and pool id.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memviz.sim import CachingAllocator, CUDAGraph, MemPool, OutOfMemoryError

MiB = 1 << 20
STREAMS = (0, 0x100, 0x200)
SIZES = st.one_of(st.integers(1, 4096), st.integers(4097, 2 * MiB), st.integers(2 * MiB, 50 * MiB))
OPS = st.lists(st.tuples(st.sampled_from(["malloc", "malloc", "malloc", "free", "record_free", "record_free",
                                          "record", "sync", "sync_one", "empty", "capture", "end", "pool",
                                          "unpool", "reset"]),
                         SIZES, st.sampled_from(STREAMS), st.integers(0, 1 << 30)),
               min_size=1, max_size=60)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conf=st.sampled_from(["", "expandable_segments:True", "max_split_size_mb:20"]),
       capacity_mb=st.integers(40, 200), ops=OPS)
def test_random_stream_programs_keep_every_invariant(conf: str, capacity_mb: int, ops: list) -> None:
    a = CachingAllocator(capacity_mb * MiB, alloc_conf=conf)
    live: list[int] = []
    graphs: list[CUDAGraph] = []
    capturing: CUDAGraph | None = None
    pool: MemPool | None = None
    in_pool = False
    for kind, size, stream, pick in ops:
        if kind == "malloc":
            try:
                p = a.malloc(size, stream=stream)
            except OutOfMemoryError:
                continue
            assert not a.is_pending_free(p)
            live.append(p)
        elif kind == "free" and live:
            a.free(live.pop(pick % len(live)))
        elif kind == "record_free" and live:
            p = live.pop(pick % len(live))
            a.record_stream(p, STREAMS[(pick >> 3) % 3])
            a.free(p)
        elif kind == "record" and live:
            a.record_stream(live[pick % len(live)], STREAMS[pick % 3])
        elif kind == "sync":
            a.synchronize()
        elif kind == "sync_one":
            a.synchronize(stream)
        elif kind == "empty":
            a.empty_cache()
        elif kind == "capture" and capturing is None:
            capturing = CUDAGraph(a)
            try:  # the first capture's generator tensors may not fit
                capturing.capture_begin(graphs[0].pool() if graphs and pick % 2 else None, stream=stream)
            except OutOfMemoryError:
                capturing.delete()
                capturing = None
        elif kind == "end" and capturing is not None:
            capturing.capture_end()
            graphs.append(capturing)
            capturing = None
        elif kind == "pool" and not in_pool:
            pool = pool or MemPool(a)
            a.begin_allocate_to_pool(pool.id)
            in_pool = True
        elif kind == "unpool" and in_pool and pool is not None:
            a.end_allocate_to_pool(pool.id)
            a.release_pool(pool.id)
            in_pool = False
        elif kind == "reset" and graphs:
            graphs.pop(pick % len(graphs)).delete()
        a._check()
        for seg in a.segments():
            pid = tuple(seg["segment_pool_id"])
            assert pid == (0, 0) or pid in a.graph_pools, f"segment of a forgotten pool {pid}"
    # wind down: end captures and pools, free everything, release graphs: the cache empties completely
    if capturing is not None:
        capturing.delete()
    if in_pool and pool is not None:
        a.end_allocate_to_pool(pool.id)
        a.release_pool(pool.id)
    for p in live:
        a.free(p)
    for g in graphs:
        g.delete()
    if pool is not None:
        pool.release()
    a.empty_cache()
    a._check()
    assert a.memory_allocated() == 0 and not a.pending_blocks()
    assert a.memory_stats()["active_bytes.all.current"] == 0
    assert a.memory_reserved() == 0
    # (an expandable graph pool may stay listed, empty: see test_graph_memory_stats_and_use_result_after_destroy_graph)
    assert not a.graph_pools or conf.startswith("expandable")

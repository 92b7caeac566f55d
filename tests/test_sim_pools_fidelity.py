"""Private pools through the snapshot tools: graphs, MemPools and empty_cache replay exactly in check_fidelity.

The programs mirror scripts/record_streams.py's on memviz.sim (its snapshots carry ``segment_pool_id`` and each
trace entry's ``stream``, as torch's do) and take a snapshot after each phase, as the recorder does. The replay
routes each request into its recorded pool (memviz.snapshots.history_pools), replays the program's
``empty_cache()`` calls and pool deletions from the segments they released (memviz.snapshots.history_ops), and
must end where the program ended: every request's reserved and allocated bytes, the sampled segment states,
each phase's totals and the final counters.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from memviz.sim import CachingAllocator, CUDAGraph, MemPool, graph, graph_pool_handle, use_mem_pool
from memviz.snapshots import SnapshotHistory, check_fidelity

MiB = 1 << 20
SIDE, CAPTURE = 0x5A00, 0x7C00
TOTAL = 80 << 30
CONFIGS = [pytest.param("", id="native"), pytest.param("expandable_segments:True", id="expandable")]
STAT_KEYS = [f"{what}.{pool}.{kind}" for what in ("reserved_bytes", "allocated_bytes", "active_bytes", "segment",
                                                 "inactive_split_bytes", "requested_bytes")
             for pool in ("all", "small_pool", "large_pool") for kind in ("current", "peak")]
STAT_KEYS += ["num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms"]


def cross_stream_30mib(a: CachingAllocator, phase: Callable[[str], None]) -> None:
    n = 30 * MiB
    a.free(a.malloc(n))
    phase("30 MiB freed on the default stream")
    y = a.malloc(n, SIDE)
    phase("asked on the side stream")
    a.record_stream(y, 0)
    a.free(y)
    z = a.malloc(n, SIDE)
    phase("asked again while pending")
    a.synchronize()
    w = a.malloc(n, SIDE)
    v = a.malloc(n)
    phase("after synchronize")
    a.record_stream(z, 0)
    for p in (z, w, v):
        a.free(p)
    a.empty_cache()
    phase("empty_cache with a free pending")


def graphs_shared_pool(a: CachingAllocator, phase: Callable[[str], None]) -> None:
    w, x, workspace = a.malloc(4 * MiB), a.malloc(4 * MiB), a.malloc(32 * MiB)
    phase("inputs, eager warm-up")
    pool = graph_pool_handle(a)
    g1, g2 = CUDAGraph(a), CUDAGraph(a)
    with graph(a, g1, pool=pool, stream=CAPTURE):
        a.malloc(32 * MiB, CAPTURE)  # the capture stream's cuBLAS workspace, never freed
        y1 = a.malloc(4 * MiB, CAPTURE)
    phase("g1 captured")
    with graph(a, g2, pool=pool, stream=CAPTURE):
        t = a.malloc(4 * MiB, CAPTURE)
        y2 = a.malloc(4 * MiB, CAPTURE)
        a.free(t)
    phase("g2 captured into the same pool")
    g1.reset()
    a.empty_cache()
    phase("g1 deleted, empty_cache")
    g2.reset()
    a.free(y1)
    a.free(y2)
    a.empty_cache()
    phase("g2 and outputs deleted, empty_cache")
    for p in (w, x, workspace):
        a.free(p)


def mempool_use(a: CachingAllocator, phase: Callable[[str], None]) -> None:
    pool = MemPool(a)
    outside = a.malloc(MiB)
    with use_mem_pool(a, pool):
        x = a.malloc(MiB)
        b = a.malloc(MiB + 512)
    phase("1 MiB and 1 MiB + 512 in the pool, 1 MiB outside")
    a.free(x)
    c = a.malloc(MiB)
    phase("pool block freed, same size asked outside")
    a.empty_cache()
    phase("empty_cache outside, pool alive")
    inner = MemPool(a)
    with use_mem_pool(a, pool):
        d = a.malloc(20 * MiB)
        with use_mem_pool(a, inner):
            e = a.malloc(20 * MiB)
    phase("nested pools")
    for p in (b, d, e):
        a.free(p)
    phase("tensors freed, pools alive")
    pool.release()
    inner.release()
    phase("pools deleted")
    a.free(outside)
    a.free(c)
    a.empty_cache()
    phase("outside tensors freed, empty_cache")


def mempool_devlog(a: CachingAllocator, phase: Callable[[str], None]) -> None:
    pools = []
    for sizes in ((8 * MiB, 64 * MiB), (64 * MiB, 8 * MiB)):
        pool = MemPool(a)
        pools.append(pool)
        with use_mem_pool(a, pool):
            for n in sizes:
                a.free(a.malloc(n))
        phase(f"{sizes}: each asked then freed")
        with use_mem_pool(a, pool):
            big = a.malloc(72 * MiB)
        phase("72 MiB asked")
        a.free(big)
        with use_mem_pool(a, pool):
            again = [a.malloc(64 * MiB), a.malloc(8 * MiB)]
        for p in again:
            a.free(p)
        phase("64 then 8 MiB, freed")
    boundary = MemPool(a)
    with use_mem_pool(a, boundary):
        for p in [a.malloc(MiB) for _ in range(8)]:
            a.free(p)
        held = [a.malloc(2 * MiB), a.malloc(MiB + 1), a.malloc(MiB)]
    phase("1 MiB boundary")
    for p in held:
        a.free(p)
    a.empty_cache()
    phase("freed, empty_cache with the pools alive")
    for pool in (*pools, boundary):
        pool.release()
    a.empty_cache()
    phase("pools deleted, empty_cache")


def record_stream_oom(a: CachingAllocator, phase: Callable[[str], None]) -> None:
    y = a.malloc(160 * MiB, SIDE)
    phase("y")
    for k in range(40):
        x = a.malloc(160 * MiB)
        a.record_stream(x, SIDE)
        a.free(x)
        if k % 7 == 6:
            a.synchronize(SIDE)  # the side stream caught up with some of the work
    phase("pending frees")
    a.free(y)
    a.empty_cache()
    phase("empty_cache")


PROGRAMS = [cross_stream_30mib, graphs_shared_pool, mempool_use, mempool_devlog, record_stream_oom]
CAPS = {"record_stream_oom": 2 << 30}


def _record(program: Callable, conf: str) -> tuple[CachingAllocator, list[dict]]:
    fraction = CAPS[program.__name__] / TOTAL if program.__name__ in CAPS else None
    a = CachingAllocator(TOTAL, fraction, conf)
    snapshots: list[dict] = []
    program(a, lambda name: snapshots.append(a.snapshot()))
    return a, snapshots


@pytest.mark.parametrize("conf", CONFIGS)
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.__name__)
def test_pool_program_replays_exactly(program: Callable, conf: str) -> None:
    a, snapshots = _record(program, conf)
    final = a.snapshot()
    history = SnapshotHistory(final, earlier_snapshots=snapshots)
    cap = CAPS.get(program.__name__)
    report = check_fidelity(history, device_total_bytes=TOTAL, cap_bytes=cap, progress=False)
    assert report.exact, report.describe()
    replayed = report.result.allocator
    want, got = a.memory_stats(), replayed.memory_stats()
    assert {k: got[k] for k in STAT_KEYS} == {k: want[k] for k in STAT_KEYS}
    for snap in snapshots:  # each phase's totals, at the phase's own snapshot entry
        k = len(snap["device_traces"][0])
        reserved = sum(s["total_size"] for s in snap["segments"])
        allocated = sum(s["allocated_size"] for s in snap["segments"])
        assert (report.result.reserved_bytes[k], report.result.allocated_bytes[k]) == (reserved, allocated)
    assert sorted(tuple(s["segment_pool_id"]) for s in replayed.segments()) == \
        sorted(tuple(s["segment_pool_id"]) for s in final["segments"])


@pytest.mark.parametrize("program", [mempool_use, mempool_devlog], ids=lambda p: p.__name__)
def test_replay_without_pools_would_differ(program: Callable) -> None:
    """The check can fail: the same requests all in the device's own pools reuse each other's blocks (graphs
    capture on their own stream, which keeps them apart anyway; MemPools share the default stream)."""
    a, snapshots = _record(program, "")
    final = a.snapshot()
    for snap in (*snapshots, final):
        for seg in snap["segments"]:
            seg["segment_pool_id"] = (0, 0)
    report = check_fidelity(SnapshotHistory(final, earlier_snapshots=snapshots), progress=False)
    assert not report.exact


def test_pools_come_from_earlier_snapshots() -> None:
    """A pool deleted before the end is named only by the snapshots taken while it lived."""
    a, snapshots = _record(mempool_use, "")
    final = a.snapshot()
    assert final["segments"] == []  # everything released by the end
    with_phases = SnapshotHistory(final, earlier_snapshots=snapshots).pools
    alone = SnapshotHistory(final).pools
    assert set(with_phases.alloc_pool.values()) == {(0, 0), (0, 1), (0, 2)}
    assert with_phases.inferred == 0
    assert alone.inferred == alone.segments == with_phases.segments
    assert not check_fidelity(SnapshotHistory(final), progress=False).exact


def allocator_settings(a: CachingAllocator, phase: Callable[[str], None]) -> None:
    for conf in ("max_split_size_mb:64", "roundup_power2_divisions:4", "expandable_segments:True",
                 "max_split_size_mb:40", ""):
        a.set_allocator_settings(conf)
        held = [a.malloc(21 * MiB + 1), a.malloc(3 * MiB), a.malloc(70 * MiB)]
        a.free(held[1])
        phase(f"_set_allocator_settings({conf!r})")
        for p in held[::2]:
            a.free(p)
        a.empty_cache()
        phase("freed, empty_cache")


@pytest.mark.parametrize("conf", CONFIGS)
def test_settings_changed_between_snapshots_replay_exactly(conf: str) -> None:
    """``_set_allocator_settings`` calls show only in the settings of the snapshots around them."""
    a, snapshots = _record(allocator_settings, conf)
    final = a.snapshot()
    report = check_fidelity(SnapshotHistory(final, earlier_snapshots=snapshots), device_total_bytes=TOTAL,
                            progress=False)
    assert report.exact, report.describe()
    assert not check_fidelity(SnapshotHistory(final), device_total_bytes=TOTAL, progress=False).exact


@pytest.mark.parametrize("conf", CONFIGS)
@pytest.mark.parametrize("program", [graphs_shared_pool, mempool_use, mempool_devlog], ids=lambda p: p.__name__)
def test_history_states_name_their_pools(program: Callable, conf: str) -> None:
    """Each phase's segments, rebuilt from the final snapshot and the earlier ones, carry the pool they had."""
    a, snapshots = _record(program, conf)
    history = SnapshotHistory(a.snapshot(), earlier_snapshots=snapshots)
    for snap in snapshots:
        k = len(snap["device_traces"][0]) - 1
        rebuilt = {s["address"]: tuple(s["segment_pool_id"]) for s in history.state_at(k)} if k >= 0 else {}
        assert rebuilt == {s["address"]: tuple(s["segment_pool_id"]) for s in snap["segments"]}

"""memviz.sim trace: the flat history list reads back as torch's device_traces entries."""

import itertools

import pytest

from memviz.sim import CachingAllocator, OutOfMemoryError

MiB = 1 << 20


def _run(a: CachingAllocator) -> list[dict]:
    p = a.malloc(3 * MiB)
    q = a.malloc(1000)
    a.free(p)
    with pytest.raises(OutOfMemoryError):
        a.malloc(a.total_memory)
    a.free(q)
    a.empty_cache()
    return a.snapshot()["device_traces"][0]


def test_entries_numbered_in_order_without_a_clock() -> None:
    trace = _run(CachingAllocator(1 << 30))
    assert [e["action"] for e in trace] == [
        "segment_alloc", "alloc", "segment_alloc", "alloc", "free_requested", "free_completed",
        "segment_free", "oom", "free_requested", "free_completed", "segment_free"]  # snapshot's own: next time
    assert [e["time_us"] for e in trace] == list(range(len(trace)))
    alloc, free_req, free_done = trace[1], trace[4], trace[5]
    assert alloc["size"] == 3 * MiB and free_req["addr"] == free_done["addr"] == alloc["addr"]
    assert free_req["size"] == free_done["size"] == 3 * MiB
    oom = trace[7]  # after the OOM retry released the cached 20 MiB segment
    assert "addr" not in oom and oom["device_free"] == (1 << 30) - 2 * MiB


def test_clock_stamps_each_entry_once_and_free_pairs_share_it() -> None:
    ticks = itertools.count(1000, 10)
    trace = _run(CachingAllocator(1 << 30, clock=lambda: next(ticks)))
    times = [e["time_us"] for e in trace]
    assert times[:4] == [1000, 1010, 1020, 1030]
    assert times[4] == times[5] == 1040  # free_requested and free_completed: one event here
    assert times == sorted(times)


def test_no_history_records_nothing() -> None:
    a = CachingAllocator(1 << 30, record_history=False)
    a.free(a.malloc(MiB))
    assert a.snapshot()["device_traces"] == [[]]

"""memviz.snapshots.history: rebuilding segments and blocks at every event of a real recording."""

import json
from pathlib import Path

import pytest

from memviz.sim import CachingAllocator
from memviz.snapshots import SnapshotHistory, compare_segments, load_snapshot

DATA = Path(__file__).parent / "data" / "snapshots"
MiB = 1 << 20


@pytest.fixture(scope="module")
def workload() -> SnapshotHistory:
    return SnapshotHistory(DATA / "workload" / "workload_default.pickle", progress=False)


@pytest.fixture(scope="module")
def train() -> SnapshotHistory:
    return SnapshotHistory(DATA / "train_snapshot.pickle", progress=False)


def _consistent(h: SnapshotHistory, i: int) -> list[dict]:
    h.check(i)
    segs = h.state_at(i)
    tl = h.timeline
    assert sum(s["total_size"] for s in segs) == tl.reserved_bytes[i]
    assert sum(s["allocated_size"] for s in segs) == tl.allocated_bytes[i]
    assert sum(s["active_size"] for s in segs) == tl.active_bytes[i]
    for s in segs:
        assert s["allocated_size"] == sum(b["size"] for b in s["blocks"] if b["state"] == "active_allocated")
    return segs


@pytest.mark.parametrize("name", ["train", "workload"])
def test_playing_to_the_end_reproduces_the_recorded_segments_exactly(request, name):
    h = request.getfixturevalue(name)
    assert h.anomalies == []
    assert h.compare_final() == []
    final = h.state_at(-1)
    recorded = h.snapshot["segments"]
    strip = [{k: v for k, v in s.items() if k != "frames"} for s in final]
    want = [{k: v for k, v in s.items() if k != "frames"} for s in recorded]
    for s in strip + want:
        s["blocks"] = [{k: v for k, v in b.items() if k != "frames"} for b in s["blocks"]]
    assert strip == want


def test_frames_are_carried_from_the_events(train):
    final = train.state_at(-1)
    recorded = {b["address"]: b["frames"] for s in train.snapshot["segments"] for b in s["blocks"]}
    assert all(b["frames"] == recorded[b["address"]] for s in final for b in s["blocks"])


def test_workload_starting_state_holds_the_parameters(workload):
    # recording began after the model's parameters were allocated: 48 tensors with no alloc event
    assert len(workload.initial_blocks) == 48
    assert workload.timeline.initial["allocated_bytes"] == 201539584
    start = workload.initial_state()
    assert len(start) == 13
    assert sorted(s["total_size"] // MiB for s in start) == [2, 12, 12] + [16] * 8 + [20, 20]
    assert all(b.state == "active_allocated" for b in workload.initial_blocks)


def test_workload_timeline_matches_the_recorded_run(workload):
    figures = json.loads((DATA / "workload" / "default.json").read_text())
    tl = workload.timeline
    assert len(tl.allocated_bytes) == len(workload) == figures["trace_events"] == 63008
    assert max(tl.reserved_bytes) == figures["peak_reserved_MiB"] * MiB
    assert max(tl.allocated_bytes) == figures["peak_allocated_MiB"] * MiB
    assert tl.allocated_bytes[-1] == figures["stats"]["allocated_bytes.all.current"]
    assert len(tl.segment_indices) == 89 and tl.oom_indices == []
    assert tl.time_us is not None and tl.time_us[0] <= tl.time_us[-1]


@pytest.mark.parametrize("i", [0, 1, 2, 9, 2047, 2048, 20000, 31504, 47000, 63006])
def test_middle_states_are_consistent(workload, i):
    _consistent(workload, i)


def test_a_known_middle_state(workload):
    # event 9 is the free of the 22511616 B request at event 4 (the third tensor of step 1)
    e = workload.events
    assert (e[9]["action"], e[10]["action"]) == ("free_requested", "free_completed")
    segs = {s["address"]: s for s in _consistent(workload, 10)}
    seg = segs[e[10]["addr"]]
    assert seg["total_size"] == 23068672
    assert [(b["size"], b["state"], b["requested_size"]) for b in seg["blocks"]] == [
        (23068672, "inactive", 22511616)]
    before = {s["address"]: s for s in workload.state_at(9)}[e[10]["addr"]]
    assert before["blocks"][0]["state"] == "active_pending_free"
    # 22511616 B rounds to itself, and the 557056 B left in the 22 MiB segment is not split off (<= 1 MiB)
    assert workload.timeline.allocated_bytes[9] == workload.timeline.allocated_bytes[8] - 23068672
    assert workload.timeline.active_bytes[9] == workload.timeline.active_bytes[8]


def test_index_errors(train):
    with pytest.raises(IndexError):
        train.state_at(len(train))
    assert train.state_at(-1) == train.state_at(len(train) - 1)


def _record(conf: str, steps: int = 400) -> dict:
    """A real simulator run with empty_cache and OOM-free churn; its snapshot carries the full trace."""
    a = CachingAllocator(16 << 30, alloc_conf=conf)
    live = []
    x = 12345
    for step in range(steps):
        x = (x * 1103515245 + 12345) % 2**31
        if live and x % 9 < 4:
            a.free(live.pop(x % len(live)))
        else:
            size = [700, 4096, 600 * 1024, 3 * MiB + 5, 13 * MiB, 45 * MiB][x % 6]
            live.append(a.malloc(size))
        if step % 97 == 96:
            a.empty_cache()
    return a.snapshot()


@pytest.mark.parametrize("conf", ["", "expandable_segments:True", "max_split_size_mb:40",
                                  "roundup_power2_divisions:4"])
@pytest.mark.parametrize("cut", [0, 150, 450])
def test_late_recording_is_rebuilt_backwards(conf, cut):
    snap = _record(conf)
    events = snap["device_traces"][0]
    assert any(e["action"] in ("segment_free", "segment_unmap") for e in events)
    snap["device_traces"] = [events[cut:]]  # recording started late: earlier blocks have no alloc event
    h = SnapshotHistory(snap, progress=False)
    assert h.anomalies == []
    got, want = h.state_at(-1), load_snapshot(snap)["segments"]
    if conf.startswith("expandable"):
        # The stale requested_size of a free block after pages are mapped onto it is not modelled
        # for expandable segments; everything else must match.
        for segs in (got, want):
            for seg in segs:
                for blk in seg["blocks"]:
                    if blk["state"] == "inactive":
                        blk["requested_size"] = 0
    assert compare_segments(got, want) == []
    for i in range(0, len(h), 37):
        _consistent(h, i)

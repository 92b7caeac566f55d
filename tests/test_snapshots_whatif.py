"""memviz.snapshots.whatif: replaying a real 60-step training run under other allocator configs.

The same run was executed under each config on an H200 capped at 12 GiB (tests/data/snapshots/
workload/*.json); the replay of the default run's events must land on what each real run reached.
"""

import dataclasses
import json
from pathlib import Path

import pytest

from memviz.snapshots import SnapshotError, SnapshotHistory, check_fidelity, load_snapshot, replay, what_if
from memviz.units import GiB, MiB

DATA = Path(__file__).parent / "data" / "snapshots"
WORKLOAD = DATA / "workload"


def _figures(name: str) -> dict:
    return json.loads((WORKLOAD / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def history() -> SnapshotHistory:
    return SnapshotHistory(WORKLOAD / "workload_default.pickle", progress=False)


@pytest.fixture(scope="module")
def cap_bytes() -> int:
    cap = _figures("default")["cap_GiB"]  # set_per_process_memory_fraction(cap / total) in the real run
    assert _figures("expandable")["cap_GiB"] == cap
    return int(cap * GiB)


@pytest.fixture(scope="module")
def report(history, cap_bytes):
    return what_if(history, {"expandable": "expandable_segments:True"}, cap_bytes=cap_bytes, progress=False)


def test_recorded_config_is_inferred_and_reproduced_exactly(report, history):
    assert history.settings.alloc_conf() == ""
    fid = report.fidelity
    assert fid is not None and fid.exact, fid.describe()
    assert fid.events_compared == 21039 + 20940  # every alloc and free_completed
    assert fid.states_matching == fid.states_compared >= 20
    assert fid.replayed_peak_reserved_bytes == fid.recorded_peak_reserved_bytes


@pytest.mark.parametrize(("name", "label"), [("default", "recorded"), ("expandable", "expandable")])
def test_what_if_lands_on_the_real_runs(report, name, label):
    real = _figures(name)
    got = report.results[label]
    assert got.peak_reserved_bytes == real["peak_reserved_MiB"] * MiB  # 9520 MiB default, 5870 expandable
    assert got.num_device_alloc == real["num_device_alloc"]  # 102 cudaMallocs / 85 page maps
    assert got.num_device_free == real["num_device_free"] == 0
    assert got.num_ooms == real["ooms"] == 0
    assert got.final_reserved_bytes == real["stats"]["reserved_bytes.all.current"]
    assert got.final_allocated_bytes == real["stats"]["allocated_bytes.all.current"]


def test_expandable_avoids_the_fragmentation(report):
    default, expandable = report.results["recorded"], report.results["expandable"]
    assert expandable.peak_reserved_bytes < 0.65 * default.peak_reserved_bytes
    assert expandable.fragmentation_at_peak < default.fragmentation_at_peak
    lines = report.table().splitlines()
    rows = {line.split()[0]: line.split() for line in lines[3:6]}  # below the two header lines and the rule
    assert rows["(recorded)"][1:5] == ["9520", "MiB", "5752", "MiB"]
    assert rows["recorded:"][2:4] == ["9520", "MiB"] and rows["recorded:"][-1] == "41.1%"
    assert rows["expandable:"][2:4] == ["5870", "MiB"] and rows["expandable:"][-1] == "2.1%"
    assert " ".join(lines[6:]) == report.fidelity.describe()  # wrapped at the table's width
    assert max(len(line) for line in lines) == len(lines[2])  # the rule is the table's width
    assert [r["name"] for r in report.rows()] == ["recorded", "expandable"]


def test_per_event_timeline_is_aligned_with_the_trace(report, history):
    r = report.results["recorded"]
    assert len(r.reserved_bytes) == len(history) == len(r.allocated_bytes)
    allocs = [i for i, e in enumerate(history.events) if e["action"] == "alloc"]
    assert [r.reserved_bytes[i] for i in allocs] == [history.timeline.reserved_bytes[i] for i in allocs]
    assert max(r.reserved_bytes) == r.peak_reserved_bytes


def test_a_smaller_cap_gives_an_oom_and_says_where(history):
    r = replay(history, "", cap_bytes=4 << 30, timeline=False, progress=False)
    assert r.num_ooms > 0 and r.peak_reserved_bytes <= 4 << 30
    first = r.oom_event_indices[0]
    assert history.events[first]["action"] == "alloc"
    assert r.summary()["first_oom_event"] == first
    e = replay(history, "expandable_segments:True", cap_bytes=6 << 30, timeline=False, progress=False)
    assert e.num_ooms == 0  # expandable fits where the default needs 9.3 GiB


def test_recorded_oom_is_retried_under_the_what_if():
    # a tiny recording with an OOM: 2 GiB allowed, 1.5 GiB live, a 1 GiB request fails (the driver had 100 GiB free)
    snap = {"segments": [], "device_traces": [[
        {"action": "segment_alloc", "addr": 1 << 30, "size": 1536 * MiB, "stream": 0},
        {"action": "alloc", "addr": 1 << 30, "size": 1536 * MiB, "stream": 0},
        {"action": "oom", "size": 1024 * MiB, "device_free": 100 << 30, "stream": 0},
        {"action": "free_requested", "addr": 1 << 30, "size": 1536 * MiB, "stream": 0},
        {"action": "free_completed", "addr": 1 << 30, "size": 1536 * MiB, "stream": 0},
    ]], "allocator_settings": {}}
    h = SnapshotHistory(snap, progress=False)
    assert h.timeline.oom_indices == [2]
    small = replay(h, "", cap_bytes=2 << 30, progress=False)
    assert small.oom_event_indices == [2] and small.recorded_ooms_avoided == []
    big = replay(h, "", cap_bytes=4 << 30, progress=False)
    assert big.num_ooms == 0 and big.recorded_ooms_avoided == [2]
    full = replay({**snap, "device_traces": [[{**e, "device_free": 0} if e["action"] == "oom" else e
                                              for e in snap["device_traces"][0]]]}, "", progress=False)
    assert full.oom_event_indices == [2]  # the driver had nothing free: no cap serves it on that device


def test_a_fidelity_report_that_differs_says_where():
    fid = check_fidelity(DATA / "train_snapshot.pickle", progress=False)
    worse = dataclasses.replace(fid, reserved_matches=fid.reserved_matches - 1, first_reserved_mismatch=1234,
                                states_matching=fid.states_matching - 1, first_state_mismatch=56)  # fmt: skip
    assert not worse.exact
    assert worse.describe() == (
        "replaying under the recorded config (default) does not reproduce the recording: segment states match at "
        f"{fid.states_compared - 1} of {fid.states_compared} sampled events (first difference at event 56), "
        f"reserved bytes at {fid.events_compared - 1} of {fid.events_compared} requests (first difference at "
        f"event 1,234), allocated bytes at {fid.events_compared} of {fid.events_compared} requests"
    )


def test_fidelity_compares_the_final_state_too():
    """What follows the last request shows only in the final snapshot: a final state the trace does not lead to
    (here one free block recorded as allocated) is not exact, though every request and sample matched."""
    snap = load_snapshot(DATA / "train_snapshot.pickle")
    assert check_fidelity(snap, progress=False).final_state_matches
    block = next(b for s in snap["segments"] for b in s["blocks"] if b["state"] == "inactive")
    block["state"] = "active_allocated"
    fid = check_fidelity(snap, progress=False)
    assert fid.reserved_matches == fid.allocated_matches == fid.events_compared
    assert fid.states_matching == fid.states_compared
    assert not fid.final_state_matches and not fid.exact
    assert fid.describe().endswith("requests; the segments at the end differ. It cannot be replayed exactly: the "
                                   f"replay under the recorded config differs from the recording at the end; "
                                   f"{fid.remedy}")
    assert (fid.replayable, fid.verdict.cause, fid.verdict.first_event) == (False, "differs", None)


def test_train_snapshot_fidelity_and_errors():
    fid = check_fidelity(DATA / "train_snapshot.pickle", progress=False)
    assert fid.exact, fid.describe()
    with pytest.raises(SnapshotError, match="no device_traces"):
        what_if({"segments": [], "device_traces": [[]]}, progress=False)
    with pytest.raises(ValueError, match="not both"):
        replay(DATA / "train_snapshot.pickle", cap_bytes=1 << 30, memory_fraction=0.5, progress=False)

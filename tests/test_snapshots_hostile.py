"""Snapshots that load but hold hostile numbers or inconsistent traces: history, what-if and export either
work or raise a SnapshotError / InputError naming the input, never a raw OverflowError, TypeError or KeyError."""

from __future__ import annotations

import pytest

from memviz.errors import InputError, InputTypeError, SnapshotError
from memviz.snapshots import SnapshotHistory, dumps_snapshot, what_if

M = 1 << 20


def _seg(addr: int, size: int, expandable: bool = False) -> dict:
    return {"address": addr, "total_size": size, "allocated_size": 0, "active_size": 0, "requested_size": 0,
            "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": expandable,
            "frames": [], "blocks": [{"address": addr, "size": size, "requested_size": 0, "state": "inactive",
                                      "frames": []}]}


def _ev(action: str, addr: int, size: int, **extra) -> dict:
    return {"action": action, "addr": addr, "size": size, "stream": 0, **extra}


EXPANDABLE = {"expandable_segments": True}
CASES = {
    "unmap at the end of a segment the final state still holds": {
        "segments": [_seg(0, 20 * M, True)], "device_traces": [[_ev("segment_unmap", 0, 20 * M)]],
        "allocator_settings": EXPANDABLE},
    "map then unmap of a segment the final state holds": {
        "segments": [_seg(0, 20 * M, True)],
        "device_traces": [[_ev("segment_map", 0, 20 * M), _ev("segment_unmap", 0, 20 * M)]],
        "allocator_settings": EXPANDABLE},
    "partial unmap": {"segments": [], "device_traces": [[_ev("segment_map", 0, 40 * M),
                                                         _ev("segment_unmap", 20 * M, 20 * M)]],
                      "allocator_settings": EXPANDABLE},
    "overlapping final segments": {"segments": [_seg(0, 20 * M), _seg(2 * M, 20 * M)], "device_traces": [[]]},
    "segment_alloc over a live segment": {"segments": [], "device_traces": [[
        _ev("segment_alloc", 0, 20 * M), _ev("segment_alloc", 2 * M, 20 * M), _ev("alloc", 2 * M, 100)]]},
    "totals above int64": {"segments": [_seg(0, 2**62), _seg(2**62, 2**62)],
                           "device_traces": [[_ev("alloc", 0, 1000)]]},
}


@pytest.mark.parametrize("name", list(CASES))
def test_inconsistent_snapshots_never_crash(name: str) -> None:
    snap = CASES[name]
    try:
        history = SnapshotHistory(snap, progress=False)
    except SnapshotError as e:
        assert "device_traces" in str(e) or "segments" in str(e)
        return
    for i in range(len(history)):
        history.state_at(i)
        history.check(i) if not history.anomalies else None
    assert isinstance(history.compare_final(), list)
    dumps_snapshot(history)
    if history.events and any(e["action"] == "alloc" for e in history.events):
        what_if(history, ["expandable_segments:True"], progress=False)


def test_overlaps_are_anomalies_not_corruption() -> None:
    history = SnapshotHistory(CASES["unmap at the end of a segment the final state still holds"], progress=False)
    assert history.anomalies and "overlaps" in history.anomalies[0]
    assert history.compare_final() == ["segment 0: recorded (20971520 B) but missing"]


@pytest.mark.parametrize("device", [-1, 1.0, "0", True])
def test_device_must_be_a_trace_index(device: object) -> None:
    with pytest.raises(InputError, match="device"):
        SnapshotHistory({"segments": [], "device_traces": [[]]}, device=device)  # type: ignore[arg-type]
    with pytest.raises(SnapshotError, match="pass device=0 to 0"):
        SnapshotHistory({"segments": [], "device_traces": [[]]}, device=3)


SMALL = {"segments": [{**_seg(0, 2 * M), "segment_type": "small", "allocated_size": 1024, "active_size": 1024,
                       "requested_size": 1000, "blocks": [
                           {"address": 0, "size": 1024, "requested_size": 1000, "state": "active_allocated"},
                           {"address": 1024, "size": 2 * M - 1024, "requested_size": 0, "state": "inactive"}]}],
         "device_traces": [[_ev("segment_alloc", 0, 2 * M), _ev("alloc", 0, 1000)]]}


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"configs": "expandable_segments:True"}, InputTypeError, "wrap it"),
    ({"cap_bytes": "2 GiB"}, InputTypeError, "parse_size"),
    ({"cap_bytes": 1.5}, InputTypeError, "cap_bytes must be an int"),
    ({"cap_bytes": 0}, InputError, "cap_bytes must be between"),
    ({"device_total_bytes": 2**80}, InputError, "device_total_bytes"),
    ({"memory_fraction": 2.0}, InputError, "memory_fraction"),
    ({"configs": [5]}, InputTypeError, "config 5 must be a PYTORCH_CUDA_ALLOC_CONF string"),
    ({"configs": ["max_split_size_mb:²"]}, InputError, "max_split_size_mb"),
])
def test_what_if_refuses_bad_arguments_by_name(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        what_if(SMALL, progress=False, **kwargs)


def test_what_if_with_an_exact_cap() -> None:
    report = what_if(SMALL, [""], cap_bytes=2 * M, device_total_bytes=80 << 30, progress=False)
    assert report.fidelity is not None and report.fidelity.exact, report.fidelity.describe()
    assert report.results["default"].allowed_bytes == 2 * M


def test_a_snapshot_its_trace_does_not_lead_to_is_not_replayed() -> None:
    """The trace leaves a block allocated that the final segments do not hold: nothing is replayed under the
    what-if's configs, and the table says why."""
    report = what_if({**SMALL, "segments": []}, [""], progress=False)
    assert not report.replayable and report.results == {}
    assert report.fidelity is not None and report.fidelity.reason is not None
    assert "cannot be replayed exactly" in report.table().replace("\n", " ")

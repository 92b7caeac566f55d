"""memviz.snapshots.load: the restricted unpickler and the shape checks, on real and hostile files."""

import collections
import io
import os
import pickle
import pickletools
from pathlib import Path

import pytest

from memviz.snapshots import SnapshotError, load_snapshot, loads_snapshot

DATA = Path(__file__).parent / "data" / "snapshots"
TRAIN = DATA / "train_snapshot.pickle"
WORKLOAD = DATA / "workload" / "workload_default.pickle"


@pytest.fixture(scope="module")
def train() -> dict:
    return load_snapshot(TRAIN)


def test_real_training_snapshot_loads(train):
    assert len(train["segments"]) == 16
    assert len(train["device_traces"][0]) == 234
    assert train["allocator_settings"]["expandable_segments"] is False
    seg = train["segments"][0]
    assert seg["segment_pool_id"] == (0, 0)
    assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]


def test_workload_snapshot_loads():
    snap = load_snapshot(WORKLOAD)
    assert len(snap["device_traces"][0]) == 63008
    assert sum(s["total_size"] for s in snap["segments"]) == 9520 * 2**20


def test_sources_path_file_bytes_and_dict_agree(train):
    raw = TRAIN.read_bytes()
    with open(TRAIN, "rb") as f:
        from_file = load_snapshot(f)
    assert load_snapshot(str(TRAIN)) == from_file == load_snapshot(raw) == train
    as_dict = pickle.loads(raw)  # what torch.cuda.memory._snapshot() returns
    assert load_snapshot(as_dict) == train


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_every_protocol_from_0_to_5(train, protocol):
    data = pickle.dumps(pickle.loads(TRAIN.read_bytes()), protocol=protocol)
    assert protocol < 2 or data[1] == protocol
    assert loads_snapshot(data) == train


def test_protocol5_out_of_band_buffer_is_refused():
    buf = pickle.PickleBuffer(bytearray(b"x" * 64))
    data = pickle.dumps({"segments": [], "blob": buf}, protocol=5, buffer_callback=lambda b: False)
    with pytest.raises(SnapshotError, match="out-of-band"):
        loads_snapshot(data)


def test_protocol5_in_band_bytearray_is_refused():
    data = pickle.dumps({"segments": [], "blob": pickle.PickleBuffer(bytearray(b"abc"))}, protocol=5)
    assert any(op.name == "BYTEARRAY8" for op, _, _ in pickletools.genops(data))
    with pytest.raises(SnapshotError, match="bytearray"):
        loads_snapshot(data)


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _EvilOpen:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("payload", [_Evil, _EvilOpen])
@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path, payload, protocol):
    marker = tmp_path / "pwned"
    data = pickle.dumps({"segments": [], "device_traces": [[]], "x": payload(str(marker))}, protocol=protocol)
    with pytest.raises(SnapshotError, match="refusing to load global") as info:
        loads_snapshot(data)
    assert "Nothing was run" in str(info.value)
    assert not marker.exists()
    # the real unpickler would have run it: the test pickle is live
    pickle.loads(data)
    assert marker.exists()


def test_malicious_file_path_names_the_file(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps(_Evil(str(marker)), protocol=4))
    with pytest.raises(SnapshotError, match=r"evil\.pickle: refusing to load global '(posix|os)\.system'"):
        load_snapshot(path)
    assert not marker.exists()


def test_non_snapshot_class_is_refused():
    with pytest.raises(SnapshotError, match=r"collections\.OrderedDict"):
        loads_snapshot(pickle.dumps(collections.OrderedDict(segments=[]), protocol=2))


def test_set_and_bytes_values_are_refused():
    with pytest.raises(SnapshotError, match="set"):
        loads_snapshot(pickle.dumps({"segments": [], "x": {1, 2}}, protocol=4))
    with pytest.raises(SnapshotError, match="bytes"):
        loads_snapshot(pickle.dumps({"segments": [], "x": b"raw"}, protocol=4))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "empty file"),
        (TRAIN.read_bytes()[:5000], "truncated|not a valid"),
        (TRAIN.read_bytes()[:-1], "truncated|not a valid"),
        (b"\x00garbage\xff" * 10, "not a valid snapshot pickle"),
        (b"PK\x03\x04 zip file", "zip archive, as torch.save"),
        (b"\x80\x09" + b"\x00" * 20, "not a valid snapshot pickle"),
    ],
)
def test_truncated_and_garbage_files(data, match):
    with pytest.raises(SnapshotError, match=match):
        loads_snapshot(data)


def test_missing_file():
    with pytest.raises(SnapshotError, match="cannot read"):
        load_snapshot("/nonexistent/snap.pickle")


def test_text_mode_file_is_refused():
    with pytest.raises(SnapshotError, match="text mode"):
        load_snapshot(io.StringIO("hello"))


def _seg(**over):
    seg = {"address": 4096, "total_size": 2097152, "stream": 0, "segment_type": "small",
           "blocks": [{"address": 4096, "size": 2097152, "requested_size": 0, "state": "inactive"}]}
    seg.update(over)
    return seg


@pytest.mark.parametrize(
    ("snap", "match"),
    [
        ([_seg()], "use torch.cuda.memory._snapshot"),
        (42, "got int"),
        ({"device_traces": [[]]}, "missing key 'segments'"),
        ({"segments": {}}, "'segments' must be a list"),
        ({"segments": [_seg(total_size=4194304)]}, r"segments\[0\]: blocks add up to 2097152 .* 4194304"),
        ({"segments": [_seg(address=-1)]}, r"segments\[0\]: 'address' must be an int from 0"),
        ({"segments": [_seg(blocks=[{"size": 2097152, "state": "free"}])]}, r"segments\[0\]\.blocks\[0\]: 'state'"),
        ({"segments": [_seg(blocks=[{"size": "big", "state": "inactive"}])]}, r"blocks\[0\]: 'size' must be"),
        ({"segments": [_seg(blocks=[{"address": 0, "size": 2097152, "state": "inactive"}])]}, "does not start"),
        ({"segments": [_seg(segment_type="huge")]}, "'segment_type'"),
        ({"segments": [_seg(is_expandable="yes")]}, "'is_expandable' must be True or False, got 'yes'"),
        ({"segments": [], "device_traces": [[{"action": "alloc", "addr": "0x10", "size": 4}]]},
         r"device_traces\[0\]\[0\] \(alloc\): 'addr'"),
        ({"segments": [], "device_traces": [[{"action": 7}]]}, r"'action' must be a string"),
        ({"segments": [], "device_traces": {}}, "'device_traces' must be a list"),
        ({"segments": [], "allocator_settings": []}, "'allocator_settings' must be a dict"),
    ],
)
def test_wrong_shapes_name_what_is_wrong(snap, match):
    with pytest.raises(SnapshotError, match=match):
        load_snapshot(snap) if isinstance(snap, dict) else loads_snapshot(pickle.dumps(snap, protocol=4))


def test_missing_optional_keys_are_filled():
    snap = load_snapshot({"segments": [{"address": 0, "total_size": 1024,
                                        "blocks": [{"size": 512, "state": "active_allocated"},
                                                   {"size": 512, "state": "inactive"}]}]})
    seg = snap["segments"][0]
    assert [b["address"] for b in seg["blocks"]] == [0, 512]
    assert seg["allocated_size"] == 512 and seg["segment_type"] == "small"
    assert snap["device_traces"] == [] and snap["allocator_settings"] == {}

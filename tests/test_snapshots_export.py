"""memviz.snapshots.export: exported pickles are read by PyTorch's own tools (on CPU) and by our loader."""

import io
import pickle
from pathlib import Path

import pytest

torch_memory_viz = pytest.importorskip("torch.cuda._memory_viz")

from memviz.sim import CachingAllocator  # noqa: E402
from memviz.snapshots import (  # noqa: E402
    SnapshotError,
    SnapshotHistory,
    dump_snapshot,
    dumps_snapshot,
    load_snapshot,
    replay,
    to_snapshot,
)
from memviz.units import MiB  # noqa: E402

DATA = Path(__file__).parent / "data" / "snapshots"


@pytest.fixture(scope="module")
def train() -> SnapshotHistory:
    return SnapshotHistory(DATA / "train_snapshot.pickle", progress=False)


def _sources(train):
    a = CachingAllocator(16 << 30)
    keep = [a.malloc(n * MiB + 3) for n in (1, 4, 30)]
    a.free(keep[1])
    return {
        "allocator": a,
        "history_middle": (train, 120),
        "history_end": (train, None),
        "replay_expandable": replay(train, "expandable_segments:True", record_history=True, progress=False),
        "replay_default_no_trace": replay(train, "", progress=False),
    }


@pytest.mark.parametrize("which", ["allocator", "history_middle", "history_end", "replay_expandable",
                                   "replay_default_no_trace"])
def test_pytorch_tools_read_the_export(train, which, tmp_path):
    src = _sources(train)[which]
    source, index = src if isinstance(src, tuple) else (src, None)
    path = tmp_path / "out.pickle"
    dump_snapshot(source, path, index)
    raw = path.read_bytes()
    assert raw[:2] == b"\x80\x04"  # protocol 4, which pytorch.org/memory_viz reads
    data = pickle.loads(raw)
    summary = torch_memory_viz.segsum(data)
    assert f"segments: {len(data['segments'])}" in summary
    reserved = sum(s["total_size"] for s in data["segments"])
    assert "total_reserved" in summary and reserved > 0
    out = torch_memory_viz.trace(data)
    n = sum(len(t) for t in data["device_traces"])
    assert out == "" or f"{n} entries" in out
    assert load_snapshot(raw)["segments"] == load_snapshot(data)["segments"]


def test_history_export_is_the_rebuilt_state(train):
    snap = to_snapshot(train, 120)
    assert snap["segments"] == train.state_at(120)
    assert len(snap["device_traces"][0]) == 121
    assert to_snapshot(train)["segments"] == train.state_at(-1)


def test_replay_export_carries_the_simulated_trace(train):
    r = replay(train, "expandable_segments:True", record_history=True, progress=False)
    snap = load_snapshot(dumps_snapshot(r))
    assert snap["allocator_settings"]["expandable_segments"] is True
    actions = {e["action"] for e in snap["device_traces"][0]}
    assert {"alloc", "free_completed", "segment_map"} <= actions
    assert sum(s["total_size"] for s in snap["segments"]) == r.final_reserved_bytes


def test_export_errors():
    with pytest.raises(SnapshotError, match="cannot export a int"):
        to_snapshot(42)
    with pytest.raises(SnapshotError, match="binary mode"):
        dump_snapshot(CachingAllocator(1 << 30), io.StringIO())

"""Per-rank snapshots on one event scale (memviz.snapshots.ranks), the CPU stand-in recorder
(memviz.snapshots.sim_recording) and the RankViewer, without launching ranks (tests/test_torchrun_example.py does)."""

from __future__ import annotations

import pickle

import pytest
import torch

from memviz.errors import InputError, SnapshotError
from memviz.lab import Lab
from memviz.snapshots import SnapshotHistory, dump_snapshot, load_ranks, load_snapshot
from memviz.snapshots.ranks import EventScale, rank_of_name, simulated_note
from memviz.snapshots.sim_recording import LEFT_OUT, SimRecording
from memviz.widgets import RankViewer
from memviz.widgets.segment_map import segment_bars
from memviz.widgets.snapshot_viewer import event_text

MiB = 1 << 20


def trace(*events: tuple[str, int, int, int]) -> list[dict]:
    """Trace events ``(action, addr, size, time_us)``."""
    return [{"action": a, "addr": addr, "size": size, "stream": 0, "time_us": t} for a, addr, size, t in events]


def one_alloc(addr: int, size: int, t0: int, device: int = 0) -> dict:
    """A snapshot of one device: a 20 MiB segment and one block allocated in it at times t0, t0 + 10."""
    events = trace(("segment_alloc", addr, 20 * MiB, t0), ("alloc", addr, size, t0 + 10))
    blocks = [{"address": addr, "size": size, "requested_size": size, "state": "active_allocated"},
              {"address": addr + size, "size": 20 * MiB - size, "requested_size": 0, "state": "inactive"}]
    segment = {"device": device, "address": addr, "total_size": 20 * MiB, "stream": 0, "segment_type": "large",
               "blocks": blocks}  # fmt: skip
    return {"segments": [segment], "device_traces": [[] for _ in range(device)] + [events]}


# -- the event scale --------------------------------------------------------------------------------


def test_the_time_scale_interleaves_ranks_by_timestamp_keeping_each_rank_s_order():
    scale = EventScale([3, 2], [[10, 30, 30], [20, 30]])  # a tie at 30: the lower rank first
    assert scale.kind == "time" and scale.length == 5
    assert [list(p) for p in scale.positions] == [[0, 2, 3], [1, 4]]
    assert [scale.indices_at(k) for k in range(5)] == [[0, -1], [0, 0], [1, 0], [2, 0], [2, 1]]
    unsorted = EventScale([2, 1], [[50, 10], [20]])  # a rank's own order is kept even if its clock stepped back
    assert [list(p) for p in unsorted.positions] == [[1, 2], [0]]
    with pytest.raises(IndexError, match="position 5 is not on the scale"):
        scale.indices_at(5)


def test_the_index_scale_is_event_k_of_every_rank():
    scale = EventScale([3, 1], None)
    assert (scale.kind, scale.length) == ("index", 3)
    assert [scale.indices_at(k) for k in range(3)] == [[0, 0], [1, 0], [2, 0]]


def test_rank_of_name():
    assert [rank_of_name(n) for n in ("snapshot_rank3.pickle", "/a/rank1/mem-rank_12.pkl", "RANK-2.pickle", "x.pickle")
            ] == [3, 12, 2, None]  # fmt: skip


# -- loading ----------------------------------------------------------------------------------------


def test_load_ranks_reads_a_directory_in_rank_order(tmp_path):
    for rank, (addr, size, t0) in {10: (0x7000000, 3 * MiB, 5), 2: (0x9000000, MiB, 0)}.items():
        dump_snapshot(one_alloc(addr, size, t0), tmp_path / f"snapshot_rank{rank}.pickle")
    (tmp_path / "notes.pickle").write_bytes(pickle.dumps({"not": "a rank"}))  # no rank in its name: not read
    job = load_ranks(tmp_path)
    assert [r.rank for r in job] == [2, 10] and job.scale.kind == "time" and not job.simulated
    assert [list(p) for p in job.scale.positions] == [[0, 2], [1, 3]]  # times 0, 10 and 5, 15
    assert [(row["rank"], row["final_allocated"], row["peak_reserved"]) for row in job.table()] == [
        (2, MiB, 20 * MiB), (10, 3 * MiB, 20 * MiB)]  # fmt: skip


def test_load_ranks_takes_each_file_s_one_device_or_the_one_asked(tmp_path):
    job = load_ranks([one_alloc(0x1000000, MiB, 0, device=1), one_alloc(0x2000000, MiB, 3, device=0)])
    assert [(r.rank, r.device) for r in job] == [(0, 1), (1, 0)]  # ranks by place in the list
    both = one_alloc(0x1000000, MiB, 0)
    both["device_traces"].append(trace(("segment_alloc", 0x3000000, 2 * MiB, 1)))
    with pytest.raises(SnapshotError, match="this process used devices 0, 1; pass device="):
        load_ranks([both])
    assert load_ranks([both], device=1).ranks[0].history.timeline.reserved_bytes[-1] == 2 * MiB


@pytest.mark.parametrize(
    ("source", "kwargs", "error", "words"),
    [
        ("missing-dir", {}, SnapshotError, "not a directory"),
        ([], {}, SnapshotError, "no snapshots given"),
        (one_alloc(0, MiB, 0), {}, InputError, "not one snapshot"),
        ([one_alloc(0, MiB, 0)], {"scale": "wall"}, InputError, "scale must be one of"),
        ([one_alloc(0, MiB, 0)] * 2, {"device": [0]}, InputError, "has 1 indices for 2 snapshots"),
        ([{"segments": [], "device_traces": [[]]}], {}, SnapshotError, "trace has no events"),
        ([b"\x80\x04cos\nsystem\n."], {}, SnapshotError, "refusing to load global 'os.system'"),
    ],
)
def test_load_ranks_refuses_bad_input(tmp_path, source, kwargs, error, words):
    with pytest.raises(error, match=words):
        load_ranks(tmp_path / source if isinstance(source, str) else source, **kwargs)


def test_two_files_of_one_rank_are_refused(tmp_path):
    (tmp_path / "a").mkdir()
    paths = [tmp_path / "snapshot_rank1.pickle", tmp_path / "a" / "snapshot_rank1.pickle"]
    for p in paths:
        dump_snapshot(one_alloc(0, MiB, 0), p)
    with pytest.raises(SnapshotError, match="rank 1 comes twice"):
        load_ranks(paths)


def test_a_trace_without_times_goes_on_the_index_scale():
    untimed = one_alloc(0, MiB, 0)
    for e in untimed["device_traces"][0]:
        del e["time_us"]
    assert load_ranks([untimed, one_alloc(0, MiB, 0)]).scale.kind == "index"
    with pytest.raises(SnapshotError, match="rank 0's trace has events without one: use scale='index'"):
        load_ranks([untimed, one_alloc(0, MiB, 0)], scale="time")


# -- the CPU stand-in -------------------------------------------------------------------------------


def test_sim_recording_follows_storages_views_and_resize():
    resize = torch.UntypedStorage.resize_
    with SimRecording("H200", index=1, note={"rank": 1}) as rec:
        a = torch.empty(1000, dtype=torch.uint8)  # 1000 B: a 1024 B block
        view = a[10:]  # a view: no new storage
        b = torch.zeros(3 * MiB // 4)  # 3 MiB of float32
        storage = b.untyped_storage()
        storage.resize_(0)  # FSDP2's free of an unsharded parameter
        storage.resize_(3 * MiB)  # ... and its return
        del a, view
        c = b + 1  # a new 3 MiB storage
        d = c.view(-1, 4).t()  # a view of it
        del c, d
        snap = rec.snapshot()
    actions = [(e["action"], e["size"]) for e in snap["device_traces"][1]]
    assert actions == [("segment_alloc", 2 * MiB), ("alloc", 1000), ("segment_alloc", 20 * MiB), ("alloc", 3 * MiB),
                       ("free_requested", 3 * MiB), ("free_completed", 3 * MiB), ("alloc", 3 * MiB),
                       ("free_requested", 1000), ("free_completed", 1000), ("alloc", 3 * MiB),
                       ("free_requested", 3 * MiB), ("free_completed", 3 * MiB)]  # fmt: skip
    assert snap["device_traces"][0] == [] and {s["device"] for s in snap["segments"]} == {1}
    note = simulated_note(load_snapshot(snap))
    assert note is not None and note["rank"] == 1 and note["index"] == 1 and note["left_out"] == list(LEFT_OUT)
    assert torch.UntypedStorage.resize_ is resize  # put back
    times = [e["time_us"] for e in snap["device_traces"][1]]
    assert times == sorted(times) and times[0] > 1_600_000_000 * 10**6  # wall-clock microseconds
    del b


def test_sim_recording_raises_torch_s_oom_at_the_op():
    with SimRecording("64 MiB") as rec, pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate 128\.00 MiB"):
        torch.empty(128 * MiB, dtype=torch.uint8)  # fine on the CPU, too much for a simulated 64 MiB GPU
    assert rec.snapshot()["device_traces"][0][-1]["action"] == "oom"


def test_a_dtensor_counts_by_its_local_tensor():
    from torch.distributed.tensor import DeviceMesh, DTensor, Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.distributed.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        mesh = DeviceMesh("cpu", [0, 1])
        local = torch.zeros(512, 1024)  # a 2 MiB shard of a (1024, 1024) float32 parameter
        with SimRecording() as rec:
            param = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
            state = torch.zeros_like(param)  # Adam's exp_avg: a DTensor wrapping a new 2 MiB shard
            allocated = rec.allocator.memory_allocated()
        assert state.to_local().shape == (512, 1024) and allocated == 2 * MiB  # not the wrapper's 4 MiB
    finally:
        torch.distributed.destroy_process_group()


# -- the viewer -------------------------------------------------------------------------------------


def recorded_ranks(tmp_path) -> list:
    """Two ranks' snapshots recorded in this process, one after the other: rank 1 holds a second, larger tensor."""
    paths = []
    for rank in (0, 1):
        with SimRecording("T4", index=rank, note={"rank": rank}) as rec:
            keep = [torch.empty(MiB * (rank + 1), dtype=torch.uint8) for _ in range(rank + 1)]
            for _ in range(3):
                scratch = torch.ones(256 * 1024)
                del scratch
            rec.dump_snapshot(tmp_path / f"snapshot_rank{rank}.pickle")
        del keep
        paths.append(tmp_path / f"snapshot_rank{rank}.pickle")
    return paths


def test_the_viewer_shows_each_rank_at_the_slider(tmp_path):
    viewer = RankViewer(recorded_ranks(tmp_path))
    try:
        job = viewer.job
        assert [r.rank for r in viewer.shown] == [0, 1] and job.scale.kind == "time" and job.simulated
        n0, n1 = (len(r.history) for r in job.ranks)
        assert viewer.scale.length == n0 + n1 and viewer.indices == [0, -1]  # rank 1 ran after rank 0
        assert viewer.texts[1].startswith(f"before its first event (of {n1})")
        viewer.goto(-1)
        assert viewer.indices == [n0 - 1, n1 - 1] and viewer.slider.value == n0 + n1 - 1
        for rank, smap, text in zip(job.ranks, viewer.maps, viewer.texts, strict=True):
            final = rank.history.state_at(-1)
            assert smap.bars == segment_bars(final, smap_names(smap))
            assert text == event_text(rank.history, len(rank.history) - 1)
            assert rank.history.compare_final() == []
        live = [sorted(b["size"] for s in r.history.state_at(-1) for b in s["blocks"]
                       if b["state"] == "active_allocated") for r in job.ranks]  # fmt: skip
        assert live == [[MiB], [2 * MiB, 2 * MiB]]  # each rank's own tensors
        viewer.goto(n0 - 1)  # rank 0's last event: rank 1 has not started
        assert viewer.indices == [n0 - 1, -1]
        assert "simulated" in viewer.header.value and "CPU, simulated" in viewer.table.value
        assert viewer.timelines[1].fig.layout.xaxis.range == (0, n0 + n1 - 1)
        assert min(viewer.timelines[1].fig.data[0].x) == n0  # rank 1's events sit after rank 0's on the scale
        assert viewer.timelines[0].fig.layout.yaxis.range == viewer.timelines[1].fig.layout.yaxis.range
    finally:
        viewer.close()


def smap_names(smap) -> dict[int, str]:
    """The hover names the map drew, by block address."""
    return {a: n for bars in smap.bars.values() for a, n in zip(bars["address"], bars["name"], strict=True)}


def test_the_viewer_refuses_bad_moves_and_picks_and_changes_nothing(tmp_path):
    viewer = RankViewer(recorded_ranks(tmp_path), ranks=[1])
    try:
        assert [r.rank for r in viewer.shown] == [1] and "drawing ranks 1 of 2" in viewer.header.value
        viewer.goto(5)
        before = (viewer.slider.value, list(viewer.indices), list(viewer.texts))
        for bad, error in ((viewer.scale.length, IndexError), (-viewer.scale.length - 1, IndexError),
                           (True, InputError), ("3", InputError)):  # fmt: skip
            with pytest.raises(error):
                viewer.goto(bad)
            assert (viewer.slider.value, viewer.indices, viewer.texts) == before
        assert viewer.next_oom() is None and viewer.bar.oom_button.disabled
    finally:
        viewer.close()
    with pytest.raises(InputError, match=r"ranks= picks 1 to 8 of the job's ranks \(0, 1\), not \[2\]"):
        RankViewer(recorded_ranks(tmp_path), ranks=[2])


def test_the_viewer_jumps_to_a_rank_s_oom_and_shows_real_snapshots_unlabelled():
    labs = [Lab("sim", device=rank, cap="64 MiB") for rank in (0, 1)]
    labs[0].allocate("10 MiB", name="a")
    labs[1].allocate("40 MiB", name="a")
    labs[1].allocate("40 MiB", name="b")  # out of memory on rank 1
    viewer = RankViewer([lab.snapshot() for lab in labs], scale="index")
    try:
        assert not viewer.job.simulated and "simulated" not in viewer.header.value
        target = viewer.next_oom()
        history = viewer.job.ranks[1].history
        assert target == history.timeline.oom_indices[0] and viewer.indices[1] == target
        assert "oom" in viewer.texts[1] and viewer.job.table()[1]["ooms"] == 1
    finally:
        viewer.close()
    assert SnapshotHistory(labs[1].snapshot(), device=1).timeline.oom_indices

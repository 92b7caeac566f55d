"""The lab on the simulator: named tensors, events, OOM as data, and bad input that changes nothing."""

import gc
import sys

import pytest

from memviz.backends import SimulatedBackend, select_backend
from memviz.errors import SizeError
from memviz.lab import Lab

MiB = 1 << 20


@pytest.fixture
def lab():
    return Lab("sim", device="T4", cap="2 GiB")


def state(lab):
    return dict(lab.stats()), list(lab.events), dict(lab.tensors), lab.groups, list(lab.ops)


def test_auto_says_it_uses_the_simulator_without_a_gpu():
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    lab = Lab()
    assert lab.backend.kind == "sim"
    assert lab.describe().startswith("simulator (memviz.sim): Tesla T4")
    assert "simulator" in repr(lab)


def test_allocate_by_size_records_event_with_stats(lab):
    event = lab.allocate("512 MiB", name="big")
    assert event.ok and event.action == "allocate" and event.names == ("big",)
    assert event.nbytes == 512 * MiB
    assert event.allocated_bytes == 512 * MiB == lab.stats()["allocated_bytes.all.current"]
    assert event.reserved_bytes == 512 * MiB
    assert event.delta("segment.all.current") == 1
    assert "536,870,912 B = 512.00 MiB" in event.detail
    assert lab["big"].nbytes == 512 * MiB


def test_seed_demo_5000_small_tensors_fill_99_small_segments(lab):
    lab.allocate("512 MiB", name="big")
    event = lab.allocate((100, 100), "float32", count=5000, name="small")
    assert len(lab.groups["small"]) == 5000 and "small[4999]" in lab
    assert event.detail.startswith("5000 × small: 100 × 100 × 4 B (float32)")
    stats = lab.stats()
    # lessons-facts.md, trace seed-scaled: 100 segments, 99 of them 2 MiB small-pool segments.
    assert stats["segment.small_pool.current"] == 99
    assert stats["segment.all.current"] == 100
    assert stats["reserved_bytes.all.current"] == 710 * MiB
    lab.free("big", "small")
    lab.gc()
    assert lab.stats()["allocated_bytes.all.current"] == 0
    assert lab.stats()["reserved_bytes.all.current"] == 710 * MiB
    assert lab.empty_cache().reserved_bytes == 0


def test_free_only_releases_what_nothing_else_references(lab):
    lab.allocate("256 MiB", name="kept")
    alias = lab["kept"]
    event = lab.free("kept")
    assert event.delta("allocated_bytes.all.current") == 0
    del alias
    assert lab.stats()["allocated_bytes.all.current"] == 0


def test_gc_frees_a_tensor_held_by_a_reference_cycle(lab):
    lab.allocate("256 MiB", name="cyclic")
    cycle = [lab["cyclic"]]
    cycle.append(cycle)
    del cycle
    gc.disable()
    try:
        assert lab.free("cyclic").allocated_bytes == 256 * MiB
        assert lab.gc().allocated_bytes == 0
    finally:
        gc.enable()


def test_oom_is_an_event_and_leaves_nothing_pinned(lab):
    lab.allocate("1 GiB", name="a")
    before = lab.stats()
    event = lab.allocate("3 GiB", name="huge")
    assert not event.ok and event.oom is not None
    assert "Tried to allocate 3.00 GiB" in event.oom.message
    assert "huge" not in lab and event.names == ()
    after = lab.stats()
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    assert after["num_ooms"] == before["num_ooms"] + 1
    assert sys.exc_info() == (None, None, None)
    assert lab.allocate("512 MiB", name="b").ok  # the lab goes on


def test_fill_until_oom_keeps_what_fit(lab):
    event = lab.allocate("4 MiB", count=1000, name="chunk")
    assert not event.ok
    kept = len(lab.groups["chunk"])
    assert event.oom.succeeded == kept == 510  # 102 segments of 20 MiB, five 4 MiB tensors each
    assert f"out of memory after {kept} of 1000" in event.detail


def test_fragmentation_oom_explained_and_no_config_fixes_it(lab):
    lab.allocate("4 MiB", count=1000, name="chunk")
    kept = len(lab.groups["chunk"])
    lab.free(*[f"chunk[{i}]" for i in range(kept) if i % 5])
    event = lab.allocate("200 MiB", name="wide")
    assert not event.ok
    assert "is reserved by PyTorch but unallocated" in event.oom.message
    frag = event.oom.fragmentation
    assert frag.releasable_bytes == 0 and frag.largest_free_large_bytes == 16 * MiB
    why = lab.explain_oom()
    assert why.fragmented and why.replay_reproduces and why.releasable_bytes == 0
    # lessons-facts.md: the same request fails under all five recorded configs.
    assert [w.fits for w in why.what_ifs] == [False] * 5
    assert "fragmented" in str(why)
    assert not lab.empty_cache().delta("reserved_bytes.all.current")


@pytest.mark.parametrize(("conf", "first", "reserved"), [("", 16, 256), ("", 32, 128),
                                                          ("expandable_segments:True", 16, 140),
                                                          ("expandable_segments:True", 32, 140)])  # fmt: skip
def test_order_matters_unless_segments_expand(conf, first, reserved):
    # lessons-facts.md, trace order: 8 × 16 MiB then 4 × 32 MiB reserves 256 MiB; the reverse 128 MiB;
    # expandable segments 140 MiB either way.
    lab = Lab("sim", device="T4", cap="2 GiB", alloc_conf=conf)
    lab.allocate(f"{first} MiB", count=128 // first, name="first")
    lab.free("first")
    lab.allocate(f"{48 - first} MiB", count=128 // (48 - first), name="then")
    assert lab.stats()["reserved_bytes.all.current"] == reserved * MiB


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        ((0,), {}, SizeError), ((-3,), {}, SizeError), ((float("nan"),), {}, SizeError),
        (("12 parsecs",), {}, SizeError), ((1.5,), {}, SizeError), (("1 MiB",), {"count": 0}, ValueError),
        (((2048, 4096, 4096), "float33"), {}, ValueError), (((3, 0),), {}, ValueError),
        (((2**40, 2**40, 2**40),), {}, ValueError), ((40_000, "float32"), {}, ValueError),
        (("1 MiB",), {"name": "kept"}, ValueError), (("1 MiB",), {"name": ""}, ValueError),
        (("1 MiB",), {"name": "x[1]"}, ValueError), (("1 MiB",), {"count": 2.0}, ValueError),
    ],
)  # fmt: skip
def test_bad_input_raises_and_changes_nothing(lab, args, kwargs, error):
    lab.allocate("1 MiB", name="kept")
    before = state(lab)
    with pytest.raises(error):
        lab.allocate(*args, **kwargs)
    assert state(lab) == before


def test_unknown_and_double_free_change_nothing(lab):
    lab.allocate("1 MiB", name="a")
    lab.free("a")
    before = state(lab)
    for names in (("a",), ("nope",), ("a", "nope")):
        with pytest.raises(KeyError, match="no tensor or group named"):
            lab.free(*names)
        assert state(lab) == before
    with pytest.raises(ValueError):
        lab.free()


def test_partial_bad_free_frees_nothing(lab):
    lab.allocate("1 MiB", name="a")
    before = state(lab)
    with pytest.raises(KeyError):
        lab.free("a", "b")
    assert state(lab) == before and "a" in lab


def test_observe_records_memory_changed_outside_the_lab(lab):
    assert lab.observe() is None
    outside = lab.backend.empty(lab._request("64 MiB", None))
    event = lab.observe("cell 3")
    assert event.action == "observe" and event.detail == "cell 3"
    assert event.delta("allocated_bytes.all.current") == 64 * MiB
    del outside
    assert lab.observe().delta("allocated_bytes.all.current") == -64 * MiB


def test_reset_stats_zeroes_counters(lab):
    lab.allocate("3 GiB")
    assert lab.stats()["num_ooms"] == 1
    event = lab.reset_stats()
    assert event.stats_after["num_ooms"] == 0 and event.stats_after["reserved_bytes.all.peak"] == 0


def test_fragmentation_metrics_agree_with_stats(lab):
    lab.allocate("6 MiB", count=4, name="a")
    lab.free("a[1]")
    frag = lab.fragmentation()
    stats = lab.stats()
    assert frag.reserved_bytes == stats["reserved_bytes.all.current"] == 40 * MiB
    assert frag.allocated_bytes == stats["allocated_bytes.all.current"] == 18 * MiB
    assert frag.stranded_bytes == stats["inactive_split_bytes.all.current"]
    assert frag.releasable_bytes == 0
    lab.free_all()
    assert lab.fragmentation().releasable_bytes == 40 * MiB


def test_backend_choices_and_errors():
    assert isinstance(select_backend("sim", device="A100-80GB"), SimulatedBackend)
    assert select_backend("sim", device="24 GiB").total_memory_bytes == 24 << 30
    with pytest.raises(ValueError, match="backend must be one of"):
        select_backend("tpu")
    with pytest.raises(ValueError, match="unknown simulated device"):
        select_backend("sim", device="Voodoo2")
    with pytest.raises(ValueError, match=r"is more than the device's 16\.00 GiB: pass a cap up to"):
        select_backend("sim", device="T4", cap="17 GiB")
    with pytest.raises(ValueError, match="max_split_size_mb"):
        Lab("sim", alloc_conf="max_split_size_mb:5")


def test_cap_can_change_on_a_live_lab():
    lab = Lab("sim", device="T4", cap="2 GiB")
    lab.backend.set_cap(1 << 30)
    assert lab.backend.cap_bytes == 1 << 30
    assert not lab.allocate("1.5 GiB").ok
    lab.backend.set_cap(None)
    assert lab.backend.cap_bytes is None and lab.allocate("1.5 GiB").ok


def test_segments_are_the_snapshots_without_building_or_growing_the_trace(lab):
    lab.allocate("3 MiB", name="a")
    lab.allocate("700 KiB", name="b")
    lab.free("a")
    before = len(lab.snapshot()["device_traces"][0])  # snapshot() adds a "snapshot" entry, as torch does
    segments = lab.segments()
    snap = lab.snapshot()
    assert len(snap["device_traces"][0]) == before + 1  # only this snapshot's own entry: segments() added none
    assert segments == snap["segments"] and len(segments) == 2


def test_group_members_free_one_by_one_and_ops_log_frees_when_memory_goes(lab):
    from memviz.sim.replay import FREE, MALLOC

    lab.allocate(512, count=5, name="g")
    keep = lab["g[1]"]  # a reference outside the lab keeps g[1]'s memory
    lab.free("g[3]")
    assert lab.groups["g"] == ("g[0]", "g[1]", "g[2]", "g[4]")
    lab.free("g")
    assert "g" not in lab.groups and len(lab) == 0
    kinds = [op.kind for op in lab.ops]
    assert kinds.count(MALLOC) == 5 and kinds.count(FREE) == 4
    del keep
    assert [op.kind for op in lab.ops].count(FREE) == 5
    assert lab.stats()["allocated_bytes.all.current"] == 0


def test_a_bulk_allocate_and_free_leave_the_collector_as_they_found_it(lab):
    assert gc.isenabled()
    lab.allocate(512, count=2000, name="g")
    assert gc.isenabled()
    lab.free("g")
    assert gc.isenabled() and len(lab) == 0
    gc.disable()
    try:
        lab.allocate(512, count=2000, name="h")
        lab.free_all()
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert lab.stats()["allocated_bytes.all.current"] == 0

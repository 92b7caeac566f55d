"""The segment map grouped by stream and pool, and the dashboard's streams-and-pools controls, on the simulator."""

from __future__ import annotations

from memviz.lab import Lab
from memviz.widgets import SegmentMap, dashboard, segment_bars

MiB = 1 << 20


def sim_lab() -> Lab:
    return Lab(backend="sim", device="H200")


def labels(m: SegmentMap) -> list[str]:
    return list(m.fig.layout.yaxis.ticktext)


def test_rows_are_grouped_and_labelled_by_stream_and_pool():
    lab = sim_lab()
    lab.new_stream("side")
    lab.new_pool("p")
    lab.allocate("30 MiB", name="s1", stream="side")
    lab.allocate("8 MiB", name="d1")
    lab.allocate("30 MiB", name="s2", stream="side")
    lab.allocate("8 MiB", name="p1", pool="p")
    m = SegmentMap(lab)
    assert labels(m) == ["default stream · large 20.00 MiB", "stream side · large 30.00 MiB",
                         "stream side · large 30.00 MiB", "pool p · large 20.00 MiB"]
    assert m.fig.layout.margin.l > 160  # room for the longer labels
    m.close()


def test_one_stream_keeps_the_plain_labels():
    lab = sim_lab()
    lab.allocate("8 MiB", name="a")
    m = SegmentMap(lab)
    assert labels(m) == ["large 20.00 MiB"] and m.fig.layout.margin.l == 160
    m.close()


def test_a_held_pools_free_segment_is_held_not_releasable_until_the_pool_goes():
    lab = sim_lab()
    lab.new_pool("p")
    lab.allocate("8 MiB", name="a", pool="p")
    lab.free("a")
    m = SegmentMap(lab)
    assert sum(m.bars["held"]["size"]) == 20 * MiB and m.bars["releasable"]["size"] == []
    assert m.drawn_bytes("held") == 20 * MiB
    lab.empty_cache()
    m.refresh()
    assert sum(m.bars["held"]["size"]) == 20 * MiB  # empty_cache() left it: the pool is held
    lab.new_pool("q")
    lab.allocate("8 MiB", name="b", pool="q")
    lab.release_pool("q")  # q's segment holds b: it stays, now in a pool nothing holds
    lab.free("b")
    m.refresh()
    assert sum(m.bars["releasable"]["size"]) == 20 * MiB  # q's whole free segment: empty_cache() would release it
    assert labels(m)[-1] == "pool q (released) · large 20.00 MiB"
    m.close()


def test_a_pending_free_is_its_own_category_with_the_tensors_name():
    lab = sim_lab()
    lab.new_stream("side")
    lab.allocate("30 MiB", name="batch")
    lab.record_stream("batch", "side")
    lab.queue_work("side", 60)
    m = SegmentMap(lab)
    address = lab["batch"].data_ptr()
    lab.free("batch")
    m.refresh()
    assert m.bars["pending"]["size"] == [30 * MiB] and m.bars["live"]["size"] == []
    assert m.bars["pending"]["address"] == [address]
    assert "freed, waiting for another stream" in m.traces[3].hovertext[0]
    m.close()


def test_a_snapshot_without_a_lab_counts_every_private_pool_as_held():
    seg = {"address": 0, "total_size": 2 * MiB, "segment_type": "small", "stream": 5, "segment_pool_id": (1, 0),
           "blocks": [{"address": 0, "size": 2 * MiB, "state": "inactive"}]}
    assert segment_bars([seg])["held"]["size"] == [2 * MiB]
    assert segment_bars([seg], held=lambda pool_id: False)["releasable"]["size"] == [2 * MiB]


def click(d, label: str) -> None:
    d.controls.buttons[label].click()
    assert d.controls.error == "", d.controls.error


def test_the_streams_controls_drive_the_lab_by_click():
    d = dashboard(sim_lab(), live=False, streams=True)
    c, s = d.controls, d.controls.streams
    s.new_name.value = "side"
    click(d, "new stream")
    assert list(s.stream.options) == ["default", "side"]
    s.stream.value = "side"
    c.size.value, c.name.value = "30 MiB", "x"
    click(d, "Allocate")
    assert d.lab.tensors["x"].stream == "side"
    s.stream.value = "default"
    c.name.value = "y"
    click(d, "Allocate")
    assert d.lab.tensors["y"].stream == "default"
    assert [t.split(" · ")[0] for t in d.segment_map.fig.layout.yaxis.ticktext] == ["default stream", "stream side"]
    s.stream.value = "side"
    c.free_pick.value = "y"
    click(d, "record_stream")
    click(d, "queue work")
    click(d, "Free")
    assert d.segment_map.bars["pending"]["size"] == [30 * MiB]
    click(d, "synchronize")
    s.new_name.value = "p"
    click(d, "new pool")
    s.pool.value = "p"
    s.stream.value = "default"
    c.size.value, c.name.value = "8 MiB", "in_p"
    click(d, "Allocate")
    assert d.lab.tensors["in_p"].pool == "p"
    s.new_name.value = "g1"
    s.pool.value = "(device's own)"
    click(d, "begin capture")
    assert d.lab.capturing == "g1" and s.buttons["end capture"].disabled is False
    c.size.value, c.name.value = "32 MiB", "ws"
    click(d, "Allocate")
    click(d, "end capture")
    assert d.lab.tensors["ws"].pool == "g1" and list(s.graph.options) == ["g1"]
    click(d, "replay")
    click(d, "delete graph")
    assert list(s.graph.options) == []
    s.pool.value = "p"
    click(d, "release pool")
    assert list(s.pool.options) == ["(device's own)"]
    d.close()


def test_a_bad_pick_shows_the_labs_message_and_changes_nothing():
    d = dashboard(sim_lab(), live=False, streams=True)
    s = d.controls.streams
    s.new_name.value = "default"
    d.controls.buttons["new stream"].click()
    assert "already" in d.controls.error and list(d.lab.streams) == ["default"]
    d.controls.buttons["record_stream"].click()
    assert "pick a tensor" in d.controls.error
    d.controls.buttons["replay"].click()
    assert "no graph picked" in d.controls.error
    events = len(d.lab.events)
    d.controls.buttons["end capture"].click()
    assert "without begin_capture" in d.controls.error and len(d.lab.events) == events
    d.close()


def test_the_plain_dashboard_has_no_streams_panel():
    d = dashboard(sim_lab(), live=False)
    assert d.controls.streams is None and "new stream" not in d.controls.buttons
    d.close()


def test_the_snapshot_viewers_map_groups_a_recorded_runs_rows_by_stream():
    from memviz.sim import CachingAllocator
    from memviz.widgets import SnapshotViewer

    a = CachingAllocator(80 << 30)
    a.malloc(30 * MiB)
    a.malloc(30 * MiB, stream=0x5A00)
    viewer = SnapshotViewer(a.snapshot(), progress=False, index=-1)  # the state after the last event
    assert list(viewer.map.fig.layout.yaxis.ticktext) == ["default stream · large 30.00 MiB",
                                                          "stream 0x5a00 · large 30.00 MiB"]
    viewer.close()

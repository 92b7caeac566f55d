"""The snapshot scrubber and the what-if table, without a browser: moving the slider must put exactly
``SnapshotHistory.state_at(i)`` and the timeline's numbers into the figures; the what-if table must land on
the real runs (tests/data/snapshots/workload: 9520 MiB default, 5870 MiB with expandable segments)."""

from __future__ import annotations

import io
import pickle
from html import escape
from pathlib import Path

import numpy as np
import pytest

from memviz.snapshots import SnapshotError, SnapshotHistory, dumps_snapshot, what_if
from memviz.widgets import SnapshotViewer, WhatIfTable, segment_bars, what_if_widget
from memviz.widgets._common import MiB
from memviz.widgets.snapshot_viewer import envelope, event_text

DATA = Path(__file__).parent / "data" / "snapshots"
WORKLOAD = DATA / "workload" / "workload_default.pickle"


@pytest.fixture(scope="module")
def history() -> SnapshotHistory:
    return SnapshotHistory(WORKLOAD, progress=False)


@pytest.fixture(scope="module")
def viewer(history):
    v = SnapshotViewer(history)
    yield v
    v.close()


@pytest.fixture(scope="module")
def capped(history) -> WhatIfTable:
    return WhatIfTable(history, {"expandable": "expandable_segments:True"}, cap="6000 MiB", check=False, progress=False)


def oom_snapshot() -> dict:
    """A tiny recording with one OOM (event 2): 1.5 GiB live, a 1 GiB request fails, then the free."""
    return {
        "segments": [],
        "allocator_settings": {},
        "device_traces": [
            [
                {"action": "segment_alloc", "addr": 1 << 30, "size": 1536 * MiB, "stream": 0},
                {"action": "alloc", "addr": 1 << 30, "size": 1536 * MiB, "stream": 0},
                {"action": "oom", "size": 1024 * MiB, "device_free": 0, "stream": 0},
                {"action": "free_requested", "addr": 1 << 30, "size": 1536 * MiB, "stream": 0},
                {"action": "free_completed", "addr": 1 << 30, "size": 1536 * MiB, "stream": 0},
            ]
        ],
    }


def assert_shows(v: SnapshotViewer, i: int) -> None:
    """The figures hold exactly the state after event ``i`` and the cursor is at ``i``."""
    assert not v.out.outputs, v.out.outputs
    assert v.index == v.slider.value == i
    want = segment_bars(v.history.state_at(i))
    assert v.map.bars == {k: {**b, "name": v.map.bars[k]["name"]} for k, b in want.items()}
    n_segments, n_blocks = len(v.history.state_at(i)), sum(len(s["blocks"]) for s in v.history.state_at(i))
    assert v.map.fig.layout.title.text == f"{n_segments} segments, {n_blocks:,} blocks"
    assert v.map.widget.children == (v.map.fig, v.map.legend) and v.map.widget in v.widget.children[4].children
    assert v.map.drawn_bytes("live") == sum(want["live"]["size"])
    shape = v.timeline_fig.layout.shapes[0]
    assert shape.x0 == shape.x1 == i
    assert v.text.startswith(event_text(v.history, i))
    assert f"event {i:,} of {len(v.history):,}: {v.history.events[i]['action']}" in v.text


def test_timeline_holds_every_event(viewer, history):
    tl = history.timeline
    data = viewer.timeline_fig.data
    assert [t.name for t in data[:3]] == ["allocated", "reserved", "active"]
    for trace, series in zip(data[:3], (tl.allocated_bytes, tl.reserved_bytes, tl.active_bytes), strict=True):
        series = np.asarray(series)
        x = np.asarray(trace.x)
        assert x[0] == 0 and x[-1] == len(history) - 1 == 63_007 and (np.diff(x) > 0).all()
        assert len(x) <= 4 * 2000  # the envelope of 63,008 events
        assert (np.asarray(trace.y) * MiB == series[x]).all()  # exact values (MiB are bytes / 2**20)
        assert (series.max(), series.min()) == (max(trace.y) * MiB, min(trace.y) * MiB)
    assert max(data[1].y) == 9520  # MiB: the recorded peak reserved
    assert list(data[3].x) == []  # no recorded OOM
    assert "63,008 events" in viewer.widget.children[0].value


@pytest.mark.parametrize("i", [0, 1, 2047, 2048, 31_000, 30_999, 62_000, 63_007])
def test_slider_moves_redraw_the_state_at_that_event(viewer, i):
    viewer.slider.value = i
    assert_shows(viewer, i)


def test_step_buttons_and_goto(viewer, history):
    viewer.goto(100)
    viewer.next_button.click()
    assert_shows(viewer, 101)
    viewer.prev_button.click()
    viewer.prev_button.click()
    assert_shows(viewer, 99)
    viewer.goto(-1)
    viewer.next_button.click()  # clamped at the last event
    assert_shows(viewer, len(history) - 1)
    with pytest.raises(IndexError, match="63,008 events"):
        viewer.goto(len(history))


def test_envelope_keeps_every_peak_and_trough():
    rng = np.random.default_rng(0)
    values = rng.integers(0, 1 << 40, 50_001)
    idx = envelope(values, buckets=100)
    assert len(idx) <= 400 and idx[0] == 0 and idx[-1] == 50_000 and (np.diff(idx) > 0).all()
    width = -(-50_001 // 100)
    for start in range(0, 50_001, width):
        chunk = values[start : start + width]
        assert {start + int(chunk.argmax()), start + int(chunk.argmin())} <= set(idx.tolist())
    assert list(envelope(values[:400], buckets=100)) == list(range(400))


def test_no_oom_means_a_disabled_button_and_a_message(viewer):
    assert viewer.oom_indices == [] and viewer.oom_button.disabled
    assert viewer.next_oom() is None
    assert "no OOM event" in viewer.status.value


def test_next_oom_jumps_to_recorded_ooms():
    v = SnapshotViewer(oom_snapshot())
    try:
        assert v.oom_indices == [2] and not v.oom_button.disabled
        assert list(v.timeline_fig.data[3].x) == [2]
        v.oom_button.click()
        assert_shows(v, 2)
        assert "oom" in v.text and "1.00 GiB" in v.text and "color:#d62728" in v.readout.value
        v.oom_button.click()  # none after: wraps to the first
        assert v.slider.value == 2 and "wrapped" in v.status.value
    finally:
        v.close()


def test_next_oom_visits_what_if_ooms(history, capped):
    default = capped.result("recorded")
    assert default.oom_event_indices[:2] == [7708, 13990]
    v = SnapshotViewer(history, replay=default)
    try:
        assert v.oom_indices == default.oom_event_indices and not v.oom_button.disabled
        assert v.timeline_fig.data[4].name == "reserved, what-if recorded"
        v.oom_button.click()
        assert_shows(v, 7708)
        assert "what-if recorded: this request would fail (OOM)" in v.readout.value
        v.oom_button.click()
        assert v.slider.value == 13990
        header = v.header.value  # says which OOMs it counts: none recorded, some in the replay
        assert "no OOM in the recording" in header and "the what-if replay (recorded) runs out of memory" in header
    finally:
        v.close()


DEJAVU = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")  # what CI installs (fonts-dejavu-core)


def bmp_code_points(font: Path) -> set[int]:
    """The BMP characters a TrueType font draws (its format-4 cmap subtable)."""
    import struct

    data = font.read_bytes()
    tables = {data[12 + 16 * i : 16 + 16 * i]: struct.unpack(">II", data[20 + 16 * i : 28 + 16 * i])[0]
              for i in range(struct.unpack(">H", data[4:6])[0])}  # fmt: skip
    cmap = tables[b"cmap"]
    for k in range(struct.unpack(">H", data[cmap + 2 : cmap + 4])[0]):
        offset = cmap + struct.unpack(">I", data[cmap + 8 + 8 * k : cmap + 12 + 8 * k])[0]
        if struct.unpack(">H", data[offset : offset + 2])[0] == 4:
            n = struct.unpack(">H", data[offset + 6 : offset + 8])[0] // 2
            ends = struct.unpack(f">{n}H", data[offset + 14 : offset + 14 + 2 * n])
            starts = struct.unpack(f">{n}H", data[offset + 16 + 2 * n : offset + 16 + 4 * n])
            return {c for a, b in zip(starts, ends, strict=True) for c in range(a, b + 1)}
    raise AssertionError(f"{font} has no format-4 cmap")


@pytest.mark.skipif(not DEJAVU.exists(), reason="fonts-dejavu-core is not installed")
def test_every_button_label_has_its_glyphs_in_the_fonts_ci_installs(history):
    from memviz.widgets import dashboard

    drawn = bmp_code_points(DEJAVU)
    v, d = SnapshotViewer(history), dashboard(backend="sim", device="T4", live=False)
    try:
        buttons = [v.prev_button, v.next_button, v.oom_button, *d.controls.buttons.values(), d.oom.explain_button]
        missing = {b.description: [c for c in b.description if ord(c) not in drawn] for b in buttons}
        assert not {k: m for k, m in missing.items() if m}
        assert "⏭" not in v.oom_button.description and ord("⏭") not in drawn  # the glyph the issue saw missing
    finally:
        v.close()
        d.close()


def test_callback_errors_show_in_the_output(history, monkeypatch):
    v = SnapshotViewer(history)
    try:

        def broken(i):
            raise ZeroDivisionError("boom")

        monkeypatch.setattr(v.history, "state_at", broken)
        v.slider.value = 5
        assert "ZeroDivisionError: boom" in "".join(o["text"] for o in v.out.outputs)
    finally:
        monkeypatch.undo()
        v.close()


def test_what_if_table_lands_on_the_real_runs(history):
    w = what_if_widget(history, {"expandable": "expandable_segments:True"}, progress=False)
    try:
        text = w.table()
        lines = text.splitlines()
        assert lines[0] == "device: unlimited"  # one device: a caption, no device column
        assert lines[2].split()[:2] == ["config", "reserved"]  # the headers' second line
        recorded = next(line for line in lines if line.startswith("recorded: default"))
        expandable = next(line for line in lines if line.startswith("expandable: expandable_segments:True"))
        assert "9520 MiB" in recorded and " 102 " in recorded and "41.1%" in recorded
        assert "5870 MiB" in expandable and " 85 " in expandable
        assert " ".join(lines[lines.index(expandable) + 1:]) == (
            "replaying under the recorded config (default) reproduces the recording: segment states match at 25 "
            "of 25 sampled events, reserved bytes at 41,979 of 41,979 requests, allocated bytes at 41,979 of "
            "41,979 requests"
        )
        assert w.fidelity is not None and w.fidelity.exact
        assert [r.result.peak_reserved_bytes for r in w.rows] == [9520 * MiB, 5870 * MiB]
        assert "9520 MiB" in w.html.value and escape(w.fidelity.describe()) in w.html.value
        assert "color:#2ca02c" in w.html.value  # the fidelity sentence is green
        assert list(w.figure.data[0].x) == [9520, 5870]
    finally:
        w.close()


def test_what_if_table_and_report_print_the_same_rows(history):
    """One implementation: the widget's text is the report's table under a device caption."""
    w = WhatIfTable(history, ["expandable_segments:True"], progress=False)
    assert w.table() == f"device: unlimited\n{w.reports[0].table()}"
    assert max(len(line) for line in w.table().splitlines()) == 100  # a lesson prints it within 100 columns


def test_what_if_under_a_cap_the_default_ooms_and_expandable_fits(capped):
    text = capped.table()
    assert text.splitlines()[0] == "device: unlimited, cap 6000 MiB"
    recorded = next(line for line in text.splitlines() if line.startswith("recorded: default"))
    expandable = next(line for line in text.splitlines() if line.startswith("expandable:"))
    assert recorded.split()[-6:-4] == ["2", "7,708"]
    assert "5870 MiB" in expandable and expandable.split()[-6:-4] == ["0", "-"]
    assert capped.fidelity is None and "reproduces" not in text
    assert "color:#d62728" in capped.html.value  # the OOM cells are red
    assert capped.figure.data[0].marker.color == ("#d62728", "#ff7f0e")


def test_several_devices_and_the_fidelity_check_on_the_small_recording():
    w = WhatIfTable(
        DATA / "train_snapshot.pickle", ["expandable_segments:True"], device_sizes=[None, "T4"], progress=False
    )
    assert [(r.config, r.device) for r in w.rows] == [
        ("recorded", "unlimited"),
        ("expandable_segments:True", "unlimited"),
        ("recorded", "Tesla T4 16 GB"),
        ("expandable_segments:True", "Tesla T4 16 GB"),
    ]
    lines = w.table().splitlines()
    assert lines[1].split()[:2] == ["config", "device"]  # several devices: a device column
    assert lines[4].split()[2:4] == ["unlimited", "236"] and lines[6].split()[2:6] == ["Tesla", "T4", "16", "GB"]
    assert "segment states match at 25 of 25 sampled events" in " ".join(lines)


def test_bad_sources_say_what_is_wrong(tmp_path):
    with pytest.raises(TypeError, match="cannot show a int"):
        SnapshotViewer(42)
    with pytest.raises(SnapshotError, match="cannot read"):
        SnapshotViewer(tmp_path / "missing.pickle")
    with pytest.raises(SnapshotError, match="not a valid snapshot pickle"):
        SnapshotViewer(b"this is not a pickle")
    with pytest.raises(SnapshotError, match="no device_traces events"):
        SnapshotViewer({"segments": [], "device_traces": [[]]})

    class Evil:
        def __reduce__(self):
            return (print, ("this must not run",))

    with pytest.raises(SnapshotError, match=r"refusing to load global 'builtins\.print'"):
        SnapshotViewer(pickle.dumps(Evil()))
    with pytest.raises(SnapshotError, match="no device_traces"):
        WhatIfTable({"segments": [], "device_traces": [[]]}, progress=False)
    with pytest.raises(TypeError, match="cannot show"):
        WhatIfTable([1, 2, 3], progress=False)
    small = oom_snapshot()
    with pytest.raises(ValueError, match="unknown simulated device"):
        WhatIfTable(small, device_sizes=["GTX 9090"], progress=False)
    with pytest.raises(ValueError, match="cap_bytes must be between"):
        WhatIfTable(small, device_sizes=["T4"], cap="20 GiB", progress=False)
    # the widget names its configs as what_if does (one rule): a bare string is refused, with the fix
    for make in (WhatIfTable, what_if):
        with pytest.raises(TypeError, match=r"wrap it, configs=\['expandable_segments:True'\]"):
            make(small, "expandable_segments:True", progress=False)
        with pytest.raises(TypeError, match="config 'x' must be a PYTORCH_CUDA_ALLOC_CONF string, not int"):
            make(small, {"x": 3}, progress=False)
    with pytest.raises(ValueError, match="timeline=True"):
        from memviz.snapshots import replay

        SnapshotViewer(small, replay=replay(small, timeline=False, progress=False))


def test_sources_of_every_kind(tmp_path):
    snap = oom_snapshot()
    data = dumps_snapshot(snap)
    path = tmp_path / "run.pickle"
    path.write_bytes(data)
    for source in (snap, data, path, str(path), io.BytesIO(data), SnapshotHistory(snap)):
        v = SnapshotViewer(source, index=-1)
        assert v.slider.max == 4 and v.index == 4 and v.text.startswith("event 4 of 5: free_completed")
        v.close()


def test_what_if_table_replays_on_first_use_not_when_made(history):
    w = WhatIfTable(history, {"expandable": "expandable_segments:True"}, check=False, progress=False)
    assert "grid" not in w.__dict__  # made, nothing replayed yet
    assert w.result("expandable").peak_reserved_bytes == 5870 * MiB and "grid" in w.__dict__
    assert "white-space:nowrap" in w.html.value and "overflow-x:auto" in w.html.value  # cells never wrap
    w.close()

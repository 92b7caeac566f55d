"""The widgets without a browser: ``button.click()`` drives every control, and what the figures hold must
equal the lab's own numbers after each step (gauges, timeline, segment map, event log, OOM banner)."""

from __future__ import annotations

import gc
import weakref

import pytest

from memviz.lab import Lab
from memviz.widgets import (
    CellHook,
    Controls,
    MemoryGauges,
    SegmentMap,
    Timeline,
    dashboard,
    segment_bars,
)
from memviz.widgets._common import MiB, exact_bytes
from memviz.widgets.controls import parse_size_field
from memviz.widgets.event_log import event_line
from memviz.widgets.segment_map import CATEGORIES

N_TRACES = len(CATEGORIES) + 1  # the segment map's traces in each set: one per category, then the block edges

ALLOC, RES, ACTIVE = "allocated_bytes.all.current", "reserved_bytes.all.current", "active_bytes.all.current"


def sim_lab(**kw) -> Lab:
    return Lab(backend="sim", device="T4", cap="2 GiB", **kw)


@pytest.fixture
def dash():
    d = dashboard(sim_lab(), live=False)
    yield d
    d.close()


def click(d, label: str, **fields) -> None:
    for field, value in fields.items():
        getattr(d.controls, field).value = value
    d.controls.buttons[label].click()
    assert not d.out.outputs, d.out.outputs  # no unexpected error printed a traceback


def assert_matches_lab(d) -> None:
    """Every piece shows exactly the lab's stats and snapshot of now."""
    lab = d.lab
    stats = lab.stats()
    g = d.gauges.values
    assert (g["allocated"], g["reserved"]) == (stats[ALLOC], stats[RES])
    assert g["allocated_peak"] == stats["allocated_bytes.all.peak"]
    rows = {r["key"]: r["text"] for r in d.gauges.widget.rows}
    assert rows["allocated"] == exact_bytes(stats[ALLOC]) and rows["reserved"] == exact_bytes(stats[RES])
    data = d.timeline.fig.data
    assert len(data[0].y) == len(lab.events) + 1
    assert (data[0].y[-1] * MiB, data[1].y[-1] * MiB, data[2].y[-1] * MiB) == (stats[ALLOC], stats[RES], stats[ACTIVE])
    frag = lab.fragmentation()
    bars = d.segment_map.bars
    assert sum(bars["live"]["size"]) == stats[ALLOC]
    assert sum(bars["releasable"]["size"]) == frag.releasable_bytes
    assert sum(bars["stuck"]["size"]) == frag.stranded_bytes
    assert sum(sum(b["size"]) for b in bars.values()) == stats[RES]
    drawn = {cat: d.segment_map.drawn_bytes(cat) for cat in bars}
    assert drawn == {cat: sum(b["size"]) for cat, b in bars.items()}
    assert sum(drawn.values()) == stats[RES]
    assert d.log.lines[0] == event_line(lab.events[-1]) if lab.events else d.log.lines == []
    assert list(d.controls.free_pick.options) == list(lab.groups) + [
        n for n, t in lab.tensors.items() if t.group is None
    ]


def test_every_control_by_click(dash):
    assert_matches_lab(dash)
    click(dash, "Allocate", size="512 MiB", name="big")
    assert dash.lab.stats()[ALLOC] == 512 * MiB
    assert_matches_lab(dash)
    click(dash, "Allocate", size="(100, 100)", dtype="float32", count=50, name="small")
    assert len(dash.lab.groups["small"]) == 50
    assert_matches_lab(dash)
    texts = [text for trace in dash.segment_map.traces[:3] if trace.hovertext is not None for text in trace.hovertext]
    names = {text.split("</b>")[0][3:] for text in texts if text}
    assert {"big", "small[0]", "small[49]", "free"} <= names
    click(dash, "Allocate", size="(2048, 1024)", dtype="bfloat16", count=1, name="")  # auto name t0
    assert dash.lab.tensors["t0"].request.nbytes == 2048 * 1024 * 2
    assert_matches_lab(dash)
    click(dash, "Free", free_pick="big")
    assert "big" not in dash.lab and dash.lab.stats()[RES] > dash.lab.stats()[ALLOC]
    assert_matches_lab(dash)
    click(dash, "gc.collect()")
    assert_matches_lab(dash)
    click(dash, "empty_cache()")
    assert dash.lab.events[-1].delta(RES) == -512 * MiB
    assert_matches_lab(dash)
    click(dash, "reset stats")
    assert dash.lab.stats()["allocated_bytes.all.peak"] == dash.lab.stats()[ALLOC]
    assert_matches_lab(dash)
    click(dash, "Free all")
    assert len(dash.lab) == 0 and dash.lab.stats()[ALLOC] == 0
    assert_matches_lab(dash)
    actions = [e.action for e in dash.lab.events]
    assert actions == ["allocate"] * 3 + ["free", "gc", "empty_cache", "reset_stats", "free"]
    assert dash.timeline.marks == {"gc.collect()": [4], "empty_cache()": [5], "OOM": []}
    markers = dash.timeline.fig.data[3]
    assert list(markers.x) == [4, 5] and list(markers.marker.symbol) == ["triangle-down", "diamond"]
    assert [y * MiB for y in markers.y] == [e.reserved_bytes for e in dash.lab.events[4:6]]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"size": "12 parsecs"}, "unknown unit 'parsecs'"),
        ({"size": "(100, x)"}, "cannot read '(100, x)' as a shape"),
        ({"size": "1 MiB", "name": "a"}, "'a' is already in the lab"),
        ({"size": "1 MiB", "name": "bad[name"}, "a name must be"),
    ],
)
def test_bad_input_shows_the_message_and_changes_nothing(dash, fields, message):
    click(dash, "Allocate", size="1 MiB", name="a")
    before = (len(dash.lab.events), dict(dash.lab.stats()), dict(dash.lab.tensors))
    click(dash, "Allocate", **fields)
    assert message in dash.controls.error
    assert "memviz-error" in dash.controls.status.value and message.split("'")[0] in dash.controls.status.value
    assert (len(dash.lab.events), dict(dash.lab.stats()), dict(dash.lab.tensors)) == before
    click(dash, "Allocate", size="2 MiB", name="b")  # the next good click clears the error
    assert dash.controls.error == "" and "b" in dash.lab


def test_free_with_nothing_to_free_is_a_message(dash):
    click(dash, "Free")
    assert "nothing to free" in dash.controls.error and not dash.lab.events


def test_oom_banner_and_marker(dash):
    click(dash, "Allocate", size="4 MiB", count=500, name="fill")  # 2000 MiB of the 2 GiB cap
    click(dash, "Allocate", size="1 GiB", count=1, name="huge")
    event = dash.lab.events[-1]
    assert not event.ok and event.oom is not None
    assert dash.oom.widget.layout.display != "none"
    assert dash.oom.summary.startswith(f"Out of memory at event #{event.index}: 1.00 GiB requested")
    assert "CUDA out of memory" in dash.oom.text and "Tried to allocate" in dash.oom.html.value
    assert "<details" in dash.oom.html.value  # PyTorch's message behind a disclosure
    assert not dash.oom._explained  # no replay until asked
    dash.oom.explain_button.click()
    assert str(dash.lab.explain_oom(event)) in dash.oom.text
    assert "memviz-oom-explanation" in dash.oom.explanation_html.value
    assert dash.oom.explain_button.layout.display == "none"
    assert dash.timeline.marks["OOM"] == [event.index] == list(dash.timeline.fig.data[3].x)
    assert dash.timeline.fig.data[3].hovertext[0] == f"OOM at #{event.index}"
    assert "OOM! " in dash.log.lines[0] and "memviz-event-oom" in dash.log.widget.value
    assert_matches_lab(dash)
    click(dash, "Free", free_pick="fill")
    assert dash.oom.text == "" and dash.oom.widget.layout.display == "none"
    assert_matches_lab(dash)


def test_new_lab_with_another_config(dash):
    old = dash.lab
    click(dash, "Allocate", size="6 MiB", name="x")
    dash.controls.config.value = "expandable_segments:True"
    dash.controls.cap.value = "1 GiB"
    click(dash, "new lab")
    assert dash.lab is not old and len(old) == 0 and old.stats()[ALLOC] == 0  # the old lab's tensors freed
    assert dash.lab.backend.alloc_conf == "expandable_segments:True" and dash.lab.backend.cap_bytes == 1 << 30
    assert all(p.lab is dash.lab for p in dash.pieces)
    assert "expandable_segments:True" in dash.header.value and "new lab" in dash.controls.status.value
    assert list(dash.timeline.fig.data[0].x) == [-1]  # the new lab's start, before its event #0
    click(dash, "Allocate", size="6 MiB", name="y")
    assert dash.lab.stats()[RES] == 20 * MiB  # one 20 MiB expandable page
    assert_matches_lab(dash)
    assert dash.gauges.values["limit"] == 1 << 30


def test_bad_config_changes_nothing(dash):
    old = dash.lab
    dash.controls.config.value = "max_split_size_mb:bogus"
    click(dash, "new lab")
    assert dash.lab is old and "max_split_size_mb" in dash.controls.error
    dash.controls.config.value = "default"
    dash.controls.cap.value = "12 parsecs"
    click(dash, "new lab")
    assert dash.lab is old and "parsecs" in dash.controls.error


def test_real_gpu_disabled_without_cuda(dash):
    from memviz.backends import cuda_available

    if cuda_available():
        pytest.skip("CUDA is available here")
    assert list(dash.controls.kind.options) == ["simulator"]
    disabled = [w for w in dash.controls.backend.row.children if getattr(w, "disabled", False)]
    assert any(w.description == "real GPU" and "CUDA" in w.tooltip for w in disabled)


def test_unexpected_error_prints_traceback_in_output(dash, monkeypatch):
    def boom():
        raise ZeroDivisionError("bug")

    monkeypatch.setattr(dash.lab, "gc", boom)
    dash.controls.buttons["gc.collect()"].click()  # must not raise
    assert dash.out.outputs and "ZeroDivisionError: bug" in dash.out.outputs[0]["text"]


def test_parse_size_field():
    assert parse_size_field(" (2048, 4096) ") == ((2048, 4096), True)
    assert parse_size_field("100x100") == ((100, 100), True)
    assert parse_size_field("[7]") == ((7,), True)
    assert parse_size_field("512 MiB") == ("512 MiB", False)
    assert parse_size_field("40000") == ("40000", False)
    with pytest.raises(ValueError, match="as a shape"):
        parse_size_field("(1, two)")


# -- the segment map ---------------------------------------------------------------------------------------


def test_segment_map_expandable_pages():
    lab = sim_lab(alloc_conf="expandable_segments:True")
    lab.allocate("4 MiB", count=15, name="x")  # 60 MiB: three 20 MiB pages
    lab.free(*[f"x[{i}]" for i in range(5, 15)])  # the last two pages hold no tensor
    m = SegmentMap(lab)
    frag = lab.fragmentation()
    assert frag.releasable_bytes == 40 * MiB
    assert sum(m.bars["releasable"]["size"]) == 40 * MiB
    assert sum(m.bars["stuck"]["size"]) == frag.stranded_bytes
    assert sum(m.bars["live"]["size"]) == 20 * MiB
    m.close()


def test_segment_bars_ragged_free_block_in_expandable_segment():
    seg = {"address": 0, "total_size": 60 * MiB, "segment_type": "large", "is_expandable": True,
           "blocks": [{"address": 0, "size": 6 * MiB, "requested_size": 6 * MiB, "state": "active_allocated"},
                      {"address": 6 * MiB, "size": 54 * MiB, "requested_size": 0, "state": "inactive"}]}  # fmt: skip
    bars = segment_bars([seg], {0: "w"})
    assert bars["live"]["name"] == ["w"]
    assert list(zip(bars["stuck"]["offset"], bars["stuck"]["size"], strict=True)) == [(6 * MiB, 14 * MiB)]
    assert list(zip(bars["releasable"]["offset"], bars["releasable"]["size"], strict=True)) == [(20 * MiB, 40 * MiB)]


def test_segment_map_10k_blocks_is_a_few_webgl_traces():
    lab = sim_lab()
    lab.allocate("100 KiB", count=10_000, name="x")
    lab.free(*[f"x[{i}]" for i in range(0, 10_000, 3)])
    m = SegmentMap(lab)
    segments, stats = lab.segments(), lab.stats()
    n_blocks = sum(len(s["blocks"]) for s in segments)
    assert n_blocks >= 10_000 and m.webgl
    assert [t.type for t in m.traces] == ["scattergl"] * N_TRACES and not m.fig.layout.shapes  # a few, no shapes
    assert sum(len(t.x) for t in m.traces[:-1]) == 3 * n_blocks
    assert sum(m.bars["live"]["size"]) == stats[ALLOC] == m.drawn_bytes("live")
    m.close()


def test_segment_map_is_svg_up_to_svg_max_blocks_then_webgl_and_back():
    lab = sim_lab()
    m = SegmentMap(lab)
    lab.allocate("1 MiB", name="a")
    m.refresh()
    assert not m.webgl and len(m.fig.data) == 2 * N_TRACES and [t.type for t in m.traces] == ["scatter"] * N_TRACES
    assert not any(t.visible for t in m.fig.data[N_TRACES:])  # the WebGL set, hidden
    lab.allocate("100 KiB", count=m.svg_max_blocks, name="many")  # now more blocks than svg_max_blocks
    m.refresh()
    svg, gl = m.fig.data[:N_TRACES], m.fig.data[N_TRACES:]
    assert m.webgl and m.traces == gl and [t.type for t in gl] == ["scattergl"] * N_TRACES
    assert [t.name for t in gl] == [t.name for t in svg] == [label for _, label, _ in CATEGORIES] + ["block edges"]
    assert all(t.visible for t in gl) and not any(t.visible for t in svg) and all(len(t.x) == 0 for t in svg)
    assert m.drawn_bytes("live") == lab.stats()[ALLOC]
    lab.free("many")
    m.refresh()
    assert not m.webgl and m.traces == svg and all(t.visible for t in svg) and not any(t.visible for t in gl)
    assert m.drawn_bytes("live") == 1 << 20 and all(len(t.x) == 0 for t in gl)
    m.close()


# -- pieces alone, live refresh, and closing -----------------------------------------------------------------


def test_pieces_alone():
    lab = sim_lab()
    g, t, m = MemoryGauges(lab), Timeline(lab), SegmentMap(lab)
    lab.allocate("64 MiB", name="a")
    for piece in (g, t, m):
        piece.refresh()
    assert g.values["allocated"] == 64 * MiB and t.fig.data[0].y[-1] == 64
    assert m.bars["live"]["name"] == ["a"] and "64.00 MiB (67,108,864 B)" in str(g.widget.rows)
    c = Controls(lab)
    c.size.value = "1 MiB"
    c.buttons["Allocate"].click()
    assert c.error == "" and list(c.free_pick.options) == ["a", "t0"]
    for piece in (g, t, m, c):
        piece.close()


def test_legends_name_every_trace_once():
    lab = sim_lab()
    t, m = Timeline(lab), SegmentMap(lab)
    assert not t.fig.layout.showlegend and not m.fig.layout.showlegend  # HTML legends instead (drawn once)
    from memviz.widgets.timeline import MARKERS

    names = {t: [trace.name for trace in t.fig.data[:3]] + [kind for kind, _, _, _ in MARKERS],
             m: [trace.name for trace in m.traces[:-1]]}  # fmt: skip
    for piece, labels in names.items():
        assert piece.widget.children == (piece.fig, piece.legend)
        for label in labels:
            assert piece.legend.value.count(f"> {label}</span>") == 1, label
    t.close()
    m.close()


def _sent_methods(fig, state: dict) -> list[str]:
    """The comm messages ``fig`` sends when the browser sets ``state`` (ipywidgets' own ``set_state``)."""
    sent: list[str] = []
    send = fig._send
    fig._send = lambda msg, buffers=None: (sent.append(msg["method"]), send(msg, buffers))
    fig.set_state(state)
    return sent


def test_figures_do_not_echo_plotlys_reports_back_to_the_browser():
    import plotly.graph_objects as go

    from memviz.widgets.figure import Figure

    report = {"_js2py_layoutDelta": {"layout_delta": {}, "layout_edit_id": 0}}
    assert "echo_update" in _sent_methods(go.FigureWidget(), report)  # what plotly's own widget does
    assert "echo_update" not in _sent_methods(Figure(), report)
    lab = sim_lab()
    for fig in (Timeline(lab).fig, SegmentMap(lab).fig):
        assert isinstance(fig, Figure) and fig._config["plotGlPixelRatio"] == 1  # what plotly.js reads


@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    sh = InteractiveShell.instance()
    yield sh
    InteractiveShell.clear_instance()


def test_post_run_cell_refreshes_plain_code_changes(shell):
    d = dashboard(sim_lab())  # live: registers with get_ipython(), the shell above
    assert d._hook is not None and d._hook.active
    shell.user_ns["dash"] = d
    shell.run_cell("dash.lab.allocate('256 MiB', name='w')")  # the lab called from a cell
    assert d.gauges.values["allocated"] == 256 * MiB
    shell.run_cell("keep = dash.lab['w']; dash.lab.free('w')")  # a plain reference keeps it alive
    assert d.gauges.values["allocated"] == 256 * MiB
    shell.run_cell("del keep")  # plain code frees it: an "observe" event, logged after the cell
    last = d.lab.events[-1]
    assert last.action == "observe" and last.detail.startswith("cell ") and last.delta(ALLOC) == -256 * MiB
    assert d.gauges.values["allocated"] == 0 and d.timeline.fig.data[0].y[-1] == 0
    n = len(d.lab.events)
    shell.run_cell("x = 1")  # nothing changed: no event, no refresh
    assert len(d.lab.events) == n
    callbacks = shell.events.callbacks["post_run_cell"]
    assert d._hook._callback in callbacks
    hook_cb = d._hook._callback
    del shell.user_ns["dash"]
    d.close()
    assert hook_cb not in callbacks
    ref = weakref.ref(d)
    del d
    gc.collect()
    assert ref() is None, gc.get_referrers(ref())


def test_hook_holds_its_target_weakly(shell):
    lab = sim_lab()
    t = Timeline(lab).watch()
    cb = t._hook._callback
    assert cb in shell.events.callbacks["post_run_cell"]
    lab.allocate("1 MiB")
    shell.run_cell("pass")
    assert t.fig.data[0].y[-1] * MiB == lab.stats()[ALLOC]
    ref = weakref.ref(t)
    from memviz.widgets._common import close_tree

    close_tree(t.widget)  # closed widget, but the hook not unregistered: it must not keep t alive
    del t
    gc.collect()
    assert ref() is None
    shell.run_cell("pass")  # the callback notices and unregisters itself
    assert cb not in shell.events.callbacks["post_run_cell"]


def test_hook_without_ipython_does_nothing():
    class Target:
        def on_cell(self, n):
            raise AssertionError("no shell, no calls")

    hook = CellHook(Target(), shell=None) if _no_ipython() else None
    if hook is not None:
        assert not hook.active
        hook.unregister()


def _no_ipython() -> bool:
    from IPython import get_ipython

    return get_ipython() is None


def test_timeline_numbers_events_as_the_log_does(dash):
    click(dash, "Allocate", size="512 MiB", name="big")
    click(dash, "Free", free_pick="big")
    click(dash, "gc.collect()")
    click(dash, "empty_cache()")
    data = dash.timeline.fig.data
    xs, texts = list(data[0].x), list(data[0].hovertext)
    for e in dash.lab.events:  # "#3 empty_cache" is the step at x = 3
        assert texts[xs.index(e.index)].startswith(f"#{e.index} {e.action}")
    assert len(set(texts)) == len(texts) and texts[0] == "lab start (before #0)"
    assert data[1].y[xs.index(3)] * MiB == dash.lab.events[3].reserved_bytes == 0
    lo, hi = dash.timeline.fig.layout.xaxis.range
    assert lo < 0 and hi >= 3 + 1.5  # the latest step is inside the plot, with room to spare


def test_timeline_of_a_long_history_keeps_every_peak_and_marker():
    lab = sim_lab()
    timeline = Timeline(lab)
    for k in range(1500):
        lab.allocate(f"{1 + k % 7} MiB", name=f"a{k}")
        lab.free(f"a{k}")
        if k % 50 == 0:
            lab.empty_cache()
    lab.allocate("3 GiB", name="boom")  # an OOM, the last event
    timeline.refresh()
    data = timeline.fig.data
    n = len(lab.events)
    assert n > 3000 and all(len(t.x) <= 4 * timeline.buckets + len(data[3].x) for t in data[:3])
    drawn = dict(zip(data[1].x, data[1].y, strict=True))
    reserved = [e.reserved_bytes / MiB for e in lab.events]
    assert max(drawn.values()) == max(reserved) and data[1].x[-1] == n - 1  # the peak and the latest event
    assert timeline.marks["OOM"] == [n - 1] and len(timeline.marks["empty_cache()"]) == 30
    assert all(x in drawn for x in data[3].x)  # every marker sits on a drawn point
    assert list(data[3].x) == sorted(timeline.marks["empty_cache()"] + timeline.marks["OOM"])


def test_event_log_summarises_long_name_lists(dash):
    click(dash, "Allocate", size="1 MiB", count=400, name="chunk")
    names = [f"chunk[{i}]" for i in range(0, 400, 2)]
    dash.lab.free(*names)
    dash.refresh()
    line = dash.log.lines[0]
    assert "free chunk[0], chunk[2], … (200 tensors)" in line and len(line) < 200
    assert "text-overflow:ellipsis" in dash.log.widget.value
    assert dash.timeline.fig.data[0].hovertext[-1] == "#1 free: free chunk[0], chunk[2], … (200 tensors)"


def test_segment_map_says_no_segments_and_caps_its_height():
    lab = sim_lab()
    m = SegmentMap(lab)
    assert m.fig.layout.annotations[0].text.startswith("no segments") and m.fig.layout.xaxis.visible is False
    lab.allocate("1 MiB", count=300, name="many")  # 300 small 2 MiB segments, one under the other
    m.refresh()
    assert not m.fig.layout.annotations and m.fig.layout.height == m.map.max_height == 440
    assert m.fig.layout.yaxis.title.text == "segment #" and m.fig.layout.yaxis.ticktext is None
    lab.free_all()
    lab.empty_cache()
    m.refresh()
    assert m.fig.layout.annotations and sum(len(t.x) for t in m.traces) == 0


def test_set_lab_goes_through_every_piece(dash):
    click(dash, "Allocate", size="1.5 GiB", name="a")
    click(dash, "Allocate", size="1 GiB", name="b")  # OOM
    dash.oom.explain_button.click()
    assert dash.oom._explained
    fresh = sim_lab()
    dash.set_lab(fresh)
    assert all(p.lab is fresh for p in dash.pieces) and not dash.oom._explained and dash.oom.text == ""
    assert list(dash.timeline.fig.data[0].x) == [-1] and dash.segment_map.bars["live"]["size"] == []
    assert dash.controls.kind.value == "simulator"


def test_timeline_thins_markers_drawn_on_top_of_one_another():
    lab = sim_lab()
    timeline = Timeline(lab, buckets=10)
    lab.gc()  # gc.collect() is slow in a big test process: two are enough for a second kind
    for _ in range(60):
        lab.empty_cache()
    lab.gc()
    timeline.refresh()
    markers = timeline.fig.data[3]
    assert len(timeline.marks["empty_cache()"]) == 60 and len(markers.x) <= 2 * 10 + 2
    assert sorted(set(markers.marker.symbol)) == ["diamond", "triangle-down"] and list(markers.x) == sorted(markers.x)
    assert "more nearby" in markers.hovertext[1] and list(markers.x[:2]) == [0, 1]

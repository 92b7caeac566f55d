"""The dashboard in a real JupyterLab + Chromium.

1. Real clicks, and the bytes rendered in the page must equal what the simulator gives for the same steps
   (replayed here, in the test process, on a fresh lab).
2. The dashboard at common window widths, with JupyterLab's file browser open: nothing is cut, the newest
   event is on screen inside the timeline with room to spare, and the figures stack when two no longer fit.
   One notebook, drawn first at 1280 px, then resized to 1400 and 1920 px (the figures refit on the
   window's resize). At each width: every figure lies inside the output area and the window; each tick label
   and axis title lies inside its figure; the timeline's last point (and its OOM marker) is at least
   ``ROOM_PX`` inside the plot area and inside the visible page; the segment map's axis and legend are in
   view; no log line is wider than the log; no word of the OOM message is broken across lines (unless it is
   wider than the banner). A screenshot per width goes to ``test-artifacts/dashboard-<width>.png``.
"""

from __future__ import annotations

import time

import pytest
from jlab import ARTIFACTS_DIR, console_errors, notebook_locator

from memviz.lab import Lab
from memviz.widgets._common import MiB, exact_bytes

pytestmark = pytest.mark.browser

NOTEBOOK = "notebooks/01_start_here.ipynb"
GAUGE = ".memviz-gauge-{} .memviz-gauge-value"
ALLOCATED = "allocated_bytes.all.current"

# plotly.js's own data for the figure inside the widget with this class: what is drawn, not what was sent
JS_FIGURE_DATA = """(cls) => {
  const g = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .' + cls + ' .js-plotly-plot')
         || document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .' + cls + '.js-plotly-plot');
  return g && g.data ? g.data.map(t => ({name: t.name, x: Array.from(t.x || []), y: Array.from(t.y || [])})) : null;
}"""


def lesson_lab() -> Lab:
    """A fresh simulator after lesson 1's own steps (keep in step with notebooks/01_start_here.ipynb)."""
    lab = Lab(backend="sim", device="T4", cap="2 GiB")
    lab.allocate("64 MiB", name="weights")
    lab.allocate("512 MiB", name="big")
    lab.free("big")
    lab.empty_cache()
    lab.allocate("100 MiB", count=3, name="x")
    lab.free("x[1]")
    lab.empty_cache()
    return lab


def expected_steps(lab: Lab):
    """The test's clicks on ``lab``: label, then allocated, reserved and active bytes after it."""
    steps = [
        ("Allocate", lambda: lab.allocate("512 MiB", name="big")),
        ("Free", lambda: lab.free("big")),
        ("gc.collect()", lambda: lab.gc()),
        ("empty_cache()", lambda: lab.empty_cache()),
    ]
    for label, action in steps:
        event = action()
        yield label, event.allocated_bytes, event.reserved_bytes, event.active_bytes


def test_dashboard_clicks_match_the_simulator(lab):
    lab.server.copy_notebook(NOTEBOOK, "dash.ipynb")
    lab.open("dash.ipynb", run=True)
    page = lab.page
    mirror = lesson_lab()
    kernel = lab.kernel("print(len(lab.events), lab.stats()['allocated_bytes.all.current'])").split()
    assert [int(k) for k in kernel] == [len(mirror.events), mirror.stats()[ALLOCATED]], (
        "lesson 1 changed: update lesson_lab() in this test to do what its cells do"
    )
    notebook_locator(page, ".memviz-dashboard").scroll_into_view_if_needed()  # JupyterLab draws what is in view
    lab.wait_text(GAUGE.format("allocated"), exact_bytes(mirror.stats()[ALLOCATED]), timeout=20)
    notebook_locator(page, ".memviz-size input").fill("512 MiB")
    notebook_locator(page, ".memviz-name input").fill("big")
    for label, allocated, reserved, active in expected_steps(mirror):
        if label == "Free":
            notebook_locator(page, ".memviz-free-pick select").select_option("big")
        lab.click(label)
        lab.wait_text(GAUGE.format("allocated"), exact_bytes(allocated))
        lab.wait_text(GAUGE.format("reserved"), exact_bytes(reserved))
        # the timeline plotly.js drew ends at the same bytes (y is MiB: exact for these sizes), at x = the
        # event's number in the log
        data = lab.wait_js(
            "([f, n]) => { const d = (" + JS_FIGURE_DATA + ")(f); return d && d[0].y.length === n ? d : null; }",
            ["memviz-timeline", len(mirror.events) + 1],
        )
        assert [d["y"][-1] * MiB for d in data[:3]] == [allocated, reserved, active], label
        assert data[0]["x"][-1] == len(mirror.events) - 1, label
    # the map now shows the lab's tensors alone: empty_cache() gave the 512 MiB segment back
    want = sorted(t.request.nbytes for t in mirror.tensors.values())  # one block per tensor, exact

    def map_drawn():  # the map redraws after the timeline: wait for it
        bars = lab.js(JS_FIGURE_DATA, "memviz-segment-map")
        xs = bars[0]["x"]
        live = sorted(round((xs[i + 1] - xs[i]) * MiB) for i in range(0, len(xs), 3))
        return live == want and [len(t["x"]) for t in bars[1:3]] == [0, 0]  # nothing free is left in the cache

    deadline = time.monotonic() + 10
    while not map_drawn():
        assert time.monotonic() < deadline, f"the segment map never showed the lab's tensors alone: {want}"
        time.sleep(0.1)
    assert "memviz-error" not in page.content()
    path = ARTIFACTS_DIR / "dashboard.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    notebook_locator(page, ".memviz-dashboard").screenshot(path=str(path))
    assert path.stat().st_size > 10_000
    assert not [e for e in console_errors(page) if "memviz" in e.lower() or "anywidget" in e.lower()]


WIDTHS = (1280, 1400, 1920)
ROOM_PX = 10  # the latest event must be at least this far inside the plot's right edge
CELLS = [
    "import memviz\n"
    "lab = memviz.Lab(backend='sim', device='T4', cap='2 GiB')\n"
    "lab.allocate('64 MiB', name='weights')\n"
    "lab.allocate('1 MiB', count=48, name='small')  # 24 small segments: a tall map\n"
    "lab.allocate('512 MiB', name='big')\n"
    "lab.free(*[f'small[{i}]' for i in range(0, 48, 2)])  # a long 'free' line\n"
    "lab.allocate('3 GiB', name='huge')  # out of memory\n"
    "dash = memviz.dashboard(lab, live=False)\n"
    "dash",
]

# every figure of the row as wide as its box (they refit after a resize)
JS_FITTED = """(width) => window.innerWidth === width && [...document.querySelectorAll(
    '.jp-NotebookPanel:not(.lm-mod-hidden) .memviz-figures > .widget-vbox')].every(box => {
      const g = box.querySelector('.js-plotly-plot');
      return g && g._fullLayout && Math.abs(g._fullLayout.width - box.getBoundingClientRect().width) < 2; })"""

# Geometry of what the page shows, in CSS px of the window. `clip` is what the notebook shows of the output
# (its area, within the window): anything drawn beyond it is cut off for the reader.
JS_GEOMETRY = """() => {
  const root = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  const dash = root.querySelector('.memviz-dashboard');
  const out = dash.closest('.jp-OutputArea-output').getBoundingClientRect();
  const clip = {left: Math.max(out.left, 0), right: Math.min(out.right, window.innerWidth)};
  const box = (el) => { const r = el.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top,
                                                                      bottom: r.bottom, width: r.width}; };
  const figure = (cls) => {
    const gd = root.querySelector('.' + cls + ' .js-plotly-plot') || root.querySelector('.' + cls + '.js-plotly-plot');
    const svg = box(gd.querySelector('.main-svg'));
    const texts = [...gd.querySelectorAll('.xtick text, .ytick text, .g-xtitle text, .g-ytitle text')]
      .filter(t => t.textContent.trim()).map(t => ({text: t.textContent, ...box(t)}));
    const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
    const at = (x, y) => ({x: svg.left + xa._offset + xa.l2p(x), y: svg.top + ya._offset + ya.l2p(y)});
    return {gd, svg, texts, plot: {left: svg.left + xa._offset, right: svg.left + xa._offset + xa._length},
            at, legend: box(gd.closest('.widget-vbox, .jupyter-widgets').querySelector('.memviz-legend'))};
  };
  const tl = figure('memviz-timeline'), map = figure('memviz-segment-map');
  const reserved = tl.gd.data[1], markers = tl.gd.data[3];
  const n = reserved.x.length;
  const last = tl.at(reserved.x[n - 1], reserved.y[n - 1]);
  const marks = Array.from(markers.x || []).map((x, i) => tl.at(x, markers.y[i]));
  const log = box(root.querySelector('.memviz-event-log'));
  const rows = [...root.querySelectorAll('.memviz-event')].map(box);
  const message = root.querySelector('.memviz-oom-message');
  root.querySelector('.memviz-oom-details').open = true;
  const broken = [];
  const walker = document.createTreeWalker(message, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (const m of node.textContent.matchAll(/[^\\s-]+/g)) {  // a line may break after a hyphen
      const range = document.createRange();
      range.setStart(node, m.index); range.setEnd(node, m.index + m[0].length);
      const rects = [...range.getClientRects()];
      const lines = new Set(rects.map(r => Math.round(r.top)));
      const wider = rects.reduce((w, r) => w + r.width, 0) > message.clientWidth;  // a URL may have to break
      if (lines.size > 1 && !wider) broken.push(m[0]);
    }
  }
  const parts = (f) => ({svg: f.svg, plot: f.plot, texts: f.texts, legend: f.legend});
  return {clip, lastX: reserved.x[n - 1], last, marks, tl: parts(tl), map: parts(map), log, rows, broken};
}"""


def _inside(inner: dict, outer: dict, what: str, slack: float = 1.0) -> None:
    assert inner["left"] >= outer["left"] - slack and inner["right"] <= outer["right"] + slack, (
        f"{what} [{inner['left']:.0f}, {inner['right']:.0f}] is not inside [{outer['left']:.0f}, {outer['right']:.0f}]"
    )


def _check(g: dict, width: int) -> None:
    clip = g["clip"]
    for name in ("tl", "map"):
        fig = g[name]
        _inside(fig["svg"], clip, f"{name} figure at {width} px")
        _inside(fig["legend"], clip, f"{name} legend at {width} px")
        for t in fig["texts"]:
            _inside(t, fig["svg"], f"{name} label {t['text']!r} at {width} px")
    plot = g["tl"]["plot"]
    for point, what in [(g["last"], f"the last event (#{g['lastX']})"), *((m, "a marker") for m in g["marks"])]:
        assert plot["left"] <= point["x"] <= plot["right"] - ROOM_PX, f"{what} at x={point['x']:.0f} px, plot {plot}"
        assert clip["left"] <= point["x"] <= clip["right"] - ROOM_PX, f"{what} is off the visible page at {width} px"
    _inside(g["log"], clip, f"the event log at {width} px")
    for row in g["rows"]:
        assert row["width"] <= g["log"]["width"] + 1, f"a log line {row['width']:.0f} px wide at {width} px"
    assert not g["broken"], f"words broken across lines in the OOM message: {g['broken']}"
    side_by_side = abs(g["tl"]["svg"]["top"] - g["map"]["svg"]["top"]) < 1
    assert side_by_side == (clip["right"] - clip["left"] >= 2 * 520 + 12), f"figure row at {width} px"
    map_height = g["map"]["legend"]["bottom"] - g["map"]["svg"]["top"]
    assert map_height < 520, f"the segment map is {map_height:.0f} px tall: its axis and legend leave the screen"


def test_dashboard_fits_common_widths_with_the_file_browser_open(lab):
    page = lab.page
    page.set_viewport_size({"width": WIDTHS[0], "height": 1000})
    lab.open("widths.ipynb", CELLS, collapse_left=False)
    page.evaluate("() => window.jupyterapp.commands.execute('filebrowser:activate')")
    lab.run_all()
    lab.wait_js("() => document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .memviz-segment-map .xtick')")
    assert lab.js("() => !window.jupyterapp.shell.leftCollapsed")
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 1000})
        # settled: both figures as wide as their boxes (they refit on the resize)
        lab.wait_js(JS_FITTED, width)
        time.sleep(0.3)  # and still fitted a moment later: no redraw under way
        assert lab.js(JS_FITTED, width), f"the figures do not fit their boxes at {width} px"
        dash = notebook_locator(page, ".memviz-dashboard")
        dash.scroll_into_view_if_needed()
        _check(lab.js(JS_GEOMETRY), width)
        path = ARTIFACTS_DIR / f"dashboard-{width}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(path))

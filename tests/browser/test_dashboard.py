"""The dashboard in a real JupyterLab + Chromium: real clicks, and the bytes rendered in the page must equal
what the simulator gives for the same steps (replayed here, in the test process, on a fresh lab)."""

from __future__ import annotations

import pytest
from jlab import ARTIFACTS_DIR, console_errors, notebook_locator

from memviz.lab import Lab
from memviz.widgets._common import MiB, exact_bytes

pytestmark = pytest.mark.browser

NOTEBOOK = "notebooks/01_start_here.ipynb"
GAUGE = ".memviz-gauge-{} .memviz-gauge-value"

# plotly.js's own data for the figure inside the widget with this class: what is drawn, not what was sent
JS_FIGURE_DATA = """(cls) => {
  const g = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .' + cls + ' .js-plotly-plot')
         || document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .' + cls + '.js-plotly-plot');
  return g && g.data ? g.data.map(t => ({name: t.name, x: Array.from(t.x || []), y: Array.from(t.y || [])})) : null;
}"""


def expected_steps():
    """Lesson 1's steps, then the test's clicks, on a fresh simulator: stats after each click."""
    lab = Lab(backend="sim", device="T4", cap="2 GiB")
    lab.allocate("64 MiB", name="weights")  # what lesson 1's cells do
    lab.allocate("512 MiB", name="big")
    lab.free("big")
    lab.empty_cache()
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
    lab.wait_text(GAUGE.format("allocated"), exact_bytes(64 * MiB), timeout=20)
    notebook_locator(page, ".memviz-size input").fill("512 MiB")
    notebook_locator(page, ".memviz-name input").fill("big")
    for label, allocated, reserved, active in expected_steps():
        if label == "Free":
            notebook_locator(page, ".memviz-free-pick select").select_option("big")
        lab.click(label)
        lab.wait_text(GAUGE.format("allocated"), exact_bytes(allocated))
        lab.wait_text(GAUGE.format("reserved"), exact_bytes(reserved))
        # the timeline plotly.js drew ends at the same bytes (y is MiB: exact for these sizes)
        data = lab.wait_js(
            "([f, n]) => { const d = (" + JS_FIGURE_DATA + ")(f); return d && d[0].y.length === n ? d : null; }",
            ["memviz-timeline", _events_so_far(label) + 1],
        )
        assert [d["y"][-1] * MiB for d in data[:3]] == [allocated, reserved, active], label
    # the map now shows the 64 MiB tensor alone: empty_cache() gave the 512 MiB segment back
    bars = lab.js(JS_FIGURE_DATA, "memviz-segment-map")
    assert [len(t["x"]) for t in bars[:3]] == [3, 0, 0] and bars[0]["x"][:2] == [0, 64]  # one block: start, end
    assert "memviz-error" not in page.content()
    path = ARTIFACTS_DIR / "dashboard.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    notebook_locator(page, ".memviz-dashboard").screenshot(path=str(path))
    assert path.stat().st_size > 10_000
    assert not [e for e in console_errors(page) if "memviz" in e.lower() or "anywidget" in e.lower()]


def _events_so_far(label: str) -> int:
    return {"Allocate": 5, "Free": 6, "gc.collect()": 7, "empty_cache()": 8}[label]

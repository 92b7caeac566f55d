"""The fit panel in a real JupyterLab + Chromium: a typed batch size and a picked GPU redraw the panel, and the
bytes the page shows must equal what ``memviz.predict`` gives for the same program here, in the test process."""

from __future__ import annotations

import time

import pytest
from jlab import ARTIFACTS_DIR, console_errors, notebook_locator

from memviz.predict import predict
from memviz.predict.programs import mlp_training  # a user's training script: (batch=256, steps=3, amp=False)
from memviz.widgets._common import exact_bytes

pytestmark = pytest.mark.browser

GAUGE = ".memviz-fit-gauges .memviz-gauge-{} .memviz-gauge-value"

# plotly.js's own data for the stacked area: what is drawn, not what was sent
JS_AREA = """() => {
  const g = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .memviz-fit-area .js-plotly-plot')
         || document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .memviz-fit-area.js-plotly-plot');
  return g && g.data ? g.data.map(t => ({name: t.name, n: (t.x || []).length, y: Array.from(t.y || [])})) : null;
}"""


def expected(**kwargs):
    return predict(mlp_training, **kwargs)


def test_fit_panel_follows_typed_and_picked_controls(lab):
    cells = ["import memviz\nfrom memviz.predict.programs import mlp_training",
             "panel = memviz.fit_panel(mlp_training, device='T4')\npanel"]
    lab.open("fit.ipynb", cells, run=True)
    page = lab.page
    first = expected(device="T4")
    lab.wait_text(GAUGE.format("allocated"), exact_bytes(first.peak_allocated_bytes), timeout=30)
    lab.wait_text(GAUGE.format("reserved"), exact_bytes(first.peak_reserved_bytes), timeout=30)
    assert "fits" in lab.text(".memviz-fit-banner")

    # type a batch size, as a user does (the box sends its value on Enter)
    bigger = expected(device="T4", batch=1024)
    box = notebook_locator(page, ".memviz-fit-arg-batch input")
    box.fill("1024")
    start = time.perf_counter()
    box.press("Enter")
    lab.wait_text(GAUGE.format("allocated"), exact_bytes(bigger.peak_allocated_bytes), timeout=30)
    typed_s = time.perf_counter() - start
    lab.wait_text(GAUGE.format("reserved"), exact_bytes(bigger.peak_reserved_bytes), timeout=30)

    # pick another GPU: the gauges' title and the numbers follow
    h200 = expected(device="H200", batch=1024)
    notebook_locator(page, ".memviz-fit-device select").select_option("H200")
    lab.wait_js("(t) => document.querySelector('.memviz-fit-gauges .memviz-gauge-title')?.textContent.startsWith(t)",
                "NVIDIA H200", timeout=30)  # fmt: skip
    lab.wait_text(GAUGE.format("reserved"), exact_bytes(h200.peak_reserved_bytes), timeout=30)

    ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
    # the stacked area plotly.js drew: one point per predicted event, and its top at the peak is the peak
    area = lab.wait_js("() => { const d = (" + JS_AREA + ")(); return d && d[0].n === " + str(len(h200.events))
                       + " ? d : null; }", timeout=30)  # fmt: skip
    layers = [t for t in area if t["name"] not in ("reserved", "peak") and t["y"]]
    at_peak = sum(t["y"][h200.peak_event_index] for t in layers) * 2**20
    assert round(at_peak) == sum(h200.breakdown().values())

    page.set_viewport_size({"width": 1400, "height": 2000})  # the whole panel in one picture
    notebook_locator(page, ".memviz-fit-panel").screenshot(path=str(ARTIFACTS_DIR / "fit_panel_fits.png"))

    # a cap too small: the banner names the failing request
    capped = expected(device="H200", batch=1024, cap="24 MiB")
    notebook_locator(page, ".memviz-fit-cap input").fill("24 MiB")
    notebook_locator(page, ".memviz-fit-cap input").press("Enter")
    lab.wait_js("() => !!document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .memviz-fit-oom')", timeout=30)
    lab.wait_js("() => document.querySelector('.memviz-fit-status')?.textContent.startsWith('predicted in')",
                timeout=30)
    banner = lab.text(".memviz-fit-oom")
    assert "OUT OF MEMORY" in banner and f"{capped.oom.requested_bytes:,} B" in banner and capped.oom.op in banner

    path = ARTIFACTS_DIR / "fit_panel.png"
    notebook_locator(page, ".memviz-fit-panel").screenshot(path=str(path))
    assert path.stat().st_size > 10_000
    assert "Traceback" not in lab.text(".memviz-fit-panel")
    assert not [e for e in console_errors(page) if "memviz" in e.lower() or "anywidget" in e.lower()]
    print(f"typed batch -> gauges redrawn: {typed_s * 1000:.0f} ms")

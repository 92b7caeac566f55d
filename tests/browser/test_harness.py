"""The browser harness works end to end: real JupyterLab, real Chromium, real clicks, real kernel.

If these fail, the dashboard's browser tests cannot be trusted either: fix the harness first.
"""

from __future__ import annotations

import pytest
from jlab import output_text

pytestmark = pytest.mark.browser

COUNTER_CELLS = [
    "#md\n# Harness check: a Button that counts its clicks",
    """\
import ipywidgets as w

clicks = 0
count = w.Label(value="0")
count.add_class("mv-count")
add = w.Button(description="Add one")
slider = w.IntSlider(value=3, min=0, max=10, description="level")
slider.add_class("mv-slider")


def on_add(_):
    global clicks
    clicks += 1
    count.value = str(clicks)


add.on_click(on_add)
w.VBox([add, count, slider])""",
    "print(f'clicks={clicks} slider={slider.value}')",
]

# FigureWidget is an anywidget in plotly >= 6: this is what the dashboard's charts are made of.
FIGURE_CELLS = [
    """\
import ipywidgets as w
import plotly.graph_objects as go

fig = go.FigureWidget(data=[go.Bar(x=["a"], y=[1], texttemplate="%{y}", textposition="inside")])
fig.update_layout(width=500, height=300, margin=dict(l=30, r=10, t=10, b=30))
to_five = w.Button(description="Set bar to 5")


def on_five(_):
    fig.data[0].y = [5]


to_five.on_click(on_five)
display(to_five, fig)""",
]

# The trace data plotly.js holds for the (first) figure in the shown notebook.
JS_BAR_Y = """() => {
  const g = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .js-plotly-plot');
  return g && g.data && g.data.length ? Array.from(g.data[0].y) : null;
}"""


def test_button_clicks_reach_the_kernel_and_the_dom(lab):
    lab.open("counter.ipynb", COUNTER_CELLS, run=True)
    assert lab.text(".mv-count") == "0"
    assert lab.text(".mv-slider .widget-readout") == "3"

    for _ in range(3):
        lab.click("Add one")
    lab.wait_text(".mv-count", "3")

    # The kernel saw the same three clicks: ask it over the kernel protocol ...
    assert lab.kernel("print(clicks, count.value)").split() == ["3", "3"]
    # ... and through the notebook itself, by re-running its print cell.
    assert output_text(lab.run_cell(2)).strip() == "clicks=3 slider=3"

    # Keyboard on the slider handle moves the kernel-side value too.
    lab.page.locator(".mv-slider .noUi-handle").focus()
    lab.page.keyboard.press("ArrowRight")
    lab.wait_text(".mv-slider .widget-readout", "4")
    assert lab.kernel("print(slider.value)").strip() == "4"

    shot = lab.screenshot("harness-counter")
    assert shot.stat().st_size > 10_000


def test_plotly_figurewidget_renders_and_updates(lab):
    lab.open("figure.ipynb", FIGURE_CELLS, run=True)
    assert lab.wait_js(JS_BAR_Y, timeout=20) == [1]
    lab.wait_text(".js-plotly-plot text.bartext", "1")

    lab.click("Set bar to 5")
    lab.wait_text(".js-plotly-plot text.bartext", "5")
    assert lab.js(JS_BAR_Y) == [5]
    assert lab.kernel("print(list(fig.data[0].y))").strip() == "[5]"

    lab.screenshot("harness-figurewidget")

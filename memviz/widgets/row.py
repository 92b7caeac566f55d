"""A row of figures that shares the page's width, and stacks them when two no longer fit.

The plotly figures have no fixed width: plotly.js sizes a figure to its box when it is drawn. A figure drawn
before its box was laid out takes plotly's default 700 px, and a box can change width later (the window, the
file browser opening, the row wrapping); in JupyterLab 4 the figure widget does not always follow (measured:
a window ``resize`` event left a 700 px figure in an 848 px box). So the row holds a :class:`RowSizer`: a
zero-height anywidget that watches the row's width (``ResizeObserver``, and every 0.5 s for the first 5 s
after it is shown) and redraws each figure of the row whose drawn width is not its box's
(``Plotly.Plots.resize``; a window ``resize`` event where ``window.Plotly`` is missing). Nothing runs in the
kernel: a click costs nothing more.
"""

from __future__ import annotations

import anywidget
import ipywidgets as W

__all__ = ["FIGURE_MIN_PX", "RowSizer", "figure_row"]

FIGURE_MIN_PX = 520
"""A figure of a row is at least this wide: two fit side by side from about 1,060 px of output (a 1920 px
window with JupyterLab's file browser open); below that they stack, each the full width."""

_ESM = r"""
function refit(el) {
  // every plotly figure of the row whose drawn width is not its box's: plotly.js redraws it at its box's width
  const row = el.parentElement;
  if (!row) return;
  for (const gd of row.querySelectorAll(".js-plotly-plot")) {
    const box = gd.getBoundingClientRect().width;
    if (!gd._fullLayout || Math.abs(gd._fullLayout.width - box) < 2) continue;
    if (window.Plotly && window.Plotly.Plots) window.Plotly.Plots.resize(gd);
    else window.dispatchEvent(new Event("resize"));
  }
}
function render({ el }) {
  el.classList.add("memviz-row-sizer");
  let last = null, frame = 0;
  const later = () => { if (!frame) frame = requestAnimationFrame(() => { frame = 0; refit(el); }); };
  const observer = new ResizeObserver(() => {
    const width = Math.round(el.getBoundingClientRect().width);
    if (width === last || width === 0) return;
    last = width;
    later();
  });
  observer.observe(el);
  // a figure drawn before its box had its width (plotly.js then takes 700 px) is refitted once it has it
  const timer = setInterval(later, 500);
  const stop = setTimeout(() => clearInterval(timer), 5000);
  return () => {
    observer.disconnect(); clearInterval(timer); clearTimeout(stop); if (frame) cancelAnimationFrame(frame);
  };
}
export default { render };
"""


class RowSizer(anywidget.AnyWidget):
    """Zero-height, full-width member of a figure row: refits the row's figures when its width changes."""

    _esm = _ESM


def figure_row(children: list[W.Widget], min_px: int = FIGURE_MIN_PX) -> W.Box:
    """``children`` side by side, sharing the width, or one under the other when two no longer fit at
    ``min_px`` each (a wrapping flex row; the plotly figures in them size themselves to their box)."""
    for child in children:
        child.layout.flex = f"1 1 {min_px}px"
        child.layout.min_width = "0"
        child.layout.width = "auto"
    sizer = RowSizer(layout=W.Layout(flex="0 0 100%", height="0px", overflow="hidden", margin="0"))
    row = W.Box([*children, sizer], layout=W.Layout(display="flex", flex_flow="row wrap", width="100%",
                                                    align_items="flex-start", grid_gap="0 12px"))  # fmt: skip
    row.add_class("memviz-figures")
    return row

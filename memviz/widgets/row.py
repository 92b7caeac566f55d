"""A row of figures that shares the page's width, and stacks them when two no longer fit.

The plotly figures have no fixed width: plotly.js sizes a figure to its box when it is drawn, on a window
``resize`` and on JupyterLab's own resize messages. A box can also change width without either (the row
wrapping, an output area laid out after the figure was drawn), so the row holds a :class:`RowSizer`: a
zero-height anywidget that watches the row's width (``ResizeObserver``) and, when it changes, sends one
window ``resize`` event on the next animation frame, which makes every figure fit its box again.
"""

from __future__ import annotations

import anywidget
import ipywidgets as W

__all__ = ["FIGURE_MIN_PX", "RowSizer", "figure_row"]

FIGURE_MIN_PX = 520
"""A figure of a row is at least this wide: two fit side by side from about 1,060 px of output (a 1920 px
window with JupyterLab's file browser open); below that they stack, each the full width."""

_ESM = r"""
function render({ el }) {
  el.classList.add("memviz-row-sizer");
  let last = null, frame = 0;
  const observer = new ResizeObserver(() => {
    const width = Math.round(el.getBoundingClientRect().width);
    if (width === last || width === 0) return;
    last = width;
    if (!frame) frame = requestAnimationFrame(() => { frame = 0; window.dispatchEvent(new Event("resize")); });
  });
  observer.observe(el);
  return () => { observer.disconnect(); if (frame) cancelAnimationFrame(frame); };
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

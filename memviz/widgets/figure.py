"""The plotly ``FigureWidget`` our figures use: plotly's own, minus the echo of its browser-to-Python messages,
and with WebGL canvases at one canvas pixel per CSS pixel.

After every update plotly.js sends Python two messages describing the figure as drawn (``_js2py_traceDeltas``,
``_js2py_layoutDelta``), and ipywidgets 8 echoes every such browser-set value back to the browser
(``echo_update``, for other views of the same widget). Nothing in the browser reads these values, so the
echo is pure traffic: two messages of ~5 KB a figure per click that the page must parse before it can
paint. ipywidgets skips the echo for traits tagged ``echo_update=False``; this class tags them.

plotly.js sizes its three WebGL canvases at ``plotGlPixelRatio`` (default 2) times the figure on every
redraw, which reallocates their buffers: a 640 x 700 segment map meant three 1280 x 1400 buffers per
update, ~100 ms in Chromium without a GPU. One pixel per CSS pixel is a quarter of that; the map's bars
are wide flat lines, which lose nothing.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.serializers import custom_serializers
from traitlets import Dict

__all__ = ["Figure"]


def _browser_to_python() -> Dict:
    return Dict(allow_none=True).tag(sync=True, echo_update=False, **custom_serializers)


class Figure(go.FigureWidget):
    """``plotly.graph_objects.FigureWidget`` whose browser-to-Python messages are not echoed back, and whose
    WebGL traces draw at one canvas pixel per CSS pixel (``plotGlPixelRatio: 1``)."""

    _js2py_traceDeltas = _browser_to_python()
    _js2py_layoutDelta = _browser_to_python()
    _js2py_restyle = _browser_to_python()
    _js2py_relayout = _browser_to_python()
    _js2py_update = _browser_to_python()
    _js2py_pointsCallback = _browser_to_python()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._config = {**self._config, "plotGlPixelRatio": 1}  # read by plotly.js when a view is created

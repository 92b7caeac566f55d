"""The plotly ``FigureWidget`` our figures use: plotly's own, minus the echo of its browser-to-Python messages.

After every update plotly.js sends Python two messages describing the figure as drawn (``_js2py_traceDeltas``,
``_js2py_layoutDelta``), and ipywidgets 8 echoes every such browser-set value back to the browser
(``echo_update``, for other views of the same widget). Nothing in the browser reads these values, so the
echo is pure traffic: two messages of ~5 KB a figure per click that the page must parse before it can
paint. ipywidgets skips the echo for traits tagged ``echo_update=False``; this class tags them.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.serializers import custom_serializers
from traitlets import Dict

__all__ = ["Figure"]


def _browser_to_python() -> Dict:
    return Dict(allow_none=True).tag(sync=True, echo_update=False, **custom_serializers)


class Figure(go.FigureWidget):
    """``plotly.graph_objects.FigureWidget`` whose browser-to-Python messages are not echoed back."""

    _js2py_traceDeltas = _browser_to_python()
    _js2py_layoutDelta = _browser_to_python()
    _js2py_restyle = _browser_to_python()
    _js2py_relayout = _browser_to_python()
    _js2py_update = _browser_to_python()
    _js2py_pointsCallback = _browser_to_python()

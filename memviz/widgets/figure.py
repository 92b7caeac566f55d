"""The plotly ``FigureWidget`` our figures use: plotly's own, minus the echo of its browser-to-Python messages,
with WebGL canvases at one canvas pixel per CSS pixel, and plotly's front end loaded once per page.

After every update plotly.js sends Python two messages describing the figure as drawn (``_js2py_traceDeltas``,
``_js2py_layoutDelta``), and ipywidgets 8 echoes every such browser-set value back to the browser
(``echo_update``, for other views of the same widget). Nothing in the browser reads these values, so the
echo is pure traffic: two messages of ~5 KB a figure per click that the page must parse before it can
paint. ipywidgets skips the echo for traits tagged ``echo_update=False``; this class tags them.

plotly.js sizes its three WebGL canvases at ``plotGlPixelRatio`` (default 2) times the figure on every
redraw, which reallocates their buffers: a 640 x 700 segment map meant three 1280 x 1400 buffers per
update, ~100 ms in Chromium without a GPU. One pixel per CSS pixel is a quarter of that; the map's bars
are wide flat lines, which lose nothing.

plotly's front end is a 5 MB ES module that anywidget imports from a fresh ``blob:`` URL for every figure:
1.4-2.9 s of Chromium's main thread each (headless, 2 cores), one figure after another, because the
kernel's message queue waits for each model's ``ready``. anywidget 0.11 rejects ``ready`` 2 s after a model
is created, and from then on drops every message to it (``_handle_comm_msg`` awaits ``ready``): the
figure's data and layout, which plotly sends right after the widget opens, never arrive, and the view
comes up blank (no traces, no title, no CSS class). Whether the import beats that timer depends on how
the browser schedules it, so it failed about one run in four. Here the module anywidget imports is a
small shim (:data:`SHIM_ESM`): its ``initialize`` returns at once, queueing the ``_py2js_*`` messages;
plotly's module (the ``_plotly_esm`` trait) is imported once per page and plotly's own model is then
given the queued messages in order; views wait for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import plotly
import plotly.graph_objects as go
from plotly.serializers import custom_serializers
from traitlets import Dict, Unicode

__all__ = ["SHIM_ESM", "Figure"]

PLOTLY_ESM_PATH = Path(plotly.__file__).parent / "package_data" / "widgetbundle.js"
"""plotly's FigureWidget front end (an ES module exporting ``default() -> {initialize, render}``)."""

SHIM_ESM = r"""
// memviz Figure: plotly's FigureWidget front end, imported once per page (see memviz/widgets/figure.py)
const KEY = "memviz:plotly-widget:" + PLOTLY_VERSION;
const PY2JS = ["_py2js_addTraces", "_py2js_deleteTraces", "_py2js_moveTraces", "_py2js_restyle",
               "_py2js_relayout", "_py2js_update", "_py2js_animate", "_py2js_removeLayoutProps",
               "_py2js_removeTraceProps"];

function plotlyModule(model) {
  if (!globalThis[KEY]) {
    const url = URL.createObjectURL(new Blob([model.get("_plotly_esm")], { type: "text/javascript" }));
    globalThis[KEY] = import(url).finally(() => URL.revokeObjectURL(url));
  }
  return globalThis[KEY];
}

export default () => {
  let plotlyReady = null; // resolves to plotly's {initialize, render} for this model, fed every message so far
  return {
    initialize({ model }) {
      const queued = []; // [trait, value]: what came before plotly's model listened
      let replaying = null; // the [trait, value] plotly's model reads while a queued message is replayed
      let live = false;
      const handlers = new Map(); // event -> plotly's callbacks
      for (const name of PY2JS) {
        model.on(`change:${name}`, () => {
          const value = model.get(name);
          if (!live && value !== null) queued.push([name, value]);
        });
      }
      const seen = {
        get: (key) => (replaying && replaying[0] === key ? replaying[1] : model.get(key)),
        set: (key, value) => model.set(key, value),
        save_changes: () => model.save_changes(),
        send: (...args) => model.send(...args),
        on: (event, callback) => {
          model.on(event, callback);
          if (!handlers.has(event)) handlers.set(event, []);
          handlers.get(event).push(callback);
        },
        off: (event, callback) => model.off(event, callback),
        widget_manager: model.widget_manager,
      };
      plotlyReady = plotlyModule(model).then((module) => {
        const widget = module.default();
        widget.initialize({ model: seen });
        for (const message of queued) {
          replaying = message;
          for (const callback of handlers.get(`change:${message[0]}`) || []) callback();
        }
        replaying = null;
        queued.length = 0;
        live = true;
        return widget;
      });
    },
    async render({ model, el, signal }) {
      const widget = await plotlyReady;
      if (signal && signal.aborted) return undefined;
      return widget.render({ model, el });
    },
  };
};
"""
"""The module anywidget imports for each figure; ``PLOTLY_VERSION`` is replaced by plotly's version."""


def _browser_to_python() -> Dict:
    return Dict(allow_none=True).tag(sync=True, echo_update=False, **custom_serializers)


class Figure(go.FigureWidget):
    """``plotly.graph_objects.FigureWidget`` whose browser-to-Python messages are not echoed back, whose
    WebGL traces draw at one canvas pixel per CSS pixel (``plotGlPixelRatio: 1``), and whose front end is
    plotly's, imported once per page through :data:`SHIM_ESM`."""

    _js2py_traceDeltas = _browser_to_python()
    _js2py_layoutDelta = _browser_to_python()
    _js2py_restyle = _browser_to_python()
    _js2py_relayout = _browser_to_python()
    _js2py_update = _browser_to_python()
    _js2py_pointsCallback = _browser_to_python()
    _esm = SHIM_ESM.replace("PLOTLY_VERSION", repr(plotly.__version__))
    _plotly_esm = Unicode(PLOTLY_ESM_PATH.read_text(encoding="utf-8")).tag(sync=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._config = {**self._config, "plotGlPixelRatio": 1}  # read by plotly.js when a view is created

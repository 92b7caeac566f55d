"""What is live over a predicted step, by category: a stacked area, with forward / backward / optimizer bands.

x is the predicted trace's event number, y MiB (exact: bytes / 2**20). The layers stack in :data:`LAYERS` order,
so the top of the stack is what is allocated; reserved is the dashed line above it. A band behind the area
marks each phase of each step (``forward``, ``backward``, ``optimizer``), labelled at the top; a marker shows
the peak, and an arrow the request that did not fit. A long trace is drawn through each slice's first, last,
lowest and highest event of the total (:func:`memviz.widgets.downsample.envelope`), so the peak is drawn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

from memviz.widgets._common import FIXED_AXIS, TEMPLATE, legend, line_swatch, marker_swatch, mib
from memviz.widgets.downsample import envelope
from memviz.widgets.figure import Figure

__all__ = ["LAYERS", "PHASE_COLORS", "StepArea"]

LAYERS = (  # (category, colour)
    ("parameters", "#1f77b4"),
    ("gradients", "#ff7f0e"),
    ("optimizer state", "#2ca02c"),
    ("activations", "#9467bd"),
    ("temporaries", "#8c564b"),
    ("workspaces", "#e377c2"),
    ("other", "#7f7f7f"),
)
PHASE_COLORS = {"forward": "rgba(31,119,180,0.07)", "backward": "rgba(214,39,40,0.07)",
                "optimizer": "rgba(44,160,44,0.10)"}  # fmt: skip
RESERVED_COLOR, PEAK_COLOR = "#ff7f0e", "#d62728"


class StepArea:
    """The stacked area of one prediction (see the module docstring); ``show(...)`` redraws it in one update.

    ``drawn`` holds what was drawn last, exact: ``{"x": event numbers, category: bytes per drawn event,
    "reserved": bytes, "phases": [(name, first, last)], "peak": event}``.
    """

    def __init__(self) -> None:
        traces = [go.Scatter(name=name, mode="lines", stackgroup="live", line={"width": 0.5, "color": color},
                             fillcolor=color, hovertemplate=f"{name}: %{{y:.1f}} MiB<extra></extra>")
                  for name, color in LAYERS]  # fmt: skip
        traces.append(go.Scatter(name="reserved", mode="lines", line={"color": RESERVED_COLOR, "width": 1.5,
                                 "dash": "dash"}, hovertemplate="reserved: %{y:.1f} MiB<extra></extra>"))  # fmt: skip
        traces.append(go.Scatter(name="peak", mode="markers", marker={"symbol": "x", "size": 10, "color": PEAK_COLOR},
                                 hovertemplate="peak allocated: %{y:.1f} MiB at event %{x}<extra></extra>"))
        self.fig = Figure(
            traces,
            layout={
                "height": 300, "autosize": True, "margin": {"l": 64, "r": 16, "t": 34, "b": 40},
                "title": {"text": "what is live over the step", "font": {"size": 13}},
                "xaxis": {"title": {"text": "event of the predicted trace"}, "zeroline": False, **FIXED_AXIS},
                "yaxis": {"title": {"text": "MiB"}, "rangemode": "tozero", **FIXED_AXIS},
                "showlegend": False, "hovermode": "x unified", "template": TEMPLATE,
            },
        )  # fmt: skip
        self.fig.add_class("memviz-fit-area")
        entries = [(name, line_swatch(color, 8)) for name, color in LAYERS]
        entries += [("reserved", line_swatch(RESERVED_COLOR, 2, "dot")), ("peak", marker_swatch(PEAK_COLOR, "x"))]
        self.legend = legend(entries)
        self.widget = W.VBox([self.fig, self.legend], layout=W.Layout(width="100%"))
        self.drawn: dict = {}

    def show(self, layers: Mapping[str, Sequence[int]], reserved: Sequence[int],
             phases: Sequence[tuple[str, int, int]] = (), title: str = "what is live over the step",
             oom: tuple[int, str] | None = None) -> None:
        """Draw ``layers`` (category → bytes live after each event; categories not in :data:`LAYERS` go to
        "other"), ``reserved`` (bytes after each event) and ``phases`` (``(name, first event, last event)``);
        ``oom``: ``(event index, label)`` of the request that did not fit, marked where the run stopped."""
        n = len(reserved)
        stack = {name: np.zeros(n, dtype=np.int64) for name, _ in LAYERS}
        for name, values in layers.items():
            key = name if name in stack else "other"
            stack[key] += np.asarray(values, dtype=np.int64)
        total = sum(stack.values()) if n else np.zeros(0, dtype=np.int64)
        keep = envelope(total) if n else np.arange(0)
        peak = int(np.argmax(total)) if n else 0
        x = keep
        kept_reserved = np.asarray(reserved, dtype=np.int64)[keep]
        drawn = {"x": x.tolist(), "reserved": kept_reserved.tolist(), "phases": list(phases), "peak": peak,
                 "oom": oom}
        with self.fig.batch_update():
            for trace, (name, _) in zip(self.fig.data, LAYERS, strict=False):
                values = stack[name][keep]
                drawn[name] = values.tolist()
                trace.x, trace.y = x, values / float(1 << 20)
                trace.visible = bool(values.any())
            self.fig.data[len(LAYERS)].update(x=x, y=kept_reserved / float(1 << 20))
            self.fig.data[len(LAYERS) + 1].update(x=[peak] if n else [], y=[mib(int(total[peak]))] if n else [])
            self.fig.layout.shapes = [
                {"type": "rect", "xref": "x", "yref": "paper", "x0": first - 0.5, "x1": last + 0.5, "y0": 0, "y1": 1,
                 "fillcolor": PHASE_COLORS.get(name, "rgba(0,0,0,0.04)"), "line": {"width": 0}, "layer": "below"}
                for name, first, last in phases
            ]  # fmt: skip
            notes = [
                {"x": (first + last) / 2, "y": 1.0, "xref": "x", "yref": "paper", "yanchor": "bottom",
                 "text": name[0].upper(), "hovertext": name, "showarrow": False, "font": {"size": 10, "color": "#555"}}
                for name, first, last in phases
            ]  # fmt: skip
            if oom is not None:
                notes.append({"x": oom[0] - 0.5, "y": 0.5, "xref": "x", "yref": "paper", "text": f"OOM: {oom[1]}",
                              "showarrow": True, "ax": -60, "ay": 0, "font": {"size": 11, "color": PEAK_COLOR},
                              "arrowcolor": PEAK_COLOR})  # fmt: skip
            self.fig.layout.annotations = notes
            self.fig.layout.title.text = title
            self.fig.layout.xaxis.range = [-0.5, max(n - 0.5, 0.5)]
        self.drawn = drawn

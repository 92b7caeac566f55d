"""A timeline of allocated, reserved and active memory over the lab's events, with gc/empty_cache/OOM markers.

The x axis is the event number (0 is the lab's start), so the same lesson draws the same picture; y is in
MiB (exact: bytes / 2**20), and the hover shows every event's line from the log with exact bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import ipywidgets as W
import plotly.graph_objects as go

from memviz.widgets._common import FIXED_AXIS, TEMPLATE, Piece, legend, line_swatch, marker_swatch, mib
from memviz.widgets.figure import Figure

if TYPE_CHECKING:
    from memviz.lab import Lab

__all__ = ["Timeline"]

KEYS = (  # (name, stat key, colour, line width in px, dash)
    ("allocated", "allocated_bytes.all.current", "#1f77b4", 3, "solid"),
    ("reserved", "reserved_bytes.all.current", "#ff7f0e", 2, "solid"),
    ("active", "active_bytes.all.current", "#2ca02c", 1.5, "dot"),
)
MARKERS = (  # (kind, event test, marker symbol, colour): all drawn by one trace
    ("gc.collect()", lambda e: e.action == "gc", "triangle-down", "#9467bd"),
    ("empty_cache()", lambda e: e.action == "empty_cache", "diamond", "#8c564b"),
    ("OOM", lambda e: e.oom is not None, "x", "#d62728"),
)


class Timeline(Piece):
    """Allocated / reserved / active after every lab event, as step lines; markers at gc, empty_cache, OOM.

    ``widget`` shows ``fig`` above ``legend`` (static HTML). ``fig`` is the ``plotly.graph_objects.FigureWidget``:
    ``fig.data[0]`` allocated, ``[1]`` reserved, ``[2]`` active (y in MiB, x the event number; point 0 is the
    lab's start), ``[3]`` the markers of every kind (y at reserved after the event; one trace, not one per
    kind: each trace costs every redraw). ``marks`` maps each kind in ``MARKERS`` to its events' x, as drawn.
    """

    def __init__(self, lab: Lab, *, height: int = 260) -> None:
        super().__init__(lab)
        traces = [
            go.Scatter(name=name, mode="lines", line={"shape": "hv", "color": color, "width": width, "dash": dash},
                       hovertemplate=f"{name} %{{y:.2f}} MiB<extra></extra>")
            for name, _, color, width, dash in KEYS
        ] + [go.Scatter(name="markers", mode="markers", marker={"size": 10},
                        hovertemplate="%{hovertext}<extra></extra>")]  # fmt: skip
        self.fig = Figure(
            traces,
            layout={
                "height": height, "margin": {"l": 60, "r": 10, "t": 30, "b": 40},
                "title": {"text": "memory over the lab's events", "font": {"size": 13}},
                # fixed margins: no automargin or tick-label overflow passes on every redraw (faster clicks)
                "xaxis": {"title": {"text": "event #"}, "rangemode": "tozero", **FIXED_AXIS},
                "yaxis": {"title": {"text": "MiB"}, "rangemode": "tozero", **FIXED_AXIS},
                "showlegend": False, "hovermode": "x unified",  # the legend is HTML, below
                "template": TEMPLATE,
            },
        )  # fmt: skip
        self.fig.data[0].hovertemplate = "%{hovertext}<br>allocated %{y:.2f} MiB<extra></extra>"
        self.fig.add_class("memviz-timeline")
        self.legend = legend(
            [(name, line_swatch(color, width, dash)) for name, _, color, width, dash in KEYS]
            + [(name, marker_swatch(color, symbol)) for name, _, symbol, color in MARKERS]
        )  # fmt: skip
        self.widget = W.VBox([self.fig, self.legend])
        self.marks: dict[str, list[int]] = {}
        self.refresh()

    def _draw(self, stats: Mapping[str, int], segments: list[dict] | None) -> None:
        events = self.lab.events
        start = events[0].stats_before if events else stats
        xs = list(range(len(events) + 1))
        texts = ["#0 lab start"] + [str(e) for e in events]
        series = [
            [mib(start.get(key, 0))] + [mib(e.stats_after.get(key, 0)) for e in events] for _, key, *_ in KEYS
        ]
        if not events:  # nothing recorded yet: point 0 is "now"
            texts = ["now"]
        marks: dict[str, list[int]] = {kind: [] for kind, _, _, _ in MARKERS}
        mx, my, symbols, colors, mtexts = [], [], [], [], []
        for e in events:
            for kind, test, symbol, color in MARKERS:
                if test(e):
                    marks[kind].append(e.index + 1)
                    mx.append(e.index + 1)
                    my.append(mib(e.reserved_bytes))
                    symbols.append(symbol)
                    colors.append(color)
                    mtexts.append(f"{kind}: {e}")
        self.marks = marks
        data = self.fig.data
        with self.fig.batch_update():
            for trace, ys in zip(data[: len(KEYS)], series, strict=True):
                trace.x, trace.y = xs, ys
            data[0].hovertext = texts  # the event's line once: "x unified" hover shows it above the values
            markers = data[len(KEYS)]
            markers.x, markers.y, markers.hovertext = mx, my, mtexts
            markers.marker.symbol, markers.marker.color = symbols, colors

"""A timeline of allocated, reserved and active memory over the lab's events, with gc/empty_cache/OOM markers.

The x axis is the event number, the same as the event log's: event ``#3`` is the step at x = 3, and the lab's
start (the state before ``#0``) is the level left of x = 0. y is in MiB (exact: bytes / 2**20), and the hover
shows every event's line from the log with exact bytes. The x range always ends past the latest event, so the
newest step is inside the plot with room to spare.

A click's cost stays flat in the length of the history: each event's values and hover line are computed once,
when the event is new, and a long history is drawn through each slice's first, last, lowest and highest event
(:func:`~memviz.widgets.downsample.envelope_of`; every peak, trough and marker is kept), at most
``4 * buckets`` points a line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

from memviz.widgets._common import FIXED_AXIS, TEMPLATE, Piece, legend, line_swatch, marker_swatch, mib
from memviz.widgets.downsample import envelope_of
from memviz.widgets.event_log import event_line
from memviz.widgets.figure import Figure

if TYPE_CHECKING:
    from memviz.events import Event
    from memviz.lab import Lab

__all__ = ["BUCKETS", "Timeline"]

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
BUCKETS = 200
"""Slices of a long history: up to ``4 * BUCKETS`` events are drawn whole, a longer one through each slice's
first, last, lowest and highest event (a plot is 400-900 px wide)."""
START_X = -1  # the lab's start: the level before event #0


class _History:
    """What the timeline draws of each event, computed once per event (the lab's events never change)."""

    def __init__(self, lab: Lab, stats: Mapping[str, int]) -> None:
        events = lab.events
        start = events[0].stats_before if events else stats
        self.lab = lab
        self.values: list[list[float]] = [[mib(start.get(key, 0))] for _, key, *_ in KEYS]
        self.texts: list[str] = ["lab start (before #0)" if events else "now: no events yet"]
        self.marks: dict[str, list[int]] = {kind: [] for kind, *_ in MARKERS}
        self.markers: list[tuple[int, str, str, str]] = []  # (event index, symbol, colour, hover text)
        self.seen = 0

    def add(self, events: list[Event]) -> None:
        for e in events[self.seen :]:
            stats = e.stats_after
            for values, (_, key, *_) in zip(self.values, KEYS, strict=True):
                values.append(mib(stats.get(key, 0)))
            line = event_line(e)
            self.texts.append(line)
            for kind, test, symbol, color in MARKERS:
                if test(e):
                    self.marks[kind].append(e.index)
                    self.markers.append((e.index, symbol, color, f"{kind}: {line}"))
        self.seen = len(events)


class Timeline(Piece):
    """Allocated / reserved / active after every lab event, as step lines; markers at gc, empty_cache, OOM.

    ``widget`` shows ``fig`` above ``legend`` (static HTML). ``fig`` is the ``plotly.graph_objects.FigureWidget``:
    ``fig.data[0]`` allocated, ``[1]`` reserved, ``[2]`` active (y in MiB, x the event number as in the log;
    the first point, at x = -1, is the lab's start), ``[3]`` the markers of every kind (y at reserved after
    the event; one trace, not one per kind: each trace costs every redraw). ``marks`` maps each kind in
    ``MARKERS`` to its events' numbers. A history longer than ``4 * buckets`` events is drawn through the
    events :func:`~memviz.widgets.downsample.envelope_of` picks (every marker's event among them).

    Args:
        lab: the lab to show.
        height: of the figure, in px (default 260). Its width follows the page (the dashboard's row).
        buckets: see ``BUCKETS`` (default 200).
    """

    def __init__(self, lab: Lab, *, height: int = 260, buckets: int = BUCKETS) -> None:
        super().__init__(lab)
        self.buckets = buckets
        traces = [
            go.Scatter(name=name, mode="lines", line={"shape": "hv", "color": color, "width": width, "dash": dash},
                       hovertemplate=f"{name} %{{y:.2f}} MiB<extra></extra>")
            for name, _, color, width, dash in KEYS
        ] + [go.Scatter(name="markers", mode="markers", marker={"size": 10},
                        hovertemplate="%{hovertext}<extra></extra>")]  # fmt: skip
        self.fig = Figure(
            traces,
            layout={
                "height": height, "autosize": True, "margin": {"l": 60, "r": 24, "t": 30, "b": 44},
                "title": {"text": "memory over the lab's events", "font": {"size": 13}},
                # fixed margins: no automargin or tick-label overflow passes on every redraw (faster clicks)
                "xaxis": {"title": {"text": "event # (as in the log)"}, "autorange": False, **FIXED_AXIS},
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
        self.widget = W.VBox([self.fig, self.legend], layout=W.Layout(width="100%"))
        self.marks: dict[str, list[int]] = {}
        self._history: _History | None = None
        self.refresh()

    def _forget(self) -> None:
        self._history = None

    def _draw(self, stats: Mapping[str, int], segments: list[dict] | None) -> None:
        events = self.lab.events
        h = self._history
        if h is None or h.lab is not self.lab or h.seen > len(events) or h.seen == 0:
            h = self._history = _History(self.lab, stats)
        h.add(events)
        self.marks = {kind: list(xs) for kind, xs in h.marks.items()}
        n = len(h.texts)  # points: the start, then one per event
        xs = np.arange(START_X, START_X + n, dtype=float)
        series = [np.asarray(values) for values in h.values]
        picks = envelope_of(series, (m[0] - START_X for m in h.markers), self.buckets)
        whole = len(picks) == n
        texts = h.texts if whole else [h.texts[i] for i in picks]
        mx = [m[0] for m in h.markers]
        reserved = series[1]
        my = [reserved[x - START_X] for x in mx]
        last = n - 1 + START_X
        pad = max(1.5, 0.04 * (last + 1))  # room right of the latest step: it is never on the plot's edge
        restyle = {
            "x": [xs if whole else xs[picks]] * len(KEYS) + [np.asarray(mx, dtype=float)],
            "y": [ys if whole else ys[picks] for ys in series] + [np.asarray(my, dtype=float)],
            "hovertext": [np.array(texts, dtype=object), None, None, np.array([m[3] for m in h.markers], dtype=object)],
            "marker.symbol": [None, None, None, [m[1] for m in h.markers]],
            "marker.color": [None, None, None, [m[2] for m in h.markers]],
        }
        relayout = {"xaxis.range": [-0.5 if events else START_X - 0.5, last + pad]}
        # One Plotly.update: plotly_update skips the per-element validation of trace property setters.
        self.fig.plotly_update(restyle_data=restyle, relayout_data=relayout, trace_indexes=list(range(len(KEYS) + 1)))

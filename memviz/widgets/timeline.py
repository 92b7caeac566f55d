"""A timeline of allocated, reserved and active memory over the lab's events, with gc/empty_cache/OOM markers.

The x axis is the event number, the same as the event log's: event ``#3`` is the step at x = 3, and the lab's
start (the state before ``#0``) is the level left of x = 0. y is in MiB (exact: bytes / 2**20), and the hover
shows the event (number, action, detail, as the log names it) above the three values after it. The x range
always ends past the latest event, so the newest step is inside the plot with room to spare.

A click's cost stays flat in the length of the history: each event's values and hover line are computed once,
when the event is new, and a long history is drawn through each slice's first, last, lowest and highest event
(:func:`~memviz.widgets.downsample.envelope_of`; every peak, trough and marker is kept), at most
``4 * buckets`` points a line (plus the markers' events).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

from memviz.widgets._common import FIXED_AXIS, TEMPLATE, Piece, legend, line_swatch, marker_swatch, mib
from memviz.widgets.downsample import envelope_of
from memviz.widgets.event_log import short_detail
from memviz.widgets.figure import Figure

if TYPE_CHECKING:
    from memviz.events import Event
    from memviz.lab import Lab

__all__ = ["BUCKETS", "Timeline", "hover_line"]

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
BUCKETS = 120
"""Slices of a long history: up to ``4 * BUCKETS`` events are drawn whole, a longer one through each slice's
first, last, lowest and highest event (a plot is 400-900 px wide). Each drawn point's hover line costs the
kernel about 8 µs a click (plotly's checks and the message), so this bounds a click's cost too."""
START_X = -1  # the lab's start: the level before event #0


def hover_line(event: Event) -> str:
    """The event's line in the hover: its number and action as in the log, and its (summarised) detail; the
    hover lists the bytes after it below."""
    return f"#{event.index} {event.action}: {'' if event.ok else 'OOM! '}{short_detail(event)}"


class _History:
    """What the timeline draws of each event, computed once per event (the lab's events never change).

    ``values`` holds allocated / reserved / active in MiB, one column per point (the start, then each event),
    in an array that doubles when full; ``markers`` the marker arrays, rebuilt only when a marker is added.
    """

    def __init__(self, lab: Lab, stats: Mapping[str, int]) -> None:
        events = lab.events
        start = events[0].stats_before if events else stats
        self.lab = lab
        self.values = np.zeros((len(KEYS), 1024))
        self.values[:, 0] = [mib(start.get(key, 0)) for _, key, *_ in KEYS]
        self.n = 1  # points so far
        self.texts: list[str] = ["lab start (before #0)" if events else "now: no events yet"]
        self.marks: dict[str, list[int]] = {kind: [] for kind, *_ in MARKERS}
        self._markers: list[tuple[int, str, str, str]] = []  # (event index, symbol, colour, hover text)
        self.markers: dict[str, np.ndarray] = self._marker_arrays()
        self.seen = 0

    def add(self, events: list[Event]) -> None:
        new = events[self.seen :]
        if not new:
            return
        if self.n + len(new) > self.values.shape[1]:
            grown = np.zeros((len(KEYS), 2 * (self.n + len(new))))
            grown[:, : self.n] = self.values[:, : self.n]
            self.values = grown
        marked = False
        for e in new:
            stats = e.stats_after
            self.values[:, self.n] = [mib(stats.get(key, 0)) for _, key, *_ in KEYS]
            self.n += 1
            self.texts.append(hover_line(e))
            for kind, test, symbol, color in MARKERS:
                if test(e):
                    self.marks[kind].append(e.index)
                    self._markers.append((e.index, symbol, color, f"{kind} at #{e.index}"))
                    marked = True
        self.seen = len(events)
        if marked:
            self.markers = self._marker_arrays()

    def _marker_arrays(self) -> dict[str, np.ndarray]:
        columns = list(zip(*self._markers, strict=True)) or [(), (), (), ()]
        index = np.asarray(columns[0], dtype=np.int64)
        return {"x": index.astype(float), "point": index - START_X, "symbol": np.array(columns[1], dtype=object),
                "color": np.array(columns[2], dtype=object), "text": np.array(columns[3], dtype=object)}  # fmt: skip


def thin_markers(markers: dict[str, np.ndarray], n: int, buckets: int) -> dict[str, np.ndarray]:
    """At most one marker of each kind per slice of the history once there are more than ``2 * buckets``
    markers: in a slice a few px wide they would be drawn on top of one another. The one kept is the slice's
    first of that kind; its hover says how many it stands for."""
    if len(markers["x"]) <= 2 * buckets:
        return markers
    width = -(-n // buckets)
    key = (markers["point"] // width) * len(MARKERS) + np.unique(markers["symbol"], return_inverse=True)[1]
    _, first, counts = np.unique(key, return_index=True, return_counts=True)
    order = np.argsort(first)  # in event order
    first, counts = first[order], counts[order]
    kept = {k: v[first] for k, v in markers.items()}
    kept["text"] = np.array([t if c == 1 else f"{t} and {c - 1} more nearby" for t, c in zip(kept["text"], counts,
                             strict=True)], dtype=object)  # fmt: skip
    return kept


class Timeline(Piece):
    """Allocated / reserved / active after every lab event, as step lines; markers at gc, empty_cache, OOM.

    ``widget`` shows ``fig`` above ``legend`` (static HTML). ``fig`` is the ``plotly.graph_objects.FigureWidget``:
    ``fig.data[0]`` allocated, ``[1]`` reserved, ``[2]`` active (y in MiB, x the event number as in the log;
    the first point, at x = -1, is the lab's start), ``[3]`` the markers of every kind (y at reserved after
    the event; one trace, not one per kind: each trace costs every redraw). ``marks`` maps each kind in
    ``MARKERS`` to its events' numbers. A history longer than ``4 * buckets`` events is drawn, line by line,
    through the events :func:`~memviz.widgets.downsample.envelope_of` picks for that line (its own peaks and
    troughs, and every marker's event).

    Args:
        lab: the lab to show.
        height: of the figure, in px (default 260). Its width follows the page (the dashboard's row).
        buckets: see ``BUCKETS`` (default 120).
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
        n = h.n  # points: the start, then one per event
        xs = np.arange(START_X, START_X + n, dtype=float)
        series = [h.values[k, :n] for k in range(len(KEYS))]
        m = thin_markers(h.markers, n, self.buckets)
        picks = [envelope_of([ys], m["point"], self.buckets) for ys in series]  # each line its own peaks
        texts = h.texts if len(picks[0]) == n else [h.texts[i] for i in picks[0]]
        last = n - 1 + START_X
        pad = max(1.5, 0.04 * (last + 1))  # room right of the latest step: it is never on the plot's edge
        restyle = {
            "x": [xs[p] for p in picks] + [m["x"]],
            "y": [ys[p] for ys, p in zip(series, picks, strict=True)] + [series[1][m["point"]]],
            "hovertext": [np.array(texts, dtype=object), None, None, m["text"]],
            "marker.symbol": [None, None, None, m["symbol"]],
            "marker.color": [None, None, None, m["color"]],
        }
        relayout = {"xaxis.range": [-0.5 if events else START_X - 0.5, last + pad]}
        # One Plotly.update: plotly_update skips the per-element validation of trace property setters.
        self.fig.plotly_update(restyle_data=restyle, relayout_data=relayout, trace_indexes=list(range(len(KEYS) + 1)))

"""The panels of the snapshot viewer: the recorded timeline with its cursor, and the scrub bar."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

from memviz.snapshots import ReplayResult, SnapshotHistory
from memviz.widgets._common import TEMPLATE, MiB
from memviz.widgets.downsample import envelope
from memviz.widgets.figure import Figure

__all__ = ["PLAY_FRAMES", "SERIES", "TIMELINE_BUCKETS", "RecordedTimeline", "ScrubBar"]

SERIES = (  # (name, Timeline attribute, colour, width, dash)
    ("allocated", "allocated_bytes", "#1f77b4", 2.5, "solid"),
    ("reserved", "reserved_bytes", "#ff7f0e", 2, "solid"),
    ("active", "active_bytes", "#2ca02c", 1.5, "dot"),
)
PLAY_FRAMES = 400  # the play button crosses the whole trace in about this many steps
TIMELINE_BUCKETS = 2000  # a long trace is drawn as the first, last, min and max event of this many slices


class RecordedTimeline:
    """Allocated / reserved / active over a recorded trace (through :func:`envelope`'s events: exact values,
    every peak kept), its recorded OOMs as red crosses, a what-if replay's reserved bytes and OOMs when given,
    and a vertical cursor (``fig.layout.shapes[0]``) that :meth:`show` moves."""

    def __init__(self, history: SnapshotHistory, replay: ReplayResult | None) -> None:
        tl = history.timeline
        self.series = {name: np.frombuffer(getattr(tl, attr), dtype=np.int64) for name, attr, *_ in SERIES}
        reserved = self.series["reserved"]
        ooms = list(tl.oom_indices)
        traces: list[Any] = [
            _line(self.series[name], name, color, width, dash) for name, _, color, width, dash in SERIES
        ]
        traces.append(_crosses(ooms, reserved, "OOM (recorded)", "x", "#d62728", "OOM at event %{x}"))
        if replay is not None:
            r = np.frombuffer(replay.reserved_bytes, dtype=np.int64)  # type: ignore[arg-type]
            label = f"reserved, what-if {replay.name}"
            traces.append(_line(r, label, "#9467bd", 1.5, "dash"))
            oom_x = sorted(i for i in replay.oom_event_indices if i >= 0)
            traces.append(_crosses(oom_x, r, f"OOM, what-if {replay.name}", "x-open", "#9467bd",
                                   "what-if OOM at event %{x}"))  # fmt: skip
        cursor = {"type": "line", "xref": "x", "yref": "paper", "x0": 0, "x1": 0, "y0": 0, "y1": 1,
                  "line": {"color": "#444", "width": 1.5}}  # fmt: skip
        self.fig = Figure(
            traces,
            layout={
                "height": 400, "autosize": True, "margin": {"l": 60, "r": 24, "t": 30, "b": 100},
                "title": {"text": "memory over the recorded events", "font": {"size": 12}},
                "xaxis": {"title": {"text": "event #"}, "range": [0, max(len(history) - 1, 1)]},
                "yaxis": {"title": {"text": "MiB"}, "rangemode": "tozero"},
                "legend": {"orientation": "h", "y": -0.32}, "hovermode": "closest", "template": TEMPLATE,
                "shapes": [cursor],
            },
        )  # fmt: skip
        self.fig.add_class("memviz-snapshot-timeline")
        self.widget = W.VBox([self.fig], layout=W.Layout(width="100%"))

    def show(self, index: int) -> None:
        """Put the cursor at event ``index``."""
        with self.fig.batch_update():
            self.fig.layout.shapes[0].update(x0=index, x1=index)


def _line(values: np.ndarray, name: str, color: str, width: float, dash: str) -> go.Scattergl:
    x = envelope(values, TIMELINE_BUCKETS)
    return go.Scattergl(x=x, y=values[x] / MiB, mode="lines", name=name,
                        line={"shape": "hv", "color": color, "width": width, "dash": dash},
                        hovertemplate=f"event %{{x}}<br>{name} %{{y:.2f}} MiB<extra></extra>")  # fmt: skip


def _crosses(xs: list[int], reserved: np.ndarray, name: str, symbol: str, color: str, hover: str) -> go.Scatter:
    return go.Scatter(x=xs, y=[reserved[i] / MiB for i in xs], name=name, mode="markers",
                      marker={"symbol": symbol, "color": color, "size": 11},
                      hovertemplate=hover + "<extra></extra>")  # fmt: skip


class ScrubBar:
    """Play, previous, the event slider, next, and "next OOM" (disabled, saying why, when there is none).

    ``slider`` holds the event shown; the buttons call ``step(±1)`` and ``next_oom()`` through ``guard``.
    """

    def __init__(self, n: int, *, has_oom: bool, why_no_oom: str, guard: Callable, step: Callable[[int], Any],
                 next_oom: Callable[[], Any]) -> None:  # fmt: skip
        self.slider = W.IntSlider(value=0, min=0, max=n - 1, description="event", continuous_update=True,
                                  layout=W.Layout(width="520px", max_width="100%"))  # fmt: skip
        self.play = W.Play(value=0, min=0, max=n - 1, step=max(1, n // PLAY_FRAMES), interval=150,
                           description="play", tooltip="play through the trace")  # fmt: skip
        W.jslink((self.play, "value"), (self.slider, "value"))
        self.prev_button = W.Button(description="◀", tooltip="previous event", layout=W.Layout(width="40px"))
        self.next_button = W.Button(description="▶", tooltip="next event", layout=W.Layout(width="40px"))
        # plain text: the fonts CI and many Linux desktops have (DejaVu) lack the ⏭ glyph
        self.oom_button = W.Button(description="next OOM »", button_style="danger", disabled=not has_oom,
                                   tooltip="jump to the next OOM event" if has_oom else why_no_oom,
                                   layout=W.Layout(width="auto", min_width="max-content"))  # fmt: skip
        self.prev_button.on_click(guard(lambda _: step(-1)))
        self.next_button.on_click(guard(lambda _: step(1)))
        self.oom_button.on_click(guard(lambda _: next_oom()))
        self.widget = W.HBox([self.play, self.prev_button, self.slider, self.next_button, self.oom_button],
                             layout=W.Layout(flex_flow="row wrap", align_items="center"))  # fmt: skip

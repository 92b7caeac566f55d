"""Scrub a recorded snapshot: the allocator's segments and blocks at any event of ``device_traces``.

``SnapshotViewer("my_run.pickle")`` shows a slider (with play and step buttons) over the trace's events,
the timeline of allocated / reserved / active memory (a long trace drawn through each pixel's first, last,
lowest and highest event, so every peak shows) with OOM events marked and a vertical line at the slider,
the segment map of the state right after that event (the lab's :class:`SegmentMap`, drawing
:meth:`SnapshotHistory.state_at`), and a readout of the event. "next OOM" jumps to the next recorded OOM
event, or to the next event where a what-if replay (``replay=``) would have run out of memory.

Everything per event is computed once (:class:`~memviz.snapshots.SnapshotHistory` rebuilds the trace and
keeps a copy of the state every 2048 events); a slider move replays at most 2048 events from the nearest
copy, so a move costs a few milliseconds on a 63,008-event training run whatever the jump.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

from memviz.snapshots import ReplayResult, SnapshotError, SnapshotHistory
from memviz.units import format_bytes
from memviz.widgets._common import TEMPLATE, MiB, close_tree, escape, exact_bytes, guarded
from memviz.widgets.downsample import envelope
from memviz.widgets.figure import Figure
from memviz.widgets.segment_map import LIVE_STATES, StateMap

__all__ = ["SnapshotViewer", "StateMap", "envelope", "event_text", "history_of"]

SERIES = (  # (name, Timeline attribute, colour, width, dash)
    ("allocated", "allocated_bytes", "#1f77b4", 2.5, "solid"),
    ("reserved", "reserved_bytes", "#ff7f0e", 2, "solid"),
    ("active", "active_bytes", "#2ca02c", 1.5, "dot"),
)
PLAY_FRAMES = 400  # the play button crosses the whole trace in about this many steps
TIMELINE_BUCKETS = 2000  # a long trace is drawn as the first, last, min and max event of this many slices


def history_of(source: Any, *, device: int = 0, progress: bool | None = None) -> SnapshotHistory:
    """A :class:`SnapshotHistory` from a path, a binary file, pickle bytes, a snapshot dict, or a history.

    Raises:
        TypeError: ``source`` is none of these.
        SnapshotError: the data is not a safe, well-formed snapshot (see :func:`memviz.snapshots.load_snapshot`).
    """
    if isinstance(source, SnapshotHistory):
        return source
    if isinstance(source, (str, os.PathLike, bytes, bytearray, memoryview, Mapping)) or hasattr(source, "read"):
        return SnapshotHistory(source, device=device, progress=progress)
    raise TypeError(
        f"cannot show a {type(source).__name__}: give a snapshot pickle's path or bytes, an open binary "
        "file, the dict from torch.cuda.memory._snapshot(), or a memviz.snapshots.SnapshotHistory"
    )


def _frame_label(frames: Any) -> str:
    """Where a recorded stack left the user's code: the innermost Python frame outside installed packages
    (else the innermost Python frame), as ``"function (file.py:line)"``; "" without Python frames."""
    python = [f for f in frames or () if isinstance(f, Mapping) and str(f.get("filename", "")).endswith(".py")]
    mine = [f for f in python if "-packages" not in f["filename"] and "/torch/" not in f["filename"]]
    for f in (mine or python)[:1]:
        return f"{f.get('name', '?')} ({os.path.basename(f['filename'])}:{f.get('line', 0)})"
    return ""


def event_text(history: SnapshotHistory, index: int) -> str:
    """One line for event ``index``: what happened, the size and address, and the totals right after it."""
    e = history.events[index]
    tl = history.timeline
    action = e.get("action", "?")
    parts = [f"event {index:,} of {len(history):,}: {action}"]
    if "size" in e:
        parts.append(exact_bytes(e["size"]))
    if "addr" in e and action != "oom":
        parts.append(f"at 0x{e['addr']:x}")
    if action == "oom" and "device_free" in e:
        parts.append(f"(driver had {format_bytes(e['device_free'])} free)")
    where = _frame_label(e.get("frames"))
    if where:
        parts.append(f"from {where}")
    after = (
        f"after it: allocated {exact_bytes(tl.allocated_bytes[index])}, "
        f"reserved {exact_bytes(tl.reserved_bytes[index])}, active {exact_bytes(tl.active_bytes[index])}"
    )
    return " ".join(parts) + "; " + after


def _block_names(segments: list[dict[str, Any]]) -> dict[int, str]:
    """Hover labels of live blocks: the innermost Python frame that allocated them, when recorded."""
    names = {}
    for s in segments:
        for b in s["blocks"]:
            if b["state"] in LIVE_STATES:
                names[b["address"]] = _frame_label(b.get("frames")) or "live block (no stack recorded)"
    return names


class SnapshotViewer:
    """A scrubber over a recorded snapshot: slider, timeline, segment map and a readout of the event.

    Args:
        source: a snapshot pickle's path or bytes, an open binary file, a ``_snapshot()`` dict, or a
            :class:`~memviz.snapshots.SnapshotHistory` (built once; reuse it for ``what_if``).
        device: which device's trace to show (default: 0).
        replay: a :class:`~memviz.snapshots.ReplayResult` (with its timeline) to overlay: its reserved bytes
            as a dashed line and its OOM events as markers that "next OOM" also visits (default: None).
        index: the event to show first (default: 0).
        progress: ``tqdm.auto`` bar while rebuilding a long trace (default: None, from 50,000 events).

    Attributes: ``history``, ``slider`` (``IntSlider`` over event indices), ``play``, ``timeline_fig`` (lines
    through the events :func:`envelope` picks, exact values; ``layout.shapes[0]`` the cursor), ``map`` (a
    :class:`StateMap`; its ``fig``), ``readout`` (``HTML``; ``text`` holds its plain line),
    ``oom_indices`` (what "next OOM" visits), ``out`` (tracebacks), ``widget`` (the ``VBox`` displayed),
    ``last_update_s`` (Python time of the last slider-to-figures update).

    Raises:
        TypeError / SnapshotError: ``source`` is not a snapshot, or its trace has no events to scrub.
    """

    def __init__(
        self,
        source: Any,
        *,
        device: int = 0,
        replay: ReplayResult | None = None,
        index: int = 0,
        progress: bool | None = None,
    ) -> None:
        self.history = history = history_of(source, device=device, progress=progress)
        n = len(history)
        if n == 0:
            raise SnapshotError(
                "the snapshot has no device_traces events to scrub: call "
                "torch.cuda.memory._record_memory_history() before the run you want to see"
            )
        tl = history.timeline
        if replay is not None and (replay.reserved_bytes is None or len(replay.reserved_bytes) != n):
            raise ValueError("replay= must be a ReplayResult of this trace replayed with timeline=True")
        self.replay = replay
        self.recorded_ooms = list(tl.oom_indices)
        self.replay_ooms = sorted(i for i in (replay.oom_event_indices if replay else ()) if i >= 0)
        self.oom_indices = sorted(set(self.recorded_ooms) | set(self.replay_ooms))
        self.out = W.Output()
        self.text = ""
        self.last_update_s = 0.0
        self.index = -1
        self._series = {name: np.frombuffer(getattr(tl, attr), dtype=np.int64) for name, attr, *_ in SERIES}

        self.timeline_fig = self._timeline_figure()
        self.map = StateMap(max_height=520)
        self.map.fig.layout.width = 560
        self.map.fig.layout.title.font.size = 12

        self.slider = W.IntSlider(
            value=0, min=0, max=n - 1, description="event", continuous_update=True, layout=W.Layout(width="520px")
        )
        self.play = W.Play(
            value=0,
            min=0,
            max=n - 1,
            step=max(1, n // PLAY_FRAMES),
            interval=150,
            description="play",
            tooltip="play through the trace",
        )
        W.jslink((self.play, "value"), (self.slider, "value"))
        self.prev_button = W.Button(description="◀", tooltip="previous event", layout=W.Layout(width="40px"))
        self.next_button = W.Button(description="▶", tooltip="next event", layout=W.Layout(width="40px"))
        self.oom_button = W.Button(
            description="next OOM ⏭",
            button_style="danger",
            disabled=not self.oom_indices,
            tooltip=(
                "jump to the next OOM event"
                if self.oom_indices
                else "no OOM in this recording" + (" or replay" if replay else "")
            ),
        )
        self.status = W.HTML()
        self.readout = W.HTML(layout=W.Layout(width="100%"))
        guard = guarded(self.out, self._say)
        self.slider.observe(guard(self._on_slider), names="value")
        self.prev_button.on_click(guard(lambda _: self.step(-1)))
        self.next_button.on_click(guard(lambda _: self.step(1)))
        self.oom_button.on_click(guard(lambda _: self.next_oom()))

        header = W.HTML(f"<b>{escape(self._title())}</b>")
        controls = W.HBox([self.play, self.prev_button, self.slider, self.next_button, self.oom_button])
        self.widget = W.VBox(
            [header, controls, self.readout, self.status, W.HBox([self.timeline_fig, self.map.widget]), self.out]
        )
        self.widget.add_class("memviz-snapshot-viewer")
        self.slider.value = index % n
        if self.index != self.slider.value:  # index 0: no change, so draw it here
            self._render(self.slider.value)

    # -- drawing --------------------------------------------------------------------------------
    def _title(self) -> str:
        h = self.history
        conf = h.settings.alloc_conf() or "default"
        peak = int(self._series["reserved"].max())
        ooms = f"{len(self.recorded_ooms)} OOM events" if self.recorded_ooms else "no OOM event"
        return (
            f"{len(h):,} events, allocator config {conf}; peak reserved {format_bytes(peak)}; {ooms}; "
            f"{len(h.initial_blocks)} blocks were live before recording started"
        )

    def _timeline_figure(self) -> go.FigureWidget:
        def line(values: np.ndarray, **kwargs: Any) -> go.Scattergl:
            x = envelope(values, TIMELINE_BUCKETS)
            return go.Scattergl(x=x, y=values[x] / MiB, mode="lines", **kwargs)

        traces: list[Any] = [
            line(
                self._series[name],
                name=name,
                line={"shape": "hv", "color": color, "width": width, "dash": dash},
                hovertemplate=f"event %{{x}}<br>{name} %{{y:.2f}} MiB<extra></extra>",
            )
            for name, _, color, width, dash in SERIES
        ]
        reserved = self._series["reserved"]
        ooms = self.recorded_ooms
        traces.append(
            go.Scatter(
                x=ooms,
                y=[reserved[i] / MiB for i in ooms],
                name="OOM (recorded)",
                mode="markers",
                marker={"symbol": "x", "color": "#d62728", "size": 11},
                hovertemplate="OOM at event %{x}<extra></extra>",
            )
        )
        if self.replay is not None:
            r = np.frombuffer(self.replay.reserved_bytes, dtype=np.int64)  # type: ignore[arg-type]
            label = f"reserved, what-if {self.replay.name}"
            traces.append(
                line(
                    r,
                    name=label,
                    line={"shape": "hv", "color": "#9467bd", "width": 1.5, "dash": "dash"},
                    hovertemplate=f"event %{{x}}<br>{label} %{{y:.2f}} MiB<extra></extra>",
                )
            )
            traces.append(
                go.Scatter(
                    x=self.replay_ooms,
                    y=[r[i] / MiB for i in self.replay_ooms],
                    name=f"OOM, what-if {self.replay.name}",
                    mode="markers",
                    marker={"symbol": "x-open", "color": "#9467bd", "size": 11},
                    hovertemplate="what-if OOM at event %{x}<extra></extra>",
                )
            )
        fig = Figure(
            traces,
            layout={
                "height": 380,
                "width": 560,
                "margin": {"l": 60, "r": 10, "t": 30, "b": 40},
                "title": {"text": "memory over the recorded events", "font": {"size": 12}},
                "xaxis": {"title": {"text": "event #"}, "range": [0, max(len(self.history) - 1, 1)]},
                "yaxis": {"title": {"text": "MiB"}, "rangemode": "tozero"},
                "legend": {"orientation": "h", "y": -0.2},
                "hovermode": "closest",
                "template": TEMPLATE,
                "shapes": [
                    {
                        "type": "line",
                        "xref": "x",
                        "yref": "paper",
                        "x0": 0,
                        "x1": 0,
                        "y0": 0,
                        "y1": 1,
                        "line": {"color": "#444", "width": 1.5},
                    }
                ],
            },
        )
        fig.add_class("memviz-snapshot-timeline")
        return fig

    def _render(self, index: int) -> None:
        start = time.perf_counter()
        segments = self.history.state_at(index)
        self.map.show(segments, _block_names(segments))
        with self.timeline_fig.batch_update():
            self.timeline_fig.layout.shapes[0].update(x0=index, x1=index)
        self.text = event_text(self.history, index)
        oom = self.history.events[index].get("action") == "oom"
        if index in self.replay_ooms and self.replay is not None:
            self.text += f"; what-if {self.replay.name}: this request would fail (OOM)"
            oom = True
        style = "color:#d62728;font-weight:600;" if oom else ""
        self.readout.value = (
            f'<div style="font-family:var(--jp-code-font-family,monospace);font-size:12px;'
            f'{style}">{escape(self.text)}</div>'
        )
        self.index = index
        self.last_update_s = time.perf_counter() - start

    def _say(self, message: str) -> None:
        self.status.value = f'<span style="color:#d62728">{escape(message)}</span>' if message else ""

    # -- actions --------------------------------------------------------------------------------
    def _on_slider(self, change: Mapping[str, Any]) -> None:
        self._say("")
        self._render(int(change["new"]))

    def goto(self, index: int) -> None:
        """Show the state right after event ``index`` (negative counts from the end).

        Raises:
            IndexError: no such event.
        """
        n = len(self.history)
        if not -n <= index < n:
            raise IndexError(f"event {index} out of range: the trace has {n:,} events (0 to {n - 1:,})")
        index %= n
        if index == self.slider.value:
            if index != self.index:
                self._render(index)
        else:
            self.slider.value = index

    def step(self, delta: int) -> None:
        """Move the slider by ``delta`` events (clamped to the trace)."""
        self.goto(min(max(self.slider.value + delta, 0), len(self.history) - 1))

    def next_oom(self) -> int | None:
        """Jump to the first OOM event after the slider (wrapping to the first one); return it, or None."""
        if not self.oom_indices:
            self._say("no OOM event in this recording" + (" or in the replay" if self.replay else ""))
            return None
        after = [i for i in self.oom_indices if i > self.slider.value]
        target = after[0] if after else self.oom_indices[0]
        self.goto(target)
        k = self.oom_indices.index(target) + 1
        self.status.value = escape(f"OOM {k} of {len(self.oom_indices)}" + ("" if after else " (wrapped around)"))
        return target

    def close(self) -> None:
        """Close every widget of the viewer."""
        close_tree(self.widget)

    def _repr_mimebundle_(self, **kwargs: Any):
        return self.widget._repr_mimebundle_(**kwargs)

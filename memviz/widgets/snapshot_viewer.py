"""Scrub a recorded snapshot: the allocator's segments and blocks at any event of ``device_traces``.

``SnapshotViewer("my_run.pickle")`` shows a slider (with play and step buttons) over the trace's events,
the timeline of allocated / reserved / active memory (a long trace drawn through each pixel's first, last,
lowest and highest event, so every peak shows) with OOM events marked and a vertical line at the slider,
the segment map of the state right after that event (the lab's :class:`SegmentMap`, drawing
:meth:`SnapshotHistory.state_at`), and a readout of the event. "next OOM" jumps to the next recorded OOM
event, or to the next event where a what-if replay (``replay=``) would have run out of memory.

Three panels, one update path: :class:`ScrubBar` (play, step, slider, next OOM) moves ``slider``; every
move goes through :meth:`SnapshotViewer.goto`'s one render, which redraws :class:`RecordedTimeline`'s
cursor, the :class:`~memviz.widgets.segment_map.StateMap` and the readout.

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

from memviz.snapshots import ReplayResult, SnapshotError, SnapshotHistory, check_fidelity
from memviz.snapshots.frames import frame_label as _frame_label
from memviz.snapshots.verdict import Verdict
from memviz.units import format_bytes
from memviz.widgets._common import close_tree, escape, exact_bytes, guarded
from memviz.widgets.downsample import envelope
from memviz.widgets.row import figure_row
from memviz.widgets.segment_map import LIVE_STATES, PENDING_STATES, StateMap
from memviz.widgets.snapshot_panels import RecordedTimeline, ScrubBar

__all__ = ["RecordedTimeline", "ScrubBar", "SnapshotViewer", "envelope", "event_text", "history_of", "replay_verdict"]

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


def replay_verdict(history: SnapshotHistory, replay: ReplayResult, progress: bool | None = None) -> Verdict:
    """Whether ``replay`` of ``history`` can be trusted: the verdict it carries, else that of a fidelity check
    already run on ``history`` (a replayable one wins: it was run under the device and cap the recording had),
    else that of a new check under the recording's own device and no cap."""
    if replay.verdict is not None:
        return replay.verdict
    known = [report.verdict for report in history.verdicts.values()]
    if known:
        return next((v for v in known if v.replayable), known[0])
    return check_fidelity(history, progress=progress).verdict


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
            if b["state"] in LIVE_STATES or b["state"] in PENDING_STATES:
                names[b["address"]] = _frame_label(b.get("frames")) or "live block (no stack recorded)"
    return names


class SnapshotViewer:
    """A scrubber over a recorded snapshot: slider, timeline, segment map and a readout of the event.

    Args:
        source: a snapshot pickle's path or bytes, an open binary file, a ``_snapshot()`` dict, or a
            :class:`~memviz.snapshots.SnapshotHistory` (built once; reuse it for ``what_if``).
        device: which device's trace to show (default: 0).
        replay: a :class:`~memviz.snapshots.ReplayResult` (with its timeline) to overlay: its reserved bytes
            as a dashed line and its OOM events as markers that "next OOM" also visits (default: None). Shown
            only if the recording can be replayed exactly (:func:`~memviz.snapshots.check_fidelity`, run here if
            no check of this history ran yet); else the header says why instead.
        index: the event to show first (default: 0).
        progress: ``tqdm.auto`` bar while rebuilding a long trace (default: None, from 50,000 events).

    Attributes: ``history``, ``bar`` (:class:`ScrubBar`) with ``slider`` (``IntSlider`` over event indices),
    ``play`` and the buttons, ``timeline`` (:class:`RecordedTimeline`; ``timeline_fig`` its figure, whose
    ``layout.shapes[0]`` is the cursor), ``map`` (a :class:`~memviz.widgets.segment_map.StateMap`; its
    ``fig``), ``header`` and ``readout`` (``HTML``; ``text`` holds the readout's plain line), ``oom_indices``
    (what "next OOM" visits), ``out`` (tracebacks), ``widget`` (the ``VBox`` displayed), ``last_update_s``
    (Python time of the last slider-to-figures update).

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
        if replay is not None and (replay.reserved_bytes is None or len(replay.reserved_bytes) != n):
            raise ValueError("replay= must be a ReplayResult of this trace replayed with timeline=True")
        self.refused: Verdict | None = None  # why the replay given is not shown
        if replay is not None:
            verdict = replay_verdict(history, replay, progress)
            if not verdict.replayable:
                self.refused, replay = verdict, None
        self.replay = replay
        self.recorded_ooms = list(history.timeline.oom_indices)
        self.replay_ooms = sorted(i for i in (replay.oom_event_indices if replay else ()) if i >= 0)
        self.oom_indices = sorted(set(self.recorded_ooms) | set(self.replay_ooms))
        self.out = W.Output()
        self.text = ""
        self.last_update_s = 0.0
        self.index = -1

        self.timeline = RecordedTimeline(history, replay)
        self.timeline_fig = self.timeline.fig
        self.map = StateMap()
        self.map.fig.layout.title.font.size = 12
        guard = guarded(self.out, self._say)
        self.bar = ScrubBar(n, has_oom=bool(self.oom_indices), guard=guard, step=self.step, next_oom=self.next_oom,
                            why_no_oom="no OOM in this recording" + (" or replay" if replay else ""))  # fmt: skip
        self.slider, self.play = self.bar.slider, self.bar.play
        self.prev_button, self.next_button = self.bar.prev_button, self.bar.next_button
        self.oom_button = self.bar.oom_button
        self.slider.observe(guard(lambda change: self._render(int(change["new"]))), names="value")
        self.status = W.HTML()
        self.readout = W.HTML(layout=W.Layout(width="100%"))
        self.header = W.HTML(f"<b>{escape(self._title())}</b>")
        self.widget = W.VBox([self.header, self.bar.widget, self.readout, self.status,
                              figure_row([self.timeline.widget, self.map.widget]), self.out])  # fmt: skip
        self.widget.add_class("memviz-snapshot-viewer")
        self.goto(index % n)

    # -- drawing --------------------------------------------------------------------------------
    def _title(self) -> str:
        """The header: events, config, peak, and the OOMs of the recording and of the replay, each named."""
        h = self.history
        conf = h.settings.alloc_conf() or "default"
        peak = int(self.timeline.series["reserved"].max())
        recorded = len(self.recorded_ooms)
        ooms = f"{recorded} OOM events recorded" if recorded else "no OOM in the recording"
        if self.replay is not None:
            k = len(self.replay_ooms)
            ooms += f"; the what-if replay ({self.replay.name}) runs out of memory at {k} events" if k else (
                f"; none in the what-if replay ({self.replay.name})")
        refused = "" if self.refused is None else f"; no what-if replay shown: the recording {self.refused.describe()}"
        return (
            f"{len(h):,} events, allocator config {conf}; peak reserved {format_bytes(peak)}; {ooms}; "
            f"{len(h.initial_blocks)} blocks were live before recording started{refused}"
        )

    def _render(self, index: int) -> None:
        """The one update: the state right after event ``index`` in the map, the cursor, the readout."""
        self._say("")
        start = time.perf_counter()
        segments = self.history.state_at(index)
        self.map.show(segments, _block_names(segments))
        self.timeline.show(index)
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
            self.slider.value = index  # the slider's observer renders

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

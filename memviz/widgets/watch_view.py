"""What ``memviz.watch()`` shows: live gauges and timeline while the block runs, then the peak or the OOM.

Live (updated from the sampler's thread, while the cell still runs): the dashboard's gauges
(:class:`~memviz.widgets.gauges.GaugeWidget`: allocated and reserved against the cap or the device, with their
peaks, and the driver's used memory on a GPU) and the :class:`~memviz.widgets.live_timeline.LiveTimeline`.
At most five times a second (:data:`PUSH_EVERY_S`) the samples since the last update go to the page in two small
comm messages (the gauges' rows, the timeline's new rows); nothing is redrawn in the kernel.

When the block ends (from the program's thread): the summary (:meth:`memviz.watching.Watch.summary`), the
largest live tensors at the peak or the OOM and where they were made, the
:class:`~memviz.widgets.snapshot_viewer.SnapshotViewer` of the recorded history opened at that event (buttons
jump between the peak and the OOM), and "what if…", which replays the history under other allocator configs
(:class:`~memviz.widgets.whatif_table.WhatIfTable`) on a click. Without a history (``history=False``) the
segment map of the end, or of the OOM, stands in for the viewer.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import ipywidgets as W
import numpy as np

from memviz.units import format_bytes
from memviz.widgets._common import button, close_tree, escape, exact_bytes, guarded, legend, line_swatch
from memviz.widgets.downsample import envelope_of
from memviz.widgets.gauges import GaugeWidget, gauge_row
from memviz.widgets.live_timeline import SERIES, LiveTimeline
from memviz.widgets.segment_map import StateMap

if TYPE_CHECKING:
    from memviz.watching.samples import Sample
    from memviz.watching.watch import Watch

__all__ = ["FINAL_POINTS", "PUSH_EVERY_S", "WatchView"]

PUSH_EVERY_S = 0.2
"""The page is updated at most this often (5 times a second), whatever the sampling rate: each update is two
small comm messages, a few hundred µs of the watched process's time; the samples in between travel together."""
FINAL_POINTS = 2000
"""Buckets of the run kept in the timeline's saved rows (each bucket's first, last, lowest and highest sample of
every line, so at most a few times this many rows; every peak kept)."""


class WatchView:
    """The view of one :class:`~memviz.watching.Watch` (see the module docstring).

    Attributes: ``gauges`` (:class:`GaugeWidget`), ``timeline`` (:class:`LiveTimeline`), ``result`` (the
    ``VBox`` the end fills), ``viewer`` (the :class:`SnapshotViewer`, or None), ``map`` (the
    :class:`StateMap` without a history, or None), ``what_if`` (the :class:`WhatIfTable` once asked for),
    ``out`` (tracebacks of unexpected errors in the buttons), ``widget`` (the ``VBox`` displayed), ``pushes``
    (updates sent while running).
    """

    def __init__(self, watch: Watch) -> None:
        self.watch = watch
        source = watch.source
        self.limit_bytes, self.limit_word = _limit(source)
        self.header = W.HTML(f"<b>memviz watch</b> — {escape(watch.describe())}")
        self.header.add_class("memviz-watch-header")
        name = getattr(source, "device_name", None) or "the job"
        self.gauges = GaugeWidget()
        if self.limit_bytes:
            self.gauges.title = f"{name}: {self.limit_word} {exact_bytes(self.limit_bytes)}"
        self.gauges.add_class("memviz-gauges-widget")
        self.timeline = LiveTimeline(title=name, limit_bytes=self.limit_bytes or 0,
                                     max_points=watch.samples.max_points)  # fmt: skip
        self.timeline.add_class("memviz-live-timeline")
        lines = [(name, line_swatch(color, width, "dot" if dash else "solid"))
                 for _, name, color, width, dash in SERIES]  # fmt: skip
        self.legend = legend([*lines, ("cap", line_swatch("#d62728", 1.5, "dot"))])
        self.result = W.VBox(layout=W.Layout(width="100%"))
        self.result.add_class("memviz-watch-result")
        self.out = W.Output()
        self.widget = W.VBox([self.header, self.gauges, self.timeline, self.legend, self.result, self.out],
                             layout=W.Layout(width="100%"))  # fmt: skip
        self.widget.add_class("memviz-watch")
        self.viewer: Any = None
        self.map: StateMap | None = None
        self.what_if: Any = None
        self.pushes = 0
        self._marks = 0
        self._pending: list[Sample] = []
        self._pushed_at = -PUSH_EVERY_S

    # -- live, from the sampler's thread ----------------------------------------------------------------

    def push(self, samples: list[Sample]) -> None:
        """Take new samples; at most every ``PUSH_EVERY_S`` show them: the gauges at the last one, the rows
        appended to the timeline, new OOM marks (two or three comm messages)."""
        self._pending.extend(samples)
        now = time.perf_counter()
        if self._pending and now - self._pushed_at >= PUSH_EVERY_S:
            self._pushed_at = now
            self._send()

    def _send(self) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        if not self.limit_bytes:  # a followed file says its device in its first line
            self.limit_bytes, self.limit_word = _limit(self.watch.source)
            if self.limit_bytes:
                self.timeline.limit_bytes = self.limit_bytes
                name = self.watch.source.device_name
                self.gauges.title = f"{name}: {self.limit_word} {exact_bytes(self.limit_bytes)}"
        self.gauges.rows = self._gauge_rows(pending[-1])
        self.timeline.append([s.row() for s in pending])
        ooms = self.watch.ooms
        if len(ooms) != self._marks:
            self._marks = len(ooms)
            self.timeline.marks = self._oom_marks()
        self.pushes += 1

    def _gauge_rows(self, s: Sample) -> list[dict]:
        limit = self.limit_bytes
        rows = [
            gauge_row("allocated", "allocated", s.allocated_bytes, limit, s.allocated_peak_bytes,
                      f"memory_allocated(); peak since the watch began {exact_bytes(s.allocated_peak_bytes)}"),
            gauge_row("reserved", "reserved (cached)", s.reserved_bytes, limit, s.reserved_peak_bytes,
                      f"memory_reserved(); peak since the watch began {exact_bytes(s.reserved_peak_bytes)}"),
        ]  # fmt: skip
        if s.driver_used_bytes is not None:
            total = getattr(self.watch.source, "total_bytes", 0)
            rows.append(gauge_row("driver", "driver used (NVML)", s.driver_used_bytes, total, None,
                                  "what nvidia-smi shows: every process on the device, read once a second"))
        return rows

    def _oom_marks(self) -> list[dict]:
        marks = []
        samples = self.watch.samples
        for oom in self.watch.ooms:
            i = int(np.searchsorted(samples.t_s, oom.t_s)) if samples.n else 0
            at = samples.values[min(i, samples.n - 1)] if samples.n else None
            height = int(at[2]) if at is not None else 0  # reserved: the OOM is the cache running out
            marks.append({"kind": "oom", "t_s": oom.t_s, "bytes": height, "label": f"OOM, step {oom.steps}"})
        return marks

    # -- the end, from the program's thread ---------------------------------------------------------------

    def finish(self) -> None:
        """The run's final rows and marks, then the summary, the live tensors, the viewer and what-if (a failure
        here is printed in ``out``, never raised into the program)."""
        guarded(self.out)(self._finish)()

    def _finish(self) -> None:
        self._send()  # the samples not shown yet, the last one in the gauges
        watch = self.watch
        marks = self._oom_marks()
        peak = watch.peak_sample()
        if peak is not None:
            marks.append({"kind": "peak", "t_s": peak.t_s, "bytes": peak.allocated_peak_bytes,
                          "label": f"peak {format_bytes(peak.allocated_peak_bytes)}"})  # fmt: skip
        with self.timeline.hold_sync():
            self.timeline.rows = _final_rows(watch)
            self.timeline.marks = marks
            self.timeline.state = "stopped" if watch.error else "done"
        children: list[W.Widget] = [self._summary()]
        if watch.live:
            children.append(self._live_table())
        if watch.history is not None:
            children += self._viewer()
        elif watch.focus_segments is not None:
            self.map = StateMap()
            self.map.show(watch.focus_segments)
            children.append(self.map.widget)
        self.result.children = children

    def _summary(self) -> W.HTML:
        watch = self.watch
        lines = watch.summary().split("\n")
        style = "color:#d62728;font-weight:600" if watch.ooms else ""
        body = "".join(f'<div style="{style if "out of memory" in line else ""}">{escape(line)}</div>'
                       for line in lines)  # fmt: skip
        widget = W.HTML(f'<div style="font-family:var(--jp-code-font-family,monospace);font-size:12px">{body}</div>')
        widget.add_class("memviz-watch-summary")
        return widget

    def _live_table(self) -> W.HTML:
        watch = self.watch
        what = {"oom": "at the OOM", "peak": "at the peak"}.get(watch.focus or "", "at the end")
        cell = "padding:0 8px;text-align:{}"
        head = "".join(f"<th style='{cell.format(align)}'>{name}</th>" for name, align in
                       (("blocks", "right"), ("each", "right"), ("in all", "right"), ("allocated at", "left")))
        rows = "".join(
            f"<tr><td style='{cell.format('right')}'>{g.count}</td>"
            f"<td style='{cell.format('right')}'>{escape(format_bytes(g.size_bytes))}</td>"
            f"<td style='{cell.format('right')}'>{escape(format_bytes(g.total_bytes))}</td>"
            f"<td style='{cell.format('left')}' title='{escape(' ← '.join(g.stack))}'>{escape(g.where)}</td></tr>"
            for g in watch.live
        )
        widget = W.HTML(f"<div style='font-size:12px'><b>largest live tensors {what}</b> (blocks of one size made "
                        f"at one place; hover a place for its stack)<table class='memviz-watch-live'><tr>{head}</tr>"
                        f"{rows}</table></div>")  # fmt: skip
        widget.add_class("memviz-watch-live")
        return widget

    def _viewer(self) -> list[W.Widget]:
        from memviz.widgets.snapshot_viewer import SnapshotViewer

        watch = self.watch
        history = watch.history
        assert history is not None and watch.focus_index is not None
        self.viewer = SnapshotViewer(history, index=watch.focus_index, device=history.device)
        guard = guarded(self.out)
        buttons = []
        tl = history.timeline
        peak_index = int(np.argmax(np.frombuffer(tl.allocated_bytes, dtype=np.int64)))
        targets = [("show the peak", "the recorded history's highest allocated", peak_index)]
        if tl.oom_indices:
            targets.append(("show the OOM", "the last out-of-memory event recorded", tl.oom_indices[-1]))
        for label, tip, index in targets:
            b = button(label, tip)
            b.on_click(guard(lambda _, i=index: self.viewer.goto(i)))
            buttons.append(b)
        what_if = button("what if…", "replay the recorded history under other allocator configs, on this device")
        what_if.on_click(guard(lambda _: self._show_what_if()))
        buttons.append(what_if)
        row = W.HBox(buttons, layout=W.Layout(flex_flow="row wrap"))
        row.add_class("memviz-watch-buttons")
        return [row, self.viewer.widget]

    def _show_what_if(self) -> None:
        if self.what_if is None:
            self.what_if = self.watch.what_if()
            self.result.children = (*self.result.children, self.what_if.widget)

    def close(self) -> None:
        """Close every widget of the view (the watch's numbers stay)."""
        for part in (self.viewer, self.what_if):
            if part is not None:
                part.close()
        close_tree(self.widget)


def _limit(source: Any) -> tuple[int, str]:
    """What the gauges are drawn against: the cap in force, else the device's memory (0 while unknown)."""
    cap = getattr(source, "cap_bytes", None)
    if cap is not None:
        return cap, "cap"
    return getattr(source, "total_bytes", None) or 0, "device"


def _final_rows(watch: Watch) -> list[list[float | int]]:
    """The run's rows for the saved state: every row of a short run, else the envelope of each line."""
    samples = watch.samples
    columns = [samples.values[:, k] for k in (0, 1, 2, 3)]  # allocated, reserved, active, peak allocated
    picks = envelope_of(columns, buckets=FINAL_POINTS)
    return [[float(samples.t_s[i]), *map(int, samples.values[i])] for i in picks]

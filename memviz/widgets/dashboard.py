"""The dashboard: gauges, timeline, segment map, controls, event log and OOM banner on one lab, live.

It refreshes after every click and after every notebook cell (IPython's ``post_run_cell``; see
:mod:`memviz.widgets.live`). One refresh reads ``memory_stats()`` at most once and the segments once,
and hands both to every piece: on a GPU each read costs (``memory_stats()`` about 170 µs). After an
action the lab's event already carries the stats of now, so a click costs no extra stats read at all.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import ipywidgets as W

from memviz.widgets._common import close_tree, guarded
from memviz.widgets.controls import Controls
from memviz.widgets.event_log import EventLog, OOMBanner
from memviz.widgets.gauges import MemoryGauges
from memviz.widgets.live import CellHook
from memviz.widgets.row import figure_row
from memviz.widgets.segment_map import SegmentMap
from memviz.widgets.timeline import Timeline

if TYPE_CHECKING:
    from memviz.events import Event
    from memviz.lab import Lab

__all__ = ["Dashboard", "dashboard"]

class Dashboard:
    """Every piece on one lab, refreshed together.

    Args:
        lab: the lab to show.
        live: refresh after every notebook cell (default True; nothing happens outside IPython).
        segment_map: include the segment map (default True).
        streams: include the streams-and-pools controls (side streams, ``record_stream``, ``MemPool``, CUDA
            graph capture; default False).

    Attributes: ``lab``, ``gauges``, ``timeline``, ``segment_map`` (or None), ``controls``, ``log``,
    ``oom``, ``figures`` (the row of the two figures, see :func:`~memviz.widgets.row.figure_row`), ``out``
    (tracebacks of unexpected errors), ``widget`` (the ``VBox`` displayed), and ``last_refresh_s`` (Python
    time of the last refresh).
    """

    def __init__(self, lab: Lab, *, live: bool = True, segment_map: bool = True, streams: bool = False) -> None:
        self.lab = lab
        self.out = W.Output()
        self.header = W.HTML()
        self.header.add_class("memviz-header")
        self.oom = OOMBanner(lab, out=self.out)
        self.gauges = MemoryGauges(lab)
        self.timeline = Timeline(lab)
        self.segment_map = SegmentMap(lab) if segment_map else None
        self.controls = Controls(lab, on_event=self._after_action, on_new_lab=self.set_lab, out=self.out,
                                 streams=streams)
        self.log = EventLog(lab)
        self.pieces = [p for p in (self.oom, self.gauges, self.timeline, self.segment_map, self.controls, self.log)
                       if p is not None]  # fmt: skip
        self.figures = figure_row([self.timeline.widget] + ([self.segment_map.widget] if self.segment_map else []))
        self.widget = W.VBox([self.header, self.oom.widget, self.gauges.widget, self.controls.widget, self.figures,
                              self.log.widget, self.out])  # fmt: skip
        self.widget.add_class("memviz-dashboard")
        self.last_refresh_s = 0.0
        self._seen_events = len(lab.events)
        self._on_cell = guarded(self.out)(self._cell)
        self._hook = CellHook(self) if live else None
        self._set_header()

    # -- refreshing -----------------------------------------------------------------------------------

    def refresh(self, stats: Mapping[str, int] | None = None, segments: list[dict] | None = None) -> None:
        """Redraw every piece from one ``stats`` and one ``segments`` list (read now when not given)."""
        t0 = time.perf_counter()
        lab = self.lab
        if stats is None:
            stats = lab.stats()
        if segments is None and self.segment_map is not None:
            segments = lab.segments()
        self._seen_events = len(lab.events)
        for piece in self.pieces:
            piece.refresh(stats, segments)
        self.last_refresh_s = time.perf_counter() - t0

    def _after_action(self, event: Event) -> None:
        self.refresh(event.stats_after)

    def on_cell(self, execution_count: int | None) -> None:
        """After a notebook cell: log what plain code changed (``lab.observe``), refresh if anything moved."""
        self._on_cell(execution_count)

    def _cell(self, execution_count: int | None) -> None:
        lab = self.lab
        lab.observe(f"cell {execution_count}")
        if len(lab.events) != self._seen_events:  # plain code changed memory, or the cell called the lab
            self.refresh(lab.events[-1].stats_after)

    # -- lifecycle ------------------------------------------------------------------------------------

    def set_lab(self, lab: Lab) -> None:
        """Show a fresh lab (the backend switch calls this): every piece's ``set_lab``, then one refresh."""
        self.lab = lab
        for piece in self.pieces:
            piece.set_lab(lab, refresh=False)
        self._set_header()
        self.refresh()

    def _set_header(self) -> None:
        self.header.value = f"<b>memviz</b> — {self.lab.describe()}"

    def close(self) -> None:
        """Stop the cell hook and close every widget (the lab itself stays as it is)."""
        if self._hook is not None:
            self._hook.unregister()
            self._hook = None
        for piece in self.pieces:
            piece.close()
        close_tree(self.widget)

    def _repr_mimebundle_(self, **kwargs: Any):
        return self.widget._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        return f"<memviz Dashboard on {self.lab.describe()}>"


def dashboard(lab: Lab | None = None, *, live: bool = True, segment_map: bool = True, streams: bool = False,
              **lab_kwargs: Any) -> Dashboard:
    """Everything in one call: a :class:`Dashboard` on ``lab``, or on a new ``Lab(**lab_kwargs)``; ``streams=True``
    adds the streams-and-pools controls.

    >>> d = dashboard(backend="sim", device="T4", cap="2 GiB", live=False)
    >>> d.controls.buttons["Allocate"].click()
    >>> d.gauges.values["allocated"]
    536870912
    """
    if lab is None:
        from memviz.lab import Lab

        lab = Lab(**lab_kwargs)
    elif lab_kwargs:
        raise ValueError(f"pass either a lab or Lab arguments, not both ({', '.join(lab_kwargs)})")
    return Dashboard(lab, live=live, segment_map=segment_map, streams=streams)

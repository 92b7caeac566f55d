"""The ranks of a distributed job side by side: a timeline and a segment map per rank, one event slider for all.

``RankViewer("DIR")`` opens the ``snapshot_rank<N>.pickle`` files a ``torchrun`` job wrote
(``examples/torchrun_snapshots.py``; :func:`memviz.snapshots.ranks.load_ranks`), or a list of snapshots. Every
rank's events sit on one :class:`~memviz.snapshots.ranks.EventScale`: with torch's timestamps, position ``k`` is the
``k``-th event of the whole job, so what the ranks hold at one moment lines up (DDP's ranks step together; an
FSDP2 rank's all-gather peak sits where the others' do). The slider (with play, step and "next OOM", the
:class:`~memviz.widgets.snapshot_panels.ScrubBar` of the snapshot viewer) moves a cursor over every rank's timeline
(:class:`~memviz.widgets.snapshot_panels.RecordedTimeline`, its x axis the shared scale, one y scale for all) and
redraws each rank's segment map (:class:`~memviz.widgets.segment_map.StateMap`) at that rank's last event so far.
A table gives each rank's peaks. Ranks recorded on CPU through the simulator
(:mod:`memviz.snapshots.sim_recording`) are labelled "simulated", with what such a recording leaves out.

A slider move redraws only the ranks whose state changed, each from the history's nearest stored state (at most
2048 events replayed) and its segment map: its cost grows with the ranks drawn, not with the traces' length
(benchmarks/bench_ranks.py: ranks of a 63,008-event H200 training run, a move to a random position took a median
36 ms for 2 ranks and 280 ms for 8, on 2 cores under a load of 14). At most :data:`MAX_SHOWN` ranks are drawn (two
figures each); pick others with ``ranks=``; the table lists every rank.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import ipywidgets as W
import numpy as np

from memviz.errors import InputError
from memviz.snapshots.ranks import RankSnapshot, RankSnapshots, load_ranks
from memviz.units import format_bytes
from memviz.widgets._common import MiB, close_tree, escape, exact_bytes, guarded
from memviz.widgets.row import figure_row
from memviz.widgets.segment_map import StateMap
from memviz.widgets.snapshot_panels import RecordedTimeline, ScrubBar
from memviz.widgets.snapshot_viewer import _block_names, event_text

__all__ = ["MAX_SHOWN", "RankViewer"]

MAX_SHOWN = 8
"""Most ranks drawn at once (a timeline and a segment map each: 16 plotly figures)."""


class RankViewer:
    """Scrub a job's per-rank snapshots together (see the module docstring).

    Args:
        source: a directory of ``*rank<N>*.pickle`` files, a list of snapshots (paths, files, bytes, dicts), or a
            :class:`~memviz.snapshots.ranks.RankSnapshots` from :func:`~memviz.snapshots.ranks.load_ranks`.
        ranks: which ranks to draw (default None: all, up to :data:`MAX_SHOWN`).
        scale: ``"auto"``, ``"time"`` or ``"index"`` (see :func:`~memviz.snapshots.ranks.load_ranks`).
        position: where on the scale to start (default 0; negative counts from the end).

    Attributes: ``job`` (the :class:`~memviz.snapshots.ranks.RankSnapshots`), ``shown`` (the drawn
    :class:`~memviz.snapshots.ranks.RankSnapshot`\\ s), ``bar`` / ``slider`` (positions on the scale), ``timelines``
    and ``maps`` (one per drawn rank), ``indices`` (each drawn rank's event at the slider, -1 before its first),
    ``texts`` (each drawn rank's readout line), ``header``, ``table``, ``widget``, ``last_update_s``.

    Raises:
        SnapshotError: see :func:`~memviz.snapshots.ranks.load_ranks`. InputError: ``ranks`` names a rank the job
            lacks, or more than :data:`MAX_SHOWN`.
    """

    def __init__(self, source: Any, *, ranks: Sequence[int] | None = None, scale: str = "auto",
                 position: int = 0) -> None:  # fmt: skip
        self.job = job = source if isinstance(source, RankSnapshots) else load_ranks(source, scale=scale)
        self.shown = _pick(job, ranks)
        self.scale = job.scale
        self._slots = [job.ranks.index(r) for r in self.shown]  # each drawn rank's place in the job (and the scale)
        n = self.scale.length
        self.out = W.Output()
        guard = guarded(self.out, self._say)
        drawn = list(zip(self._slots, self.shown, strict=True))
        self.oom_positions = sorted(self.scale.position_of(slot, i)
                                    for slot, r in drawn for i in r.history.timeline.oom_indices)  # fmt: skip
        self.bar = ScrubBar(n, has_oom=bool(self.oom_positions), guard=guard, step=self.step, next_oom=self.next_oom,
                            why_no_oom="no OOM in any rank's recording")  # fmt: skip
        self.slider = self.bar.slider
        self.slider.description = "event"
        self.slider.observe(guard(lambda change: self._render(int(change["new"]))), names="value")
        top = max(r.peaks()["peak_reserved"] for r in self.shown) / MiB * 1.05 or 1.0
        self.timelines = [self._timeline(r, slot, top) for r, slot in zip(self.shown, self._slots, strict=True)]
        self.maps = [StateMap() for _ in self.shown]
        self.indices: list[int | None] = [None] * len(self.shown)
        self.texts = [""] * len(self.shown)
        self.readouts = [W.HTML(layout=W.Layout(width="100%")) for _ in self.shown]
        rows = []
        for r, timeline, smap, readout in zip(self.shown, self.timelines, self.maps, self.readouts, strict=True):
            smap.fig.layout.title.text = f"rank {r.rank}: segments and blocks at the slider"
            smap.fig.layout.title.font.size = 12
            label = W.HTML(f"<b>rank {r.rank}</b> · cuda:{r.device}" + (" · <i>simulated</i>" if r.simulated else ""))
            rows.append(W.VBox([label, readout, figure_row([timeline.widget, smap.widget])]))
        self.status = W.HTML()
        self.header = W.HTML(self._header())
        self.table = W.HTML(self._table())
        self.widget = W.VBox([self.header, self.table, self.bar.widget, self.status, *rows, self.out])
        self.widget.add_class("memviz-rank-viewer")
        self.last_update_s = 0.0
        self.position = -1
        self.goto(position)

    # -- drawing --------------------------------------------------------------------------------------
    def _timeline(self, rank: RankSnapshot, slot: int, top_mib: float) -> RecordedTimeline:
        """The rank's recorded timeline, its x axis moved onto the shared scale, its y axis the shared one."""
        timeline = RecordedTimeline(rank.history, None)
        where = np.frombuffer(self.scale.positions[slot], dtype=np.int64)
        with timeline.fig.batch_update():
            for trace in timeline.fig.data:
                if trace.x is not None and len(trace.x):
                    trace.x = where[np.asarray(trace.x, dtype=np.int64)]
            layout = timeline.fig.layout
            layout.title.text = f"rank {rank.rank}: memory over the job's events"
            layout.xaxis.title.text = "event # of the job (" + ("all ranks, in time order)" if self.scale.kind == "time"
                                                               else "each rank's own)")  # fmt: skip
            layout.xaxis.range = [0, max(self.scale.length - 1, 1)]
            layout.yaxis.range = [0, top_mib]
            layout.yaxis.rangemode = "normal"
        return timeline

    def _header(self) -> str:
        job, scale = self.job, self.scale
        how = (f"one event scale in time order: {scale.length:,} events of {len(job)} ranks" if scale.kind == "time"
               else f"one event scale by event number (the traces carry no time): {scale.length:,} positions")
        parts = [f"<b>{len(job)} ranks</b> · {escape(how)}"]
        if len(self.shown) < len(job):
            parts.append(escape(f"drawing ranks {', '.join(str(r.rank) for r in self.shown)} of {len(job)}"))
        simulated = [r for r in job.ranks if r.simulated is not None]
        if simulated:
            note = simulated[0].simulated or {}
            left = "; ".join(map(str, note.get("left_out", ())))
            extra = "; ".join(map(str, note.get("counted_extra", ())))
            which = "every rank" if len(simulated) == len(job) else "ranks " + ", ".join(str(r.rank) for r in simulated)
            source, device = note.get("source", ""), note.get("device", "a simulated GPU")
            text = f"{which} recorded on CPU, not on a GPU: {source}, on {device}. Not shown: {left}."
            if extra:
                text += f" Counted, though a GPU run would not: {extra}."
            parts.append(f'<span class="memviz-simulated" style="color:#9467bd"><b>simulated</b>: {escape(text)}'
                         "</span>")
        return "<br>".join(parts)

    def _table(self) -> str:
        head = ("rank", "device", "events", "peak allocated", "peak reserved", "at the end: allocated", "reserved",
                "OOMs", "recorded on")  # fmt: skip
        rows = []
        for row in self.job.table():
            cells = (row["rank"], f"cuda:{row['device']}", f"{row['events']:,}", exact_bytes(row["peak_allocated"]),
                     exact_bytes(row["peak_reserved"]), format_bytes(row["final_allocated"]),
                     format_bytes(row["final_reserved"]), row["ooms"], "CPU, simulated" if row["simulated"] else "GPU")
            rows.append("<tr>" + "".join(f'<td style="padding:0 8px">{escape(c)}</td>' for c in cells) + "</tr>")
        th = "".join(f'<th style="padding:0 8px;text-align:left">{escape(h)}</th>' for h in head)
        return f'<table class="memviz-rank-table" style="font-size:12px"><tr>{th}</tr>{"".join(rows)}</table>'

    def _render(self, position: int) -> None:
        """The one update: each drawn rank's state at its last event at or before ``position``, and the cursors."""
        self._say("")
        start = time.perf_counter()
        at = self.scale.indices_at(position)
        for k, (rank, slot) in enumerate(zip(self.shown, self._slots, strict=True)):
            index = at[slot]
            self.timelines[k].show(position)
            if index == self.indices[k]:
                continue
            history = rank.history
            segments = history.state_at(index) if index >= 0 else history.initial_state()
            self.maps[k].show(segments, _block_names(segments))
            self.indices[k] = index
            self.texts[k] = event_text(history, index) if index >= 0 else _before_first(rank)
            self.readouts[k].value = (f'<div style="font-family:var(--jp-code-font-family,monospace);font-size:12px">'
                                      f"{escape(self.texts[k])}</div>")  # fmt: skip
        self.position = position
        self.last_update_s = time.perf_counter() - start

    def _say(self, message: str) -> None:
        self.status.value = f'<span style="color:#d62728">{escape(message)}</span>' if message else ""

    # -- actions --------------------------------------------------------------------------------------
    def goto(self, position: int) -> None:
        """Show every drawn rank at ``position`` on the scale (negative counts from the end).

        Raises:
            IndexError: no such position.
        """
        n = self.scale.length
        if isinstance(position, bool) or not isinstance(position, int):
            raise InputError(f"a position on the event scale is an int, not {position!r}")
        if not -n <= position < n:
            raise IndexError(f"position {position} out of range: the scale has {n:,} events (0 to {n - 1:,})")
        position %= n
        if position == self.slider.value:
            if position != self.position:
                self._render(position)
        else:
            self.slider.value = position  # the slider's observer renders

    def step(self, delta: int) -> None:
        """Move the slider by ``delta`` positions (clamped to the scale)."""
        self.goto(min(max(self.slider.value + delta, 0), self.scale.length - 1))

    def next_oom(self) -> int | None:
        """Jump to the first OOM event of any drawn rank after the slider (wrapping around); return it, or None."""
        if not self.oom_positions:
            self._say("no OOM event in any rank's recording")
            return None
        after = [p for p in self.oom_positions if p > self.slider.value]
        target = after[0] if after else self.oom_positions[0]
        self.goto(target)
        return target

    def close(self) -> None:
        """Close every widget of the viewer."""
        close_tree(self.widget)

    def _repr_mimebundle_(self, **kwargs: Any):
        return self.widget._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        return f"<memviz RankViewer: {len(self.job)} ranks, {self.scale.length:,} events on a {self.scale.kind} scale>"


def _pick(job: RankSnapshots, ranks: Iterable[int] | None) -> list[RankSnapshot]:
    by_rank = {r.rank: r for r in job.ranks}
    if ranks is None:
        if len(job) > MAX_SHOWN:
            raise InputError(f"the job has {len(job)} ranks; the viewer draws at most {MAX_SHOWN}: pick them with "
                             f"ranks=[...] (e.g. ranks={list(by_rank)[:2]})")
        return list(job.ranks)
    picked = list(dict.fromkeys(ranks))
    missing = [r for r in picked if r not in by_rank]
    if missing or not picked or len(picked) > MAX_SHOWN:
        raise InputError(f"ranks= picks 1 to {MAX_SHOWN} of the job's ranks ({', '.join(map(str, by_rank))}), not "
                         f"{list(ranks)}")
    return [by_rank[r] for r in sorted(picked)]


def _before_first(rank: RankSnapshot) -> str:
    """The readout before a rank's first event: what it held when recording started."""
    initial = rank.history.timeline.initial
    return (f"before its first event (of {len(rank.history):,}): allocated {exact_bytes(initial['allocated_bytes'])}, "
            f"reserved {exact_bytes(initial['reserved_bytes'])}")


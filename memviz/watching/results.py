"""What a watch found, once it ends: the history, the peak or the OOM in it, what was live there, and the words.

:class:`WatchResults` is the part of :class:`~memviz.watching.watch.Watch` that runs after the sampler stopped:
it takes the snapshot the results come from (the OOM observer's, the end's, the simulator's own trace, or the
file a job dumped), rebuilds its history, finds the event to open the map at (the OOM, else the first event at
the watch's exact peak, saying so when the recorded history does not reach back to it), and lists the largest
live tensors there. :meth:`~WatchResults.summary` says it in a few lines; :meth:`~WatchResults.what_if` replays
the history under other allocator configs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memviz.errors import InputError
from memviz.units import format_bytes
from memviz.watching.live_blocks import LiveGroup, live_groups
from memviz.watching.samples import Sample, SampleStore
from memviz.watching.sim_trace import sim_snapshot
from memviz.watching.snapshotfile import SnapshotFollower
from memviz.watching.sources import CudaSource, SimLabSource
from memviz.watching.statsfile import StatsFollower

if TYPE_CHECKING:
    from memviz.snapshots import SnapshotHistory

__all__ = ["FOLLOWERS", "WatchOOM", "WatchResults"]

FOLLOWERS = (StatsFollower, SnapshotFollower)  # sources that read what another process writes


@dataclass(frozen=True)
class WatchOOM:
    """An out-of-memory error seen while watching.

    Attributes:
        message: the allocator's message (for an OOM seen only by the observer: the request's size).
        t_s: seconds since the watch began. steps: steps done before it (on a simulated lab: when the sampler
            saw its event, at most one interval later).
        ended_block: True when the error ended the watched block; False when the program caught it (a lab
            records every OOM as an event and carries on).
    """

    message: str
    t_s: float
    steps: int
    ended_block: bool


class WatchResults:
    """The results half of a watch (see the module docstring); :class:`~memviz.watching.watch.Watch` holds the
    attributes named here."""

    source: Any
    samples: SampleStore
    last: Sample | None
    ooms: list[WatchOOM]
    oom: WatchOOM | None
    history: SnapshotHistory | None
    focus: str | None
    focus_index: int | None
    focus_segments: list[dict] | None
    live: list[LiveGroup]
    notes: list[str]
    max_entries: int
    wall_s: float
    start_allocated_bytes: int
    end_allocated_bytes: int
    _oom_snapshot: dict | None
    _sim_trace_start: int

    def peak_sample(self) -> Sample | None:
        """The first stored sample whose peak allocated is the watch's peak: when the peak happened (it happened
        between that sample and the one before)."""
        peaks = self.samples.column("allocated_peak_bytes")
        if not len(peaks):
            return None
        i = int((peaks >= peaks[-1]).argmax())
        return Sample.from_row([self.samples.t_s[i], *self.samples.values[i]])

    def _results(self) -> None:
        from memviz.snapshots import SnapshotHistory

        snapshot = self._snapshot()
        if snapshot is None:
            return
        traces = snapshot.get("device_traces") or []
        device = self.source.index if isinstance(self.source, CudaSource) else 0
        if device < len(traces) and traces[device]:
            self.history = SnapshotHistory(snapshot, device=device)
            self._focus_in_history(self.history)
        else:
            self.focus = "oom" if self.ooms else None
            self.focus_segments = [s for s in snapshot["segments"] if s.get("device", device) == device]
            self.notes.append("no memory history was recorded (history=False, or a job that recorded none): "
                              + ("the map shows the moment of the OOM" if self.ooms else "the map shows the end "
                                 "of the block, not the peak"))  # fmt: skip
        self.live = live_groups(self.focus_segments or [])

    def _snapshot(self) -> dict | None:
        """The snapshot the results come from: the OOM's if one ended the block, else the end's."""
        source = self.source
        if isinstance(source, SimLabSource):
            return sim_snapshot(source.lab, self._sim_trace_start, self.max_entries)
        if isinstance(source, CudaSource):
            if self.oom is not None and self._oom_snapshot is not None:
                return self._oom_snapshot
            import torch

            return torch.cuda.memory._snapshot(source.index)
        if isinstance(source, SnapshotFollower):
            if source.snapshot is None:
                self.notes.append(f"{source.path.name} never loaded as a snapshot")
            return source.snapshot
        ends = [e for e in source.events if e.snapshot is not None]
        if not ends:
            self.notes.append("the job wrote no snapshot (record(..., snapshot=False), or it has not ended)")
            return None
        path = ends[-1].snapshot
        assert path is not None
        if not path.exists():
            self.notes.append(f"the job's snapshot {path.name} is not beside the stats file")
            return None
        from memviz.snapshots import load_snapshot

        return load_snapshot(path)

    def _focus_in_history(self, history: SnapshotHistory) -> None:
        tl = history.timeline
        n = len(history)
        if self.ooms and tl.oom_indices:
            self.focus, self.focus_index = "oom", tl.oom_indices[-1]
        else:
            allocated = tl.allocated_bytes
            peak = self.peak_allocated_bytes
            index = next((i for i in range(n) if allocated[i] == peak), None)
            if index is None:
                highest = max(allocated)
                index = list(allocated).index(highest)
                if highest < peak:
                    self.notes.append(f"the peak ({format_bytes(peak)}) is older than the recorded history (its last "
                                      f"{n:,} events): the map shows the highest point it holds "
                                      f"({format_bytes(highest)})")  # fmt: skip
                elif not isinstance(self.source, FOLLOWERS):
                    self.notes.append(f"the history's highest point ({format_bytes(highest)}) is not the watch's "
                                      f"peak ({format_bytes(peak)}): the recording began before the watch")
            self.focus, self.focus_index = "peak", index
            if self.ooms:
                self.notes.append("the OOMs the program caught are older than the recorded history")
        self.focus_segments = history.state_at(self.focus_index)

    def summary(self) -> str:
        """What the watch saw, in a few lines of text (the view's summary; a script's printout)."""
        lines = [f"watched {self.wall_s:.1f} s, {self.steps} steps"
                 + (f" (median {1e3 * self.median_step_s:.1f} ms each)" if self.median_step_s else "")
                 + f", {self.samples.offered} samples"]  # fmt: skip
        peak = self.peak_sample()
        when = f" at {peak.t_s:.2f} s, step {peak.steps}" if peak is not None else ""
        lines.append(f"peak allocated {format_bytes(self.peak_allocated_bytes)} ({self.peak_allocated_bytes:,} B)"
                     f"{when}; peak reserved {format_bytes(self.peak_reserved_bytes)} "
                     f"({self.peak_reserved_bytes:,} B)")  # fmt: skip
        for oom in self.ooms:
            how = "ended the block" if oom.ended_block else "caught by the program"
            lines.append(f"out of memory at {oom.t_s:.2f} s, step {oom.steps} ({how}): {_headline(oom.message)}")
        if self.oom is not None and not isinstance(self.source, FOLLOWERS):
            lines.append(f"after the OOM its frames were released: allocated {format_bytes(self.end_allocated_bytes)}"
                         f" at the end ({format_bytes(self.start_allocated_bytes)} at the start)")
        if self.error:
            lines.append(f"the sampler stopped early: {self.error}")
        return "\n".join(lines + self.notes)

    def what_if(self, configs: Any = None, **kwargs: Any) -> Any:
        """The what-if table of the recorded history: :class:`~memviz.widgets.WhatIfTable` under ``configs``
        (default: :data:`memviz.sim.CANDIDATE_CONFIGS`), with the device and cap of the watched run.

        Raises:
            InputError: no history was recorded.
        """
        if self.history is None:
            raise InputError("this watch recorded no memory history to replay (history=False, or still running)")
        from memviz.sim import CANDIDATE_CONFIGS
        from memviz.widgets.whatif_table import WhatIfTable

        source = self.source
        total, cap = getattr(source, "total_bytes", None), getattr(source, "cap_bytes", None)  # None: unknown
        kwargs.setdefault("recorded_device", total)
        kwargs.setdefault("recorded_cap", cap)
        kwargs.setdefault("device_sizes", (total,))
        kwargs.setdefault("cap", cap)
        return WhatIfTable(self.history, CANDIDATE_CONFIGS if configs is None else configs, **kwargs)


def _headline(message: str) -> str:
    """An OOM message's first two sentences ("CUDA out of memory. Tried to allocate 64.00 MiB.")."""
    end = message.find(". ", message.find(". ") + 2)
    return message if end < 0 else message[: end + 1]

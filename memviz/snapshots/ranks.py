"""The snapshots of a distributed job's ranks, on one event scale.

``torchrun`` jobs write one snapshot per rank (``torch.cuda.memory._dump_snapshot(f"snapshot_rank{rank}.pickle")``).
:func:`load_ranks` reads them (each with :func:`~memviz.snapshots.load_snapshot`'s safe loader) into a
:class:`RankSnapshots`: a :class:`~memviz.snapshots.SnapshotHistory` per rank, and an :class:`EventScale` that puts
every rank's events on one axis, so that "event k" means the same moment for every rank:

- ``"time"`` (when every event carries ``time_us``, as torch's traces do): all ranks' events in the order of their
  timestamps (ties: the lower rank first), each rank's own order kept. Position ``k`` is the ``k``-th event of the
  whole job; a rank's state there is the one right after its last event at or before ``k``. The ranks' clocks are
  their hosts' (one clock on one node; across nodes, as far apart as the hosts' clocks are).
- ``"index"``: event ``k`` of every rank (a rank past its last event stays there).

All sizes are bytes.
"""

from __future__ import annotations

import heapq
import itertools
import os
import re
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memviz.errors import InputError, SnapshotError

from .history import SnapshotHistory
from .load import load_snapshot

__all__ = ["SCALES", "SIMULATED_KEY", "EventScale", "RankSnapshot", "RankSnapshots", "load_ranks", "rank_of_name",
           "simulated_note"]

SCALES = ("auto", "time", "index")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_SNAPSHOT_SUFFIXES = (".pickle", ".pkl")
SIMULATED_KEY = "memviz_simulated"
"""The snapshot entry that marks a recording made on CPU through the simulator (:mod:`memviz.snapshots.sim_recording`):
``{"device", "index", "source", "left_out", ...}``. torch's own keys are ``segments``, ``device_traces``,
``allocator_settings`` and ``external_annotations``; viewers that do not know this one ignore it."""


def simulated_note(snapshot: dict[str, Any]) -> dict[str, Any] | None:
    """The :data:`SIMULATED_KEY` entry of a loaded snapshot, or None for a recording of a real GPU."""
    note = snapshot.get(SIMULATED_KEY)
    return note if isinstance(note, dict) else None


def rank_of_name(name: str) -> int | None:
    """The rank a file name gives (``snapshot_rank3.pickle``, ``mem-rank_12.pkl``: the last ``rank<N>``), or None."""
    found = _RANK_IN_NAME.findall(os.path.basename(name))
    return int(found[-1]) if found else None


@dataclass(frozen=True)
class RankSnapshot:
    """One rank's snapshot.

    Attributes:
        rank: the rank (from the file name, else the snapshot's simulated note, else its place in the list).
        source: the file it came from (or ``"<dict>"``, ``"<bytes>"``).
        device: the device index whose trace it holds (the one device with events or segments in the file).
        history: the rebuilt trace (:class:`~memviz.snapshots.SnapshotHistory`).
        simulated: the ``memviz_simulated`` note of a recording made on CPU through the simulator (see
            :mod:`memviz.snapshots.sim_recording`), or None for a real GPU's snapshot.
    """

    rank: int
    source: str
    device: int
    history: SnapshotHistory
    simulated: dict[str, Any] | None

    def peaks(self) -> dict[str, int]:
        """Peak and final ``allocated``/``reserved`` bytes over the trace (``peak_*``, ``final_*``), and ``ooms``."""
        tl = self.history.timeline
        return {"peak_allocated": max(tl.allocated_bytes, default=tl.initial["allocated_bytes"]),
                "peak_reserved": max(tl.reserved_bytes, default=tl.initial["reserved_bytes"]),
                "final_allocated": tl.allocated_bytes[-1] if len(tl.allocated_bytes) else tl.initial["allocated_bytes"],
                "final_reserved": tl.reserved_bytes[-1] if len(tl.reserved_bytes) else tl.initial["reserved_bytes"],
                "ooms": len(tl.oom_indices)}  # fmt: skip


class EventScale:
    """One axis for several ranks' events (see the module docstring).

    Attributes:
        kind: ``"time"`` or ``"index"``.
        length: positions on the scale (``0 .. length - 1``): all events of all ranks (time), or the longest
            trace (index).
        positions: per rank, the position of each of its events (``array("q")``, increasing).
    """

    def __init__(self, lengths: Sequence[int], times: Sequence[Sequence[int]] | None) -> None:
        if times is None:
            self.kind = "index"
            self.length = max(lengths, default=0)
            self.positions = [array("q", range(n)) for n in lengths]
            return
        self.kind = "time"
        self.positions = [array("q") for _ in lengths]
        streams = [zip(ts, itertools.repeat(r)) for r, ts in enumerate(times)]
        for position, (_, r) in enumerate(heapq.merge(*streams)):  # each rank's own order kept, even if unsorted
            self.positions[r].append(position)
        self.length = sum(lengths)

    def indices_at(self, position: int) -> list[int]:
        """Per rank, its last event at or before ``position`` (-1: none yet, the state before its first event).

        Raises:
            IndexError: ``position`` is not on the scale.
        """
        if not 0 <= position < self.length:
            raise IndexError(f"position {position} is not on the scale (0 to {self.length - 1:,})")
        return [bisect_right(p, position) - 1 for p in self.positions]

    def position_of(self, rank_index: int, event: int) -> int:
        """Where event ``event`` of the ``rank_index``-th rank is on the scale."""
        return self.positions[rank_index][event]


class RankSnapshots:
    """The ranks' snapshots (``ranks``, by rank) and their :class:`EventScale` (``scale``); see :func:`load_ranks`."""

    def __init__(self, ranks: list[RankSnapshot], scale: str = "auto") -> None:
        if scale not in SCALES:
            raise InputError(f"scale must be one of {', '.join(map(repr, SCALES))}, not {scale!r}")
        self.ranks = sorted(ranks, key=lambda r: r.rank)
        numbers = [r.rank for r in self.ranks]
        if len(set(numbers)) != len(numbers):
            twice = min(n for n in numbers if numbers.count(n) > 1)
            where = ", ".join(r.source for r in self.ranks if r.rank == twice)
            raise SnapshotError(f"rank {twice} comes twice ({where}); give one snapshot per rank")
        times = [_times(r.history) for r in self.ranks]
        timed = all(t is not None for t in times)
        if scale == "time" and not timed:
            untimed = [r.rank for r, t in zip(self.ranks, times, strict=True) if t is None]
            raise SnapshotError(f"scale='time' needs every event's time_us; rank {untimed[0]}'s trace has events "
                                "without one: use scale='index'")
        lengths = [len(r.history) for r in self.ranks]
        self.scale = EventScale(lengths, times if timed and scale != "index" else None)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.ranks)

    def __iter__(self):
        return iter(self.ranks)

    @property
    def simulated(self) -> bool:
        """Whether any rank was recorded through the simulator (see :mod:`memviz.snapshots.sim_recording`)."""
        return any(r.simulated is not None for r in self.ranks)

    def table(self) -> list[dict[str, Any]]:
        """One row per rank: ``rank``, ``device``, ``events``, the :meth:`RankSnapshot.peaks`, ``simulated``."""
        return [{"rank": r.rank, "device": r.device, "events": len(r.history), **r.peaks(),
                 "simulated": r.simulated is not None} for r in self.ranks]  # fmt: skip


def load_ranks(source: str | os.PathLike[str] | Iterable[Any], *, scale: str = "auto",
               device: int | Sequence[int] | None = None, progress: bool | None = None) -> RankSnapshots:  # fmt: skip
    """Load a job's per-rank snapshots.

    Args:
        source: a directory (its ``*rank<N>*.pickle`` / ``.pkl`` files), or a list of snapshots (paths, open files,
            bytes, ``_snapshot()`` dicts). A rank is the last ``rank<N>`` in a file's name, else the ``rank`` of a
            simulated recording's note, else the snapshot's place in the list.
        scale: ``"auto"`` (``"time"`` when every event has ``time_us``, else ``"index"``), ``"time"`` or ``"index"``.
        device: the device trace to read: None (the one device of each file that has events or segments), one index
            for every rank, or one per snapshot.
        progress: ``tqdm.auto`` bars while rebuilding long traces (see :class:`~memviz.snapshots.SnapshotHistory`).

    Raises:
        SnapshotError: a file that is not a safe snapshot, no snapshot found, a rank given twice, a file with
            traces on several devices and no ``device``, a trace with no events.
        InputError / InputTypeError: a bad ``scale`` or ``device``.
    """
    items, names = _sources(source)
    devices = _devices(device, len(items))
    ranks = []
    for i, (item, name) in enumerate(zip(items, names, strict=True)):
        snapshot = load_snapshot(item)
        simulated = simulated_note(snapshot)
        dev = devices[i] if devices is not None else _only_device(snapshot, name)
        history = SnapshotHistory(snapshot, device=dev, progress=progress)
        if not len(history):
            raise SnapshotError(f"{name}: device {dev}'s trace has no events: call "
                                "torch.cuda.memory._record_memory_history() before the run you want to see")
        rank = rank_of_name(name)
        if rank is None and simulated is not None and isinstance(simulated.get("rank"), int):
            rank = simulated["rank"]
        ranks.append(RankSnapshot(i if rank is None else rank, name, dev, history, simulated))
    if any(rank_of_name(n) is None for n in names) and len({r.rank for r in ranks}) != len(ranks):
        ranks = [RankSnapshot(i, r.source, r.device, r.history, r.simulated) for i, r in enumerate(ranks)]
    return RankSnapshots(ranks, scale)


def _sources(source: Any) -> tuple[list[Any], list[str]]:
    """The snapshots to load and their names (paths, or ``<item i>``)."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_dir():
            raise SnapshotError(f"{path}: not a directory; give the directory the ranks wrote their snapshots to, or "
                                "a list of snapshot files")
        found = [p for p in path.iterdir() if p.suffix in _SNAPSHOT_SUFFIXES and rank_of_name(p.name) is not None]
        files = sorted(found, key=lambda p: (rank_of_name(p.name), p.name))
        if not files:
            raise SnapshotError(f"{path}: no snapshot_rank<N>.pickle (or *rank<N>*.pkl) files here")
        return [str(p) for p in files], [str(p) for p in files]
    if isinstance(source, (bytes, bytearray, memoryview, dict)) or hasattr(source, "read"):
        raise InputError("give a directory or a list of the ranks' snapshots, not one snapshot")
    try:
        items = list(source)
    except TypeError:
        raise InputError(f"give a directory or a list of snapshots, not {type(source).__name__}") from None
    if not items:
        raise SnapshotError("no snapshots given")
    names = [os.fspath(x) if isinstance(x, (str, os.PathLike)) else getattr(x, "name", None) or f"<item {i}>"
             for i, x in enumerate(items)]  # fmt: skip
    return items, [str(n) for n in names]


def _devices(device: int | Sequence[int] | None, n: int) -> list[int] | None:
    if device is None:
        return None
    if isinstance(device, int) and not isinstance(device, bool):
        return [device] * n
    if isinstance(device, Sequence) and not isinstance(device, str):
        if len(device) != n:
            raise InputError(f"device= has {len(device)} indices for {n} snapshots: give one per snapshot, or one")
        return list(device)
    raise InputError(f"device must be None, an index or one index per snapshot, not {device!r}")


def _only_device(snapshot: dict[str, Any], name: str) -> int:
    """The one device of ``snapshot`` with events or segments (0 when it has neither)."""
    used = {d for d, trace in enumerate(snapshot["device_traces"]) if trace}
    used |= {s["device"] for s in snapshot["segments"]}
    if len(used) > 1:
        raise SnapshotError(f"{name}: this process used devices {', '.join(map(str, sorted(used)))}; pass device= "
                            "(one index, or one per snapshot) to say which to show")
    return used.pop() if used else 0


def _times(history: SnapshotHistory) -> list[int] | None:
    """Every event's ``time_us``, or None when one has none."""
    times = [e.get("time_us") for e in history.events]
    return None if any(t is None for t in times) else times  # type: ignore[return-value]

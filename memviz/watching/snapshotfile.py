"""Follow a snapshot file that a job rewrites as it runs (``torch.cuda.memory._dump_snapshot(path)`` every so
often, or at its end or its OOM): ``memviz.watch("run.pickle")``.

Each poll looks at the file's size and modification time; once they have changed and then held for one poll
(the writer is done), the file is loaded with memviz's safe loader and rebuilt
(:class:`~memviz.snapshots.SnapshotHistory`). Its trace becomes samples: each recorded event's time
(``time_us``) and the allocated / reserved / active bytes after it, the peaks as running maxima over every event
(exact: the trace holds every alloc and free), only the events newer than those already shown: every k-th of
them (about :data:`MAX_SAMPLES_PER_LOAD` a load), and each at which a peak rose. Its ``oom``
events are the watch's OOMs. Steps are unknown (0): a job that wants step markers writes a stats file
(:func:`memviz.record`) instead, which also costs far less to follow.

A file that does not load is retried while it keeps changing (a dump in progress); one that still does not
load after it stopped changing is refused with the loader's message.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from memviz.errors import InputError
from memviz.watching.samples import Sample

__all__ = ["MAX_SAMPLES_PER_LOAD", "SNAPSHOT_SUFFIXES", "SnapshotFollower"]

MAX_SAMPLES_PER_LOAD = 4000
SNAPSHOT_SUFFIXES = (".pickle", ".pkl")


class SnapshotFollower:
    """Follow a snapshot file: ``follower()`` returns the samples of the events recorded since the last load.

    Attributes: ``path``, ``snapshot`` (the last snapshot loaded, a dict, or None), ``history`` (its
    :class:`~memviz.snapshots.SnapshotHistory`), ``loads``, ``oom_times_s`` (seconds of each ``oom`` event seen),
    ``ended`` (always False: a snapshot file has no end; stop the watch).
    """

    kind = "file"
    ended = False

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.snapshot: dict[str, Any] | None = None
        self.history: Any = None
        self.loads = 0
        self.oom_times_s: list[float] = []
        self._seen: tuple[int, int] | None = None  # (size, mtime) of the last load
        self._pending: tuple[int, int] | None = None  # a change seen at the last poll, loaded once it holds
        self._failed: tuple[int, int] | None = None
        self._t0_us: int | None = None
        self._last_us = -1
        self._peaks = (0, 0)

    @property
    def header(self) -> dict[str, Any] | None:
        """What :meth:`memviz.watching.Watch.describe` shows of the job (the file, once loaded)."""
        return None if self.snapshot is None else {"device": "snapshot", "pid": "?", "host": str(self.path.parent)}

    def prime(self) -> list[Sample]:
        """The first poll, when a watch starts: a file there already is loaded now, and must be a snapshot
        (InputError with the loader's message if not)."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return []
        stamp = (stat.st_size, stat.st_mtime_ns)
        self._failed = stamp  # no second chance: it is not being written as far as we know
        return self._load(stamp)

    def __call__(self, *, settle: bool = False) -> list[Sample]:
        """The samples of a new version of the file, once it has held still for a poll (``settle``: at the end of
        the watch, load a change now; if it does not load, the last version stands)."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return []
        now = (stat.st_size, stat.st_mtime_ns)
        if now == self._seen:
            return []
        if settle:
            try:
                return self._load(now)
            except InputError:
                return []
        if now != self._pending:  # changed since the last poll: wait one poll for the writer to finish
            self._pending = now
            return []
        return self._load(now)

    def _load(self, stamp: tuple[int, int]) -> list[Sample]:
        from memviz.snapshots import SnapshotError, SnapshotHistory, load_snapshot

        try:
            snapshot = load_snapshot(self.path)
            history = SnapshotHistory(snapshot)
        except SnapshotError as error:
            if self._failed == stamp:
                raise InputError(f"{self.path} does not load as a snapshot: {error}") from None
            self._failed = stamp  # perhaps still being written: once more at the next change or poll
            self._pending = None
            return []
        self._seen, self.snapshot, self.history = stamp, snapshot, history
        self.loads += 1
        return self._samples(history)

    def _samples(self, history: Any) -> list[Sample]:
        tl = history.timeline
        if len(history) == 0 or tl.time_us is None:
            return []
        times = np.frombuffer(tl.time_us, dtype=np.int64)
        if self._t0_us is None:
            self._t0_us = int(times[0])
        t0, shown = self._t0_us, self._last_us
        new = np.nonzero(times > shown)[0]
        if not len(new):
            return []
        self._last_us = int(times[-1])
        self.oom_times_s += [(int(times[i]) - t0) / 1e6 for i in tl.oom_indices if times[i] > shown]
        allocated = np.frombuffer(tl.allocated_bytes, dtype=np.int64)[new]
        reserved = np.frombuffer(tl.reserved_bytes, dtype=np.int64)[new]
        active = np.frombuffer(tl.active_bytes, dtype=np.int64)[new]
        peak_a = np.maximum.accumulate(np.maximum(allocated, self._peaks[0]))
        peak_r = np.maximum.accumulate(np.maximum(reserved, self._peaks[1]))
        self._peaks = (int(peak_a[-1]), int(peak_r[-1]))
        # every k-th event, and every event at which a peak rose (so the peaks drawn are the trace's, exactly)
        stride = max(1, len(new) // MAX_SAMPLES_PER_LOAD)
        rose = np.nonzero(np.diff(peak_a, prepend=-1) | np.diff(peak_r, prepend=-1))[0]
        keep = np.union1d(np.union1d(np.arange(0, len(new), stride), rose[-MAX_SAMPLES_PER_LOAD:]), [len(new) - 1])
        return [Sample((int(times[new[k]]) - t0) / 1e6, int(allocated[k]), int(reserved[k]), int(active[k]),
                       int(peak_a[k]), int(peak_r[k]), None, 0) for k in keep]  # fmt: skip

"""The stats file a job writes (:func:`memviz.record`) and a notebook follows (``memviz.watch(path)``).

JSON Lines, appended and flushed line by line, so a reader never needs the writer's help:

- line 1, the header: ``{"format": "memviz-stats", "version": 1, "fields": [...], "device": "NVIDIA H200",
  "total_bytes": ..., "cap_bytes": ... or null, "kind": "cuda", "interval_s": 0.1, "pid": ..., "host": ...,
  "rank": ... or null, "started_unix": ...}``;
- a sample: a JSON array in ``fields`` order (:data:`~memviz.watching.samples.FIELDS`: seconds since the
  recording began, then bytes, then the steps), about 80 bytes;
- an event: ``{"event": "oom" | "end", "t_s": ..., "steps": ..., "message": ..., "snapshot": name or null}``:
  an out-of-memory error (with the snapshot the job dumped at that moment), or the recording's end (with the
  snapshot dumped then). A snapshot is named relative to the stats file's folder.

:class:`StatsFollower` reads what was appended since its last poll, complete lines only (a line the writer is
still writing waits for the next poll), and refuses a file that is not a memviz stats file with a message
that names the line and what is wrong.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memviz.errors import InputError
from memviz.watching.samples import FIELDS, Sample

__all__ = ["FORMAT", "VERSION", "StatsEvent", "StatsFollower", "event_line", "header_line", "sample_line"]

FORMAT = "memviz-stats"
VERSION = 1
MAX_LINE_BYTES = 64 << 10  # a longer line is not one this format writes (an OOM message is ~600 bytes)
READ_BYTES = 8 << 20  # read at most this much a poll: a huge file is taken in slices, the view stays live


def header_line(*, device: str, total_bytes: int, cap_bytes: int | None, kind: str, interval_s: float, pid: int,
                host: str, rank: int | None, started_unix: float) -> str:  # fmt: skip
    """The file's first line (without the newline)."""
    return json.dumps({"format": FORMAT, "version": VERSION, "fields": list(FIELDS), "device": device,
                       "total_bytes": total_bytes, "cap_bytes": cap_bytes, "kind": kind, "interval_s": interval_s,
                       "pid": pid, "host": host, "rank": rank, "started_unix": started_unix})  # fmt: skip


def sample_line(sample: Sample) -> str:
    row = sample.row()
    row[0] = round(row[0], 4)
    return json.dumps(row, separators=(",", ":"))


def event_line(event: str, t_s: float, steps: int, *, message: str = "", snapshot: str | None = None) -> str:
    return json.dumps({"event": event, "t_s": round(t_s, 4), "steps": steps, "message": message,
                       "snapshot": snapshot})  # fmt: skip


@dataclass(frozen=True)
class StatsEvent:
    """An ``oom`` or ``end`` line: when (seconds, steps), the message, and the snapshot's path (or None)."""

    event: str
    t_s: float
    steps: int
    message: str
    snapshot: Path | None


class StatsFollower:
    """Follow a stats file: ``follower()`` returns the samples appended since the last call.

    A file that does not exist yet is waited for (``header`` stays None). Attributes: ``path``, ``header``
    (the parsed first line), ``events`` (:class:`StatsEvent` list), ``ended`` (the ``end`` line was read),
    ``lines`` (lines read).

    Raises (from a call): InputError naming the line, for a file that is not a memviz stats file (no header,
    another format or version, a sample that is not ``len(fields)`` numbers, an unknown event).
    """

    kind = "file"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.header: dict[str, Any] | None = None
        self.events: list[StatsEvent] = []
        self.ended = False
        self.lines = 0
        self._offset = 0
        self._partial = b""

    @property
    def device_name(self) -> str | None:
        """The job's device, from the header (None until it is read)."""
        return None if self.header is None else str(self.header.get("device", "?"))

    @property
    def total_bytes(self) -> int | None:
        return None if self.header is None else self.header["total_bytes"]

    @property
    def cap_bytes(self) -> int | None:
        return None if self.header is None else self.header["cap_bytes"]

    def prime(self) -> list[Sample]:
        """The first poll, when a watch starts: a file there already must be a stats file (InputError if not)."""
        return self()

    def __call__(self) -> list[Sample]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read(READ_BYTES)
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        cut = data.rfind(b"\n") + 1
        self._partial = data[cut:]
        if len(self._partial) > MAX_LINE_BYTES:
            raise InputError(f"{self.path}: line {self.lines + 1} is over {MAX_LINE_BYTES:,} bytes with no end: "
                             "not a memviz stats file")
        samples = []
        for raw in data[:cut].splitlines():
            self.lines += 1
            if not raw.strip():
                continue
            sample = self._line(raw)
            if sample is not None:
                samples.append(sample)
        return samples

    def _line(self, raw: bytes) -> Sample | None:
        where = f"{self.path}: line {self.lines}"
        try:
            value = json.loads(raw)
        except ValueError:
            raise InputError(f"{where} is not JSON ({raw[:60]!r}): not a memviz stats file") from None
        if self.header is None:
            self.header = _check_header(value, where)
            return None
        if isinstance(value, list):
            return _sample(value, where)
        if isinstance(value, dict) and value.get("event") in ("oom", "end"):
            self.events.append(self._event(value, where))
            self.ended = self.ended or value["event"] == "end"
            return None
        raise InputError(f"{where}: expected a sample (a list of {len(FIELDS)} numbers) or an oom/end event, "
                         f"got {str(value)[:80]}")

    def _event(self, value: dict, where: str) -> StatsEvent:
        snapshot = value.get("snapshot")
        if snapshot is not None and not isinstance(snapshot, str):
            raise InputError(f"{where}: 'snapshot' must be a file name or null, got {snapshot!r}")
        t_s, steps = value.get("t_s"), value.get("steps")
        if not _number(t_s) or not _count(steps):
            raise InputError(f"{where}: an event needs 't_s' (seconds) and 'steps' (an int >= 0)")
        # a snapshot is looked for beside the stats file, whatever folder the line names
        path = self.path.parent / Path(snapshot).name if snapshot else None
        return StatsEvent(value["event"], float(t_s), steps, str(value.get("message", "")), path)


def _check_header(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict) or value.get("format") != FORMAT:
        raise InputError(f"{where} is not a memviz stats header (written by memviz.record): "
                         f"{str(value)[:80]}")  # fmt: skip
    if value.get("version") != VERSION:
        raise InputError(f"{where}: stats file version {value.get('version')!r}; this memviz reads version {VERSION}")
    if value.get("fields") != list(FIELDS):
        raise InputError(f"{where}: fields {value.get('fields')!r}, expected {list(FIELDS)}")
    total, cap = value.get("total_bytes"), value.get("cap_bytes")
    if not _count(total) or not (cap is None or _count(cap)):
        raise InputError(f"{where}: 'total_bytes' must be an int of bytes and 'cap_bytes' one or null")
    return value


def _sample(value: list, where: str) -> Sample:
    if len(value) != len(FIELDS) or not _number(value[0]) or not all(_int(v) for v in value[1:]):
        raise InputError(f"{where}: a sample is {len(FIELDS)} numbers ({', '.join(FIELDS)}), the bytes and steps "
                         f"ints; got {str(value)[:80]}")
    if min(value[1:6]) < 0 or value[7] < 0:
        raise InputError(f"{where}: negative bytes or steps in {value}")
    return Sample.from_row(value)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: Any) -> bool:
    return _int(value) and value >= 0

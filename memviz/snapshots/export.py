"""Export any simulated state or replay as a snapshot pickle that PyTorch's own tools read.

The file is what ``torch.cuda.memory._dump_snapshot()`` writes: ``pickle.dump`` of a dict with
``segments``, ``device_traces``, ``allocator_settings`` and ``external_annotations``, here always with
protocol 4 (pytorch.org/memory_viz's JavaScript unpickler does not read protocol 5). It opens in
``torch.cuda._memory_viz`` (``segsum``, ``segments``, ``memory``, ``trace``, ``trace_plot``) and in
pytorch.org/memory_viz. Only plain data is written, so :func:`~memviz.snapshots.load_snapshot` reads
it back.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Mapping
from typing import IO, Any

from memviz.errors import SnapshotError
from memviz.sim import CachingAllocator

from .history import SnapshotHistory
from .load import validate_snapshot
from .whatif import ReplayResult

__all__ = ["PICKLE_PROTOCOL", "dump_snapshot", "dumps_snapshot", "to_snapshot"]

PICKLE_PROTOCOL = 4  # what memory_viz reads; _dump_snapshot() writes Python's default (4 or 5)


def _plain(obj: Any) -> Any:
    """Copy ``obj`` into dict/list/tuple/str/int/float/bool/None only (ints stay exact)."""
    if isinstance(obj, Mapping):
        return {(k if isinstance(k, (str, int, float, bool)) or k is None else str(k)): _plain(v)
                for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(_plain(v) for v in obj)
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (str, float)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    raise SnapshotError(f"cannot export a {type(obj).__name__} into a snapshot: only plain data is allowed")


def to_snapshot(source: Any, index: int | None = None) -> dict[str, Any]:
    """Return ``source`` as a plain ``_snapshot()``-shaped dict.

    Args:
        source: a :class:`memviz.sim.CachingAllocator` (its current state and trace), a
            :class:`~memviz.snapshots.ReplayResult` (its simulator after the replay; replay with
            ``record_history=True`` to include the simulated trace), a
            :class:`~memviz.snapshots.SnapshotHistory` (the state after event ``index``, with the events
            up to it), or a snapshot dict (checked and copied).
        index: for a history, the event to export (default: None, the last event).

    Raises:
        SnapshotError: ``source`` is none of these, or a dict that is not a snapshot.
    """
    if isinstance(source, ReplayResult):
        source = source.allocator
    if isinstance(source, SnapshotHistory):
        snap = source.snapshot_at(-1 if index is None else index)
    elif isinstance(source, Mapping):
        snap = validate_snapshot(source, name="<dict>")
    elif isinstance(source, CachingAllocator):
        snap = source.snapshot(record=False)  # exporting does not add a "snapshot" entry to its history
    else:
        raise SnapshotError(f"cannot export a {type(source).__name__}: give a CachingAllocator, a ReplayResult, "
                            "a SnapshotHistory or a snapshot dict")
    out = _plain(snap)
    out.setdefault("device_traces", [[]])
    out.setdefault("allocator_settings", {})
    out.setdefault("external_annotations", [])
    return out


def dumps_snapshot(source: Any, index: int | None = None) -> bytes:
    """Return the protocol-4 pickle bytes of :func:`to_snapshot(source, index) <to_snapshot>`."""
    return pickle.dumps(to_snapshot(source, index), protocol=PICKLE_PROTOCOL)


def dump_snapshot(source: Any, file: str | os.PathLike[str] | IO[bytes], index: int | None = None) -> None:
    """Write ``source`` as a snapshot pickle (protocol 4) to a path or a binary file.

    The result opens in ``torch.cuda._memory_viz`` and pytorch.org/memory_viz, and in
    :func:`~memviz.snapshots.load_snapshot`. See :func:`to_snapshot` for the accepted sources.

    >>> import io
    >>> from memviz.sim import CachingAllocator
    >>> a = CachingAllocator(16 << 30); p = a.malloc(4 << 20)
    >>> buf = io.BytesIO(); dump_snapshot(a, buf); buf.getvalue()[:2]
    b'\\x80\\x04'
    """
    data = dumps_snapshot(source, index)
    if isinstance(file, (str, os.PathLike)):
        with open(file, "wb") as f:
            f.write(data)
    elif isinstance(file, io.TextIOBase):
        raise SnapshotError("open the file in binary mode ('wb') to write a snapshot pickle")
    else:
        file.write(data)

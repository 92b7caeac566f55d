"""Load, scrub, replay and export PyTorch CUDA memory snapshots (``torch.cuda.memory._snapshot()``).

- :func:`load_snapshot` reads a ``_dump_snapshot()`` pickle with an unpickler that runs no code.
- :class:`SnapshotHistory` rebuilds the segments and blocks at any event of ``device_traces``
  (``state_at(i)``) and a per-event timeline of allocated/active/reserved bytes.
- :func:`what_if` replays the recorded requests through :mod:`memviz.sim` under other configs,
  after :func:`check_fidelity` has replayed them under the recorded one; a recording that replay does not
  reproduce gets a :class:`Verdict` saying why (e.g. a private pool no snapshot names) instead.
- :func:`infer_device` reads the recording's device memory off its expandable segments (a snapshot names none).
- :func:`load_ranks` reads a distributed job's per-rank snapshots onto one event scale (:mod:`.ranks`).
- :func:`dump_snapshot` writes any simulated state, replay or rebuilt state as a protocol-4 pickle
  that ``torch.cuda._memory_viz`` and pytorch.org/memory_viz read.

All sizes are bytes.
"""

from .device import DeviceEstimate, infer_device
from .errors import SnapshotError
from .export import dump_snapshot, dumps_snapshot, to_snapshot
from .history import TRACE_ACTION_CODES, HistoryTimeline, InitialBlock, SnapshotHistory, compare_segments
from .load import load_snapshot, loads_snapshot, validate_snapshot
from .ranks import RankSnapshots, load_ranks
from .settings import RecordedSettings, alloc_conf_from_settings, settings_from_snapshot
from .verdict import Verdict
from .whatif import FidelityReport, ReplayResult, WhatIfReport, check_fidelity, replay, what_if

__all__ = [
    "TRACE_ACTION_CODES",
    "DeviceEstimate",
    "FidelityReport",
    "HistoryTimeline",
    "InitialBlock",
    "RankSnapshots",
    "RecordedSettings",
    "ReplayResult",
    "SnapshotError",
    "SnapshotHistory",
    "Verdict",
    "WhatIfReport",
    "alloc_conf_from_settings",
    "check_fidelity",
    "compare_segments",
    "dump_snapshot",
    "dumps_snapshot",
    "infer_device",
    "load_ranks",
    "load_snapshot",
    "loads_snapshot",
    "replay",
    "settings_from_snapshot",
    "to_snapshot",
    "validate_snapshot",
    "what_if",
]

"""Load, scrub, replay and export PyTorch CUDA memory snapshots (``torch.cuda.memory._snapshot()``).

- :func:`load_snapshot` reads a ``_dump_snapshot()`` pickle with an unpickler that runs no code.
- :class:`SnapshotHistory` rebuilds the segments and blocks at any event of ``device_traces``.
- :func:`what_if` replays the recorded allocations through :mod:`memviz.sim` under other configs.
- :func:`dump_snapshot` writes any simulated state or replay as a pickle PyTorch's tools read.

All sizes are bytes.
"""

from .errors import SnapshotError
from .history import ACTIONS, InitialBlock, SnapshotHistory, Timeline, compare_segments
from .load import load_snapshot, loads_snapshot, validate_snapshot
from .settings import RecordedSettings, alloc_conf_from_settings, settings_from_snapshot

__all__ = [
    "ACTIONS",
    "InitialBlock",
    "RecordedSettings",
    "SnapshotError",
    "SnapshotHistory",
    "Timeline",
    "alloc_conf_from_settings",
    "compare_segments",
    "load_snapshot",
    "loads_snapshot",
    "settings_from_snapshot",
    "validate_snapshot",
]

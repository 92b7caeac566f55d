"""The one exception of :mod:`memviz.snapshots`."""

from __future__ import annotations

__all__ = ["SnapshotError"]


class SnapshotError(ValueError):
    """A snapshot could not be loaded, or does not have the shape ``torch.cuda.memory._snapshot()`` gives.

    The message names what is wrong and where, e.g.
    ``segments[3].blocks[2]: 'size' must be an int >= 0, got 'abc'``, or, for a pickle that tries to
    run code, the global it asked for (``refusing to load global 'posix.system'``).
    """

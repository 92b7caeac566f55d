""":class:`~memviz.errors.SnapshotError`, defined with every other memviz exception in :mod:`memviz.errors`."""

from memviz.errors import SnapshotError

__all__ = ["SnapshotError"]

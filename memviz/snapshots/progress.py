"""The progress bar long snapshot work shows (rebuilding a history, replaying it): ``tqdm.auto``, or none."""

from __future__ import annotations

from typing import Any

__all__ = ["AUTO_PROGRESS_EVENTS", "progress_bar"]

AUTO_PROGRESS_EVENTS = 50_000  # show a bar by default from this many events on


def progress_bar(total: int, progress: bool | None, desc: str) -> Any:
    """Return a ``tqdm.auto`` bar of ``total`` events, or None.

    Args:
        total: events the work will go through.
        progress: True / False to show it or not; None shows one from :data:`AUTO_PROGRESS_EVENTS` on.
        desc: the bar's label.
    """
    if progress is None:
        progress = total >= AUTO_PROGRESS_EVENTS
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="ev", unit_scale=True, leave=False)

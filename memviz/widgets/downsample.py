"""Draw a long series at a bounded number of points without losing a peak: the per-slice envelope.

Both timelines use it: the dashboard's (the lab's events, redrawn on every click, so a click's cost stays
flat in the length of the history) and the snapshot viewer's (a recorded run of 60,000+ events).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["envelope", "envelope_of"]


def envelope(values: np.ndarray, buckets: int = 2000) -> np.ndarray:
    """Indices of the events that draw ``values`` faithfully at ``buckets`` pixels: in each of ``buckets``
    equal slices of the trace, its first, last, lowest and highest event (sorted, each once).

    Every peak and trough survives, so the drawn line has the exact envelope of the full series, while a
    63,008-event trace costs at most ``4 * buckets`` points per line. Traces of up to ``4 * buckets`` events
    are kept whole.

    Runtime complexity: O(n).
    """
    n = len(values)
    if n <= 4 * buckets:
        return np.arange(n)
    width = -(-n // buckets)
    rows = -(-n // width)
    padded = np.empty(rows * width, dtype=values.dtype)
    padded[:n] = values
    padded[n:] = values[-1]
    grid = padded.reshape(rows, width)
    starts = np.arange(rows) * width
    picks = np.concatenate(
        [starts, np.minimum(starts + width, n) - 1, starts + grid.argmin(axis=1), starts + grid.argmax(axis=1)]
    )
    return np.unique(np.minimum(picks, n - 1))


def envelope_of(series: Sequence[np.ndarray], keep: Iterable[int] = (), buckets: int = 2000) -> np.ndarray:
    """The union of :func:`envelope` over several series of one length, plus the indices in ``keep`` (the
    events a marker stands on, so every marker sits on the drawn line). Sorted, each index once."""
    n = len(series[0]) if series else 0
    if n <= 4 * buckets:
        return np.arange(n)
    picks = [envelope(values, buckets) for values in series]
    picks.append(np.fromiter(keep, dtype=np.int64))
    return np.unique(np.concatenate(picks))

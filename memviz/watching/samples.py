"""What a watch reads at each tick, and the bounded store that keeps a run's samples.

A :class:`Sample` holds the allocator's numbers at one moment: ``memory_allocated()``, ``memory_reserved()``,
active bytes, and the allocator's own peaks. Reading the peaks is what makes a 10 Hz sampler exact about the
peak: a spike that lives for a microsecond between two samples is missed by the current values, but the
allocator's ``allocated_bytes.all.peak`` counted it, so the next sample's peak holds its exact height.

:class:`SampleStore` keeps the samples of a run in numpy arrays that double as they fill, up to
``max_points``; past that it keeps the later sample of each pair and from then on stores every second
sample (then every fourth, ...). The peaks are running maxima, so the later sample of a pair holds the peak
of both: thinning never lowers a peak. Memory is bounded: ``max_points`` x 8 numbers x 8 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memviz.errors import InputError

__all__ = ["FIELDS", "NO_DRIVER", "Sample", "SampleStore"]

FIELDS = ("t_s", "allocated_bytes", "reserved_bytes", "active_bytes", "allocated_peak_bytes",
          "reserved_peak_bytes", "driver_used_bytes", "steps")  # fmt: skip
"""A sample's fields in row order (what :meth:`Sample.row` gives, the stats file's lines and the view's rows)."""
NO_DRIVER = -1
"""``driver_used_bytes`` in a row when no driver was read (the simulator, or not read at this tick)."""
DEFAULT_MAX_POINTS = 20_000


@dataclass(frozen=True, slots=True)
class Sample:
    """The allocator at one moment of a watched run. Bytes are ints; ``t_s`` is seconds since the watch began.

    Attributes:
        t_s: when it was read, in seconds since the watch started.
        allocated_bytes, reserved_bytes, active_bytes: ``allocated_bytes.all.current``, ``reserved_bytes``,
            ``active_bytes`` (allocated plus freed blocks waiting for another stream).
        allocated_peak_bytes, reserved_peak_bytes: the highest allocated / reserved since the watch began
            (the allocator's own peak stats, kept as a running maximum if the program resets them).
        driver_used_bytes: the driver's used memory (NVML: what ``nvidia-smi`` shows, every process), or None
            when not read (the simulator has no driver).
        steps: training steps done when it was read (``memviz.step()`` calls, or optimizer steps).
    """

    t_s: float
    allocated_bytes: int
    reserved_bytes: int
    active_bytes: int
    allocated_peak_bytes: int
    reserved_peak_bytes: int
    driver_used_bytes: int | None
    steps: int

    def row(self) -> list[float | int]:
        """The sample as a list in :data:`FIELDS` order (``NO_DRIVER`` for a missing driver reading)."""
        driver = NO_DRIVER if self.driver_used_bytes is None else self.driver_used_bytes
        return [self.t_s, self.allocated_bytes, self.reserved_bytes, self.active_bytes, self.allocated_peak_bytes,
                self.reserved_peak_bytes, driver, self.steps]  # fmt: skip

    @classmethod
    def from_row(cls, row: list | tuple | np.ndarray) -> Sample:
        """The sample of a row in :data:`FIELDS` order (the inverse of :meth:`row`)."""
        t, a, r, ac, pa, pr, d, s = row
        return cls(float(t), int(a), int(r), int(ac), int(pa), int(pr), None if int(d) < 0 else int(d), int(s))


class SampleStore:
    """The samples of one run, bounded: see the module docstring.

    Args:
        max_points: most samples kept (default 20,000: 33 minutes at 10 Hz before the first thinning).

    Attributes: ``t_s`` (float64 seconds) and ``values`` (int64, one row per sample, columns :data:`FIELDS`
    after ``t_s``), both views of the samples kept; ``stride`` (1, 2, 4, ...: one sample in ``stride`` is
    stored now); ``offered`` (samples offered to :meth:`add`).
    """

    def __init__(self, max_points: int = DEFAULT_MAX_POINTS) -> None:
        if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 2:
            raise InputError(f"max_points must be an int >= 2 (samples kept), not {max_points!r}")
        self.max_points = max_points
        self._t = np.zeros(min(1024, max_points))
        self._v = np.zeros((len(self._t), len(FIELDS) - 1), dtype=np.int64)
        self.n = 0
        self.stride = 1
        self.offered = 0

    def add(self, sample: Sample, *, keep: bool = False) -> bool:
        """Offer a sample; True when it was stored (one in ``stride`` is, counting from the first; ``keep``: this
        one is, whatever the stride: the last of a run)."""
        offered, self.offered = self.offered, self.offered + 1
        if offered % self.stride and not keep:
            return False
        if self.n == len(self._t):
            if self.n == self.max_points:
                self._thin()
            else:
                self._grow(min(2 * self.n, self.max_points))
        row = sample.row()
        self._t[self.n] = row[0]
        self._v[self.n] = row[1:]
        self.n += 1
        return True

    def _grow(self, size: int) -> None:
        t, v = np.zeros(size), np.zeros((size, self._v.shape[1]), dtype=np.int64)
        t[: self.n], v[: self.n] = self._t[: self.n], self._v[: self.n]
        self._t, self._v = t, v

    def _thin(self) -> None:
        """Keep the later sample of each pair (its peaks cover both) and store every second sample from now."""
        keep = np.arange(1, self.n, 2)
        k = len(keep)
        self._t[:k], self._v[:k] = self._t[keep], self._v[keep]
        self.n = k
        self.stride *= 2

    @property
    def t_s(self) -> np.ndarray:
        return self._t[: self.n]

    @property
    def values(self) -> np.ndarray:
        return self._v[: self.n]

    def column(self, name: str) -> np.ndarray:
        """One field of every stored sample (``"allocated_bytes"``, ...; ``"t_s"`` gives the times)."""
        if name == "t_s":
            return self.t_s
        return self.values[:, FIELDS.index(name) - 1]

    def rows(self) -> list[list[float | int]]:
        """Every stored sample as a row (:meth:`Sample.row`)."""
        return [[float(t), *map(int, v)] for t, v in zip(self.t_s, self.values, strict=True)]

    def last(self) -> Sample | None:
        """The newest stored sample, or None."""
        if not self.n:
            return None
        return Sample.from_row([self._t[self.n - 1], *self._v[self.n - 1]])

    def __len__(self) -> int:
        return self.n

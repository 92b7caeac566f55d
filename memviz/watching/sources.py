"""What a watch reads, in this process: a CUDA device through torch, or a simulated lab.

A source gives the allocator's five numbers at once (:meth:`read`: allocated, reserved and active bytes, the
peak allocated and peak reserved), the driver's used memory where there is a driver, and resets the peaks.
:class:`SampleReader` turns those numbers into :class:`~memviz.watching.samples.Sample` objects: the time
since the watch began, the steps so far, and peaks kept as running maxima.

Thread safety: the sampler reads from its own thread while the program runs. torch's allocator takes its
mutex for ``memory_stats``, so a read is one consistent state. The simulator is plain Python and is changed
by the program's thread between bytecodes, so :class:`SimLabSource` never reads the allocator from the
sampler: it reads the stats the lab recorded after its latest action (``lab.events[-1].stats_after``), a
dict built by the program's own thread once the action was complete.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from memviz.errors import InputError, InputTypeError
from memviz.units import format_bytes
from memviz.watching.samples import Sample
from memviz.watching.steps import StepCounter

if TYPE_CHECKING:
    from memviz.lab import Lab

__all__ = ["CudaSource", "SampleReader", "SimLabSource", "lab_source"]

Reading = tuple[int, int, int, int, int]
"""allocated, reserved, active, peak allocated, peak reserved (bytes)."""

DRIVER_EVERY_S = 1.0
"""The driver's used memory is read at most once a second (an NVML query, or cudaMemGetInfo without NVML)."""


class CudaSource:
    """A CUDA device through torch: ``torch._C._cuda_memoryStats`` (the nested dict ``memory_stats()`` flattens,
    without the flattening: about a third of its cost), and NVML's used memory.

    Args:
        device: CUDA device index (default: the current device).
        cap_bytes: the cap the program set, to draw the gauges against (default: read from
            ``torch.cuda.get_per_process_memory_fraction`` where torch has it; None: the device's memory).

    Raises:
        RuntimeError: CUDA is not available. InputError: no such device.
    """

    kind = "cuda"

    def __init__(self, device: int | None = None, cap_bytes: int | None = None) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("CUDA is not available here: watch the simulator with a lab, "
                               "memviz.watch(memviz.Lab('sim', cap='2 GiB'))")
        count = torch.cuda.device_count()
        index = torch.cuda.current_device() if device is None else device
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise InputError(f"device must be a CUDA device index from 0 to {count - 1}, not {device!r}")
        torch.cuda.init()
        self.index = index
        self.device = torch.device("cuda", index)
        props = torch.cuda.get_device_properties(self.device)
        self.device_name = props.name
        self.total_bytes = props.total_memory
        self.cap_bytes = cap_bytes if cap_bytes is not None else _cap_in_force(torch, index, props.total_memory)
        self.oom_errors: tuple[type[BaseException], ...] = (torch.cuda.OutOfMemoryError,)
        self._stats = torch._C._cuda_memoryStats
        from memviz.backends.cuda import _nvml_handle

        self._nvml = _nvml_handle(self.device)
        self._mem_get_info = torch.cuda.mem_get_info
        self._reset_peak = torch.cuda.reset_peak_memory_stats

    def read(self) -> Reading:
        s = self._stats(self.index)
        a, r, ac = s["allocated_bytes"]["all"], s["reserved_bytes"]["all"], s["active_bytes"]["all"]
        return a["current"], r["current"], ac["current"], a["peak"], r["peak"]

    def driver_used(self) -> int | None:
        """Used device memory as the driver counts it (every process, the CUDA context, libraries)."""
        if self._nvml is not None:
            import pynvml

            return int(pynvml.nvmlDeviceGetMemoryInfo(self._nvml).used)
        free_bytes, total_bytes = self._mem_get_info(self.device)
        return int(total_bytes - free_bytes)

    def reset_peak(self) -> None:
        self._reset_peak(self.device)

    def describe(self) -> str:
        cap = f", capped at {format_bytes(self.cap_bytes)}" if self.cap_bytes is not None else ""
        return f"real GPU (torch.cuda): {self.device_name}, {format_bytes(self.total_bytes)}{cap}"


class SimLabSource:
    """A lab on the simulator, read through its events (see the module docstring): the numbers after the
    lab's latest action. Memory that plain code frees between actions shows at the next action, and at the
    end of the watch (which calls ``lab.observe()`` from the program's thread)."""

    kind = "sim"

    def __init__(self, lab: Lab) -> None:
        backend = lab.backend
        self.lab = lab
        self.device_name = backend.device_name
        self.total_bytes = backend.total_memory_bytes
        self.cap_bytes = backend.cap_bytes
        self.oom_errors = backend.oom_errors
        self._stats_at_start: dict[str, int] = dict(lab.stats())

    def read(self) -> Reading:
        events = self.lab.events
        s = events[-1].stats_after if events else self._stats_at_start
        return (s.get("allocated_bytes.all.current", 0), s.get("reserved_bytes.all.current", 0),
                s.get("active_bytes.all.current", 0), s.get("allocated_bytes.all.peak", 0),
                s.get("reserved_bytes.all.peak", 0))  # fmt: skip

    def driver_used(self) -> int | None:
        return None  # the simulator has no driver

    def reset_peak(self) -> None:
        """``lab.reset_peak()``: an event in the lab's log, from the calling (program's) thread."""
        self.lab.reset_peak()

    def describe(self) -> str:
        return self.lab.describe()


def lab_source(lab: Any) -> CudaSource | SimLabSource:
    """The source for a :class:`~memviz.lab.Lab`: its CUDA device read through torch, or its simulator.

    Raises:
        InputTypeError: ``lab`` is not a Lab.
    """
    from memviz.lab import Lab

    if not isinstance(lab, Lab):
        raise InputTypeError(f"expected a memviz.Lab, not {type(lab).__name__}")
    if lab.backend.kind == "cuda":
        return CudaSource(lab.backend.device.index, lab.backend.cap_bytes)
    if lab.backend.kind == "sim":
        return SimLabSource(lab)
    raise InputError(f"cannot watch a lab on a {lab.backend.kind!r} backend; watch a 'cuda' or 'sim' lab")


class SampleReader:
    """Reads a source into samples: ``reader()`` returns ``[Sample]`` for now.

    The peaks are running maxima of the source's peaks, so a program that resets the peak stats itself
    (``torch.cuda.reset_peak_memory_stats()`` inside the loop) lowers nothing; ``peak_resets`` counts the
    times the source's peak went down. With ``peaks_from_start=False`` (the peaks were not reset when the
    watch began: they may hold an older, higher peak), a source peak counts only once it rises above its value
    at the start, until then the highest current value read stands in.

    Args:
        source: a :class:`CudaSource` or :class:`SimLabSource`.
        counter: the watch's :class:`~memviz.watching.steps.StepCounter`.
        t0: ``time.perf_counter()`` when the watch began.
        peaks_from_start: whether the source's peaks were reset when the watch began (default True).
        driver_every_s: read the driver's memory at most this often (default :data:`DRIVER_EVERY_S`).

    Attributes: ``reads`` (how many), ``peak_resets``, ``driver_used_bytes`` (the last driver reading or None).
    """

    def __init__(self, source: CudaSource | SimLabSource, counter: StepCounter, t0: float, *,
                 peaks_from_start: bool = True, driver_every_s: float = DRIVER_EVERY_S) -> None:  # fmt: skip
        self.source = source
        self.counter = counter
        self.t0 = t0
        self.driver_every_s = driver_every_s
        a, r, _, pa, pr = source.read()
        self._raw_peaks = (pa, pr)
        self._floor = (0, 0) if peaks_from_start else (pa, pr)  # a source peak counts once above this
        self.allocated_peak, self.reserved_peak = (pa, pr) if peaks_from_start else (a, r)
        self.peak_resets = 0
        self.reads = 0
        self.driver_used_bytes: int | None = None
        self._driver_at = -driver_every_s

    def __call__(self) -> list[Sample]:
        a, r, ac, pa, pr = self.source.read()
        now = time.perf_counter() - self.t0
        if pa < self._raw_peaks[0] or pr < self._raw_peaks[1]:
            self.peak_resets += 1
        self._raw_peaks = (pa, pr)
        peak_a = max(self.allocated_peak, a, pa if pa > self._floor[0] else 0)
        peak_r = max(self.reserved_peak, r, pr if pr > self._floor[1] else 0)
        self.allocated_peak, self.reserved_peak = peak_a, peak_r
        if now - self._driver_at >= self.driver_every_s:
            driver = self.source.driver_used()
            if driver is not None:
                self.driver_used_bytes = driver
            self._driver_at = now
        self.reads += 1
        return [Sample(now, a, r, ac, peak_a, peak_r, self.driver_used_bytes, self.counter.count)]


def _cap_in_force(torch: Any, index: int, total_bytes: int) -> int | None:
    """The cap ``set_per_process_memory_fraction`` put in force, where torch can say (None: no cap, or unknown)."""
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if getter is None:
        return None
    fraction = getter(index)
    return None if fraction >= 1.0 else int(fraction * total_bytes)

"""``memviz.watch()``: watch a training loop's memory live, in the notebook, while its cell runs.

::

    with memviz.watch():            # the current CUDA device; memviz.watch(lab) for a lab (the simulator too)
        for batch in loader:        # your code, unchanged
            ...
            memviz.step()           # optional: step markers (else the optimizer's steps are counted)

While the block runs, a sampler thread (:mod:`memviz.watching.sampler`) reads the allocator ten times a
second and the gauges and the timeline grow in the cell's output. On a GPU the allocator also records its
history (every alloc and free, with the Python stack of each allocation, the last ``max_entries`` events).
When the block ends, or an ``OutOfMemoryError`` ends it, the segment map and the snapshot viewer open at the
peak, or at the OOM (the allocator's OOM observer takes the snapshot at that moment), with the largest live
tensors and where they were made, and the what-if replays one click away.

An out-of-memory error ends the block, not the notebook: its traceback's finished frames are cleared (the
failed step's tensors are freed; ``w.end_allocated_bytes`` shows the memory back) and, unless
``raise_oom=True``, the error is kept in ``w.oom`` instead of being raised, so no traceback pins memory.

``memviz.watch("run/stats.jsonl")`` follows the stats file a job writes with :func:`memviz.record` (a
``torchrun`` job, a script in a terminal, another machine with a shared folder); the same views open from the
snapshot the job dumps at its end or its OOM. ``memviz.watch("run.pickle")`` follows a snapshot file that a job
rewrites with ``torch.cuda.memory._dump_snapshot`` (:mod:`memviz.watching.snapshotfile`).
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from typing import TYPE_CHECKING, Any

from memviz.errors import InputError, InputTypeError
from memviz.units import format_bytes
from memviz.watching.cuda_history import DEFAULT_MAX_ENTRIES, CudaHistory, add_oom_listener, remove_oom_listener
from memviz.watching.live_blocks import LiveGroup
from memviz.watching.results import FOLLOWERS, WatchOOM, WatchResults
from memviz.watching.sampler import Sampler, check_interval
from memviz.watching.samples import DEFAULT_MAX_POINTS, Sample, SampleStore
from memviz.watching.sim_trace import trace_position
from memviz.watching.snapshotfile import SNAPSHOT_SUFFIXES, SnapshotFollower
from memviz.watching.sources import CudaSource, SampleReader, SimLabSource, lab_source
from memviz.watching.statsfile import StatsFollower
from memviz.watching.steps import StepCounter

if TYPE_CHECKING:
    from memviz.snapshots import SnapshotHistory
    from memviz.widgets.watch_view import WatchView

__all__ = ["Watch", "WatchOOM", "watch"]


class Watch(WatchResults):
    """A watch of one source, started by :func:`watch` (see the module docstring for the whole story).

    Attributes while and after it runs: ``source``, ``samples`` (a
    :class:`~memviz.watching.samples.SampleStore`), ``steps``, ``ooms`` (:class:`WatchOOM` list), ``view`` (the
    :class:`~memviz.widgets.watch_view.WatchView`, or None with ``show=False``), ``error`` (the sampler's
    error line, or None). After it: ``peak_allocated_bytes`` / ``peak_reserved_bytes`` (the allocator's own
    peaks over the watch: exact, whatever the sampling rate), ``oom`` (the OOM that ended the block, or
    None), ``history`` (the recorded :class:`~memviz.snapshots.SnapshotHistory`, or None), ``focus`` (``"oom"``,
    ``"peak"`` or None) and ``focus_index`` (its event in ``history``), ``live`` (the largest live tensors
    there, :class:`~memviz.watching.live_blocks.LiveGroup` list), ``notes`` (what the results cannot say
    exactly, in words), ``wall_s``, ``sampler_cpu_s``.
    """

    def __init__(self, source: Any = None, *, interval_s: float = 0.1, history: bool = True,
                 max_entries: int = DEFAULT_MAX_ENTRIES, reset_peak: bool = True, raise_oom: bool = False,
                 show: bool = True, max_points: int = DEFAULT_MAX_POINTS) -> None:  # fmt: skip
        self.interval_s = check_interval(interval_s)
        for name, value in (("history", history), ("reset_peak", reset_peak), ("raise_oom", raise_oom),
                            ("show", show)):  # fmt: skip
            if not isinstance(value, bool):
                raise InputTypeError(f"{name} must be True or False, not {value!r}")
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise InputError(f"max_entries must be an int >= 1 (events of memory history kept), not {max_entries!r}")
        self.samples = SampleStore(max_points)
        self.source = _resolve(source)
        self.record_history, self.max_entries = history, max_entries
        self.reset_peak, self.raise_oom, self.show = reset_peak, raise_oom, show
        self.view: WatchView | None = None
        self.ooms: list[WatchOOM] = []
        self.oom: WatchOOM | None = None
        self.history: SnapshotHistory | None = None
        self.focus: str | None = None
        self.focus_index: int | None = None
        self.focus_segments: list[dict] | None = None
        self.live: list[LiveGroup] = []
        self.notes: list[str] = []
        self.last: Sample | None = None  # the newest sample read (the store may not keep every one)
        self.start_allocated_bytes = self.end_allocated_bytes = 0
        self.wall_s = 0.0
        self._state = "new"
        self._counter = StepCounter()
        self._sampler: Sampler | None = None
        self._reader: SampleReader | None = None
        self._cuda_history: CudaHistory | None = None
        self._oom_snapshot: dict | None = None
        self._lab_seen = 0  # lab events scanned for OOMs
        self._lab_time0 = 0.0
        self._sim_trace_start = 0
        self._t0 = 0.0

    # -- running ------------------------------------------------------------------------------------

    def start(self) -> Watch:
        """Reset the peaks, start the memory history (GPU) and the sampler, and show the view.

        Raises:
            InputError: the watch ran already; a stats file that is not one (nothing is left running).
        """
        if self._state != "new":
            raise InputError("this watch has run already; start a new one with memviz.watch()")
        if self.show:  # made first: loading the widgets takes a while the first time, not the watch's time
            from memviz.widgets.watch_view import WatchView

            self.view = WatchView(self)
        try:
            first = self._begin()
        except BaseException:
            self._end_recording()
            if self.view is not None:
                self.view.close()
                self.view = None
            raise
        self._state = "running"
        for sample in first:
            self.samples.add(sample)
        if first:
            self.last = first[-1]
        if self.view is not None:
            self.view.push(first)
            _display(self.view)
        poll = self._poll_file if isinstance(self.source, FOLLOWERS) else self._poll_in_process
        self._sampler = Sampler(poll, self.interval_s, self._on_samples).start()
        return self

    def _begin(self) -> list[Sample]:
        """Everything before the first sample; the first sample(s)."""
        source = self.source
        if isinstance(source, FOLLOWERS):
            first = source.prime()  # a file that exists must be one: refused now, before anything starts
            self._counter.start()
            self._t0 = time.perf_counter()
            return first
        self._counter.start()
        if self.reset_peak:
            source.reset_peak()
        if isinstance(source, SimLabSource):
            events = source.lab.events
            self._lab_seen = len(events)
            self._lab_time0 = events[-1].time_s if events else 0.0  # the reset at the start, lab's clock
            self._sim_trace_start = trace_position(source.lab)
        else:
            if self.record_history:
                self._cuda_history = CudaHistory(source.index, self.max_entries)
                self._cuda_history.start()
            add_oom_listener(self._on_cuda_oom)
        self._t0 = time.perf_counter()
        self._reader = SampleReader(source, self._counter, self._t0, peaks_from_start=self.reset_peak)
        first = self._reader()
        self.start_allocated_bytes = first[0].allocated_bytes
        return first

    def _end_recording(self) -> None:
        """Stop counting steps, the OOM listener and the memory history (idempotent)."""
        self._counter.stop()
        remove_oom_listener(self._on_cuda_oom)
        if self._cuda_history is not None:
            self._cuda_history.stop()

    def _poll_in_process(self) -> list[Sample]:
        assert self._reader is not None
        samples = self._reader()
        if isinstance(self.source, SimLabSource):
            self._scan_lab_ooms()
        return samples

    def _poll_file(self, *, final: bool = False) -> list[Sample]:
        follower = self.source
        assert isinstance(follower, FOLLOWERS)
        samples = follower(settle=True) if final and isinstance(follower, SnapshotFollower) else follower()
        if isinstance(follower, StatsFollower):
            seen = {(o.t_s, o.message) for o in self.ooms}
            for e in follower.events:
                if e.event == "oom" and (e.t_s, e.message) not in seen:
                    self.ooms.append(WatchOOM(e.message, e.t_s, e.steps, ended_block=True))
        else:
            for t_s in follower.oom_times_s[len(self.ooms):]:
                self.ooms.append(WatchOOM("an oom event in the snapshot's trace", t_s, 0, ended_block=True))
        return samples

    def _on_samples(self, samples: list[Sample], *, final: bool = False) -> None:
        for k, sample in enumerate(samples):
            self.samples.add(sample, keep=final and k == len(samples) - 1)  # a run's last sample is kept
        if samples:
            self.last = samples[-1]
        if self.view is not None:
            self.view.push(samples)

    def _scan_lab_ooms(self) -> None:
        """OOM events the lab recorded since the last scan (the lab catches every OOM: the program carries on)."""
        assert isinstance(self.source, SimLabSource)
        events = self.source.lab.events
        new, self._lab_seen = events[self._lab_seen :], len(events)
        for e in new:
            if e.oom is not None:
                self.ooms.append(WatchOOM(e.oom.message, e.time_s - self._lab_time0, self._counter.count,
                                          ended_block=False))

    def _on_cuda_oom(self, device: int, alloc_bytes: int, limit_bytes: int, free_bytes: int) -> None:
        """The OOM observer (the program's thread, inside the failing malloc): keep the snapshot of this moment."""
        source = self.source
        assert isinstance(source, CudaSource)
        if device != source.index:
            return
        t_s = time.perf_counter() - self._t0
        import torch

        self._oom_snapshot = torch.cuda.memory._snapshot(source.index)
        self.ooms.append(WatchOOM(f"out of memory requesting {format_bytes(alloc_bytes)} "
                                  f"({format_bytes(free_bytes)} free of {format_bytes(limit_bytes)})",
                                  t_s, self._counter.count, ended_block=False))  # fmt: skip

    def stop(self) -> Watch:
        """Stop sampling, take the last sample, find the peak or the OOM in the history, and open the views."""
        if self._state != "running":
            return self
        self._state = "stopping"
        assert self._sampler is not None
        self._sampler.stop()
        source = self.source
        if isinstance(source, FOLLOWERS):
            self._on_samples(self._poll_file(final=True), final=True)
        else:
            if isinstance(source, SimLabSource):
                source.lab.observe("end of the watch")  # memory plain code freed since the lab's last action
            self._on_samples(self._poll_in_process(), final=True)
            self.end_allocated_bytes = self.last.allocated_bytes if self.last is not None else 0
        self._counter.stop()
        remove_oom_listener(self._on_cuda_oom)
        self.wall_s = time.perf_counter() - self._t0
        try:
            self._results()
        except Exception as error:  # the program's own error, if any, must not be replaced by ours
            self.notes.append(f"the results could not be built: {type(error).__name__}: {error}")
        finally:
            self._end_recording()
            self._state = "done"
        if self.view is not None:
            self.view.finish()
        return self

    def __enter__(self) -> Watch:
        if self._state == "new":
            self.start()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        oom_types = getattr(self.source, "oom_errors", ())
        ended_by_oom = exc is not None and bool(oom_types) and isinstance(exc, oom_types)
        if ended_by_oom:
            assert exc is not None
            _release_frames(exc)  # the failed step's tensors go now: the last sample shows the memory back
            steps = self._counter.count
            t_s = time.perf_counter() - self._t0
            seen = self.ooms[-1] if self.ooms and not self.ooms[-1].ended_block else None
            if seen is not None:  # the observer saw it first, at the moment of the failure
                self.ooms[-1] = WatchOOM(str(exc), seen.t_s, seen.steps, ended_block=True)
            else:
                self.ooms.append(WatchOOM(str(exc), t_s, steps, ended_block=True))
            self.oom = self.ooms[-1]
        self.stop()
        return ended_by_oom and not self.raise_oom

    # -- results --------------------------------------------------------------------------------------

    @property
    def steps(self) -> int:
        """Steps counted so far (``memviz.step()`` calls, else the first optimizer's steps; the file's count)."""
        last = self.last
        if isinstance(self.source, FOLLOWERS):
            return last.steps if last is not None else 0
        return self._counter.count

    @property
    def median_step_s(self) -> float | None:
        """The median time between consecutive steps (in-process watches; None before two steps)."""
        return self._counter.median_step_s()

    @property
    def peak_allocated_bytes(self) -> int:
        """The highest allocated since the watch began (the allocator's own peak: exact)."""
        return self.last.allocated_peak_bytes if self.last is not None else 0

    @property
    def peak_reserved_bytes(self) -> int:
        """The highest reserved since the watch began (the allocator's own peak: exact)."""
        return self.last.reserved_peak_bytes if self.last is not None else 0

    @property
    def sampler_cpu_s(self) -> float:
        """CPU seconds the sampler thread used (reading the allocator and sending to the view)."""
        return self._sampler.cpu_s if self._sampler is not None else 0.0

    @property
    def error(self) -> str | None:
        """Why the sampler stopped early (one line), or None."""
        return self._sampler.error if self._sampler is not None else None

    @property
    def running(self) -> bool:
        return self._state == "running"

    def describe(self) -> str:
        source = self.source
        if isinstance(source, SnapshotFollower):
            return f"the snapshot file {source.path} ({source.loads} loads)"
        if isinstance(source, StatsFollower):
            header = source.header
            where = f"{header['device']} (pid {header['pid']} on {header['host']})" if header else "waiting for it"
            return f"the stats file {source.path} — {where}"
        return source.describe()

    def __repr__(self) -> str:
        return f"<memviz watch of {self.describe()}: {self._state}, {self.steps} steps, {self.samples.offered} samples>"


def watch(source: Any = None, *, interval_s: float = 0.1, history: bool = True, max_entries: int = DEFAULT_MAX_ENTRIES,
          reset_peak: bool = True, raise_oom: bool = False, show: bool = True,
          max_points: int = DEFAULT_MAX_POINTS) -> Watch:  # fmt: skip
    """Watch memory live while your code runs: ``with memviz.watch():`` around a training loop.

    Args:
        source: what to watch: None (the current CUDA device), a CUDA device index, a :class:`memviz.Lab` (a
            real GPU or the simulator), or the path of a stats file that :func:`memviz.record` writes (a job in
            another process), or of a snapshot pickle (``.pickle``/``.pkl``) that a job rewrites as it runs.
        interval_s: seconds between samples (default 0.1: ten a second; 0.01 to 60).
        history: on a GPU, record the allocator's memory history while watching (default True), so the map
            opens at the peak or the OOM with the stacks of the live tensors. torch's recorder takes each
            allocation's Python stack: on the H200 it cost a launch-bound 3.3 ms step 13.5% and a GPU-bound 27 ms
            step 0.05% (scripts/gpu_watch_check.py); ``history=False`` leaves only the sampler's cost (+0.4% and
            +0.07% there).
        max_entries: events of history kept, the oldest dropped first (default 100,000).
        reset_peak: reset the peak stats when the watch begins (default True), so the peaks are the block's
            own, exact (``torch.cuda.reset_peak_memory_stats``; on a lab, ``lab.reset_peak()``).
        raise_oom: raise an ``OutOfMemoryError`` that ends the block (its finished frames cleared) instead of
            keeping it in ``.oom`` (default False: the notebook carries on, nothing pinned).
        show: show the live view in the notebook (default True; nothing is shown outside IPython).
        max_points: samples kept (default 20,000; past it every second one is dropped, peaks kept).

    Returns:
        The running :class:`Watch`; as a context manager it stops at the end of the block.

    Raises:
        InputError / InputTypeError: a bad argument or source (nothing started); RuntimeError: ``None`` or a
            device index without CUDA.
    """
    return Watch(source, interval_s=interval_s, history=history, max_entries=max_entries, reset_peak=reset_peak,
                 raise_oom=raise_oom, show=show, max_points=max_points).start()  # fmt: skip


def _resolve(source: Any) -> CudaSource | SimLabSource | StatsFollower | SnapshotFollower:
    from memviz.lab import Lab

    if source is None:
        from memviz.backends import cuda_available

        if not cuda_available():
            raise RuntimeError("no GPU here: watch a lab on the simulator, memviz.watch(memviz.Lab('sim', "
                               "cap='2 GiB')), or a job's stats file, memviz.watch('run/stats.jsonl')")
        return CudaSource()
    if isinstance(source, Lab):
        return lab_source(source)
    if isinstance(source, int) and not isinstance(source, bool):
        return CudaSource(source)
    if isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        return SnapshotFollower(path) if path.endswith(SNAPSHOT_SUFFIXES) else StatsFollower(path)
    raise InputTypeError(f"memviz.watch() takes None (the current GPU), a CUDA device index, a memviz.Lab or a stats "
                         f"file's path, not {type(source).__name__}")


def _release_frames(exc: BaseException) -> None:
    """Clear the finished frames of ``exc``'s traceback, and of the exceptions it was raised during: their local
    variables (the failed step's activations) are freed now. Frames still running (the one with the ``with``
    statement) cannot be cleared and are skipped."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if error.__traceback__ is not None:
            traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__


def _display(view: Any) -> None:
    """Show ``view`` in the notebook; nothing outside an IPython kernel (a script's watch draws nothing)."""
    with contextlib.suppress(ImportError):
        from IPython import get_ipython
        from IPython.display import display

        shell = get_ipython()
        if shell is not None and getattr(shell, "kernel", None) is not None:
            display(view.widget)

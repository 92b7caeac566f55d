"""``memviz.record(path)``: a training script writes its memory as it runs, for a notebook to watch live.

::

    with memviz.record("runs/stats-{rank}.jsonl"):   # in train.py; {rank} is RANK under torchrun (else 0)
        for batch in loader:
            ...
            memviz.step()

and in the notebook, ``memviz.watch("runs/stats-0.jsonl")``. The same sampler as a watch (a thread, ten samples a
second by default) appends one line per sample (:mod:`memviz.watching.statsfile`) and flushes it. On a GPU it
also records the allocator's memory history (``snapshot=True``) and dumps it beside the file when the job
ends (``<name>.end.pickle``) or at the moment of an out-of-memory error (``<name>.oom.pickle``, from the
allocator's OOM observer, before the error unwinds the job), so the notebook can open the map at the peak or
the OOM. A recorder never catches an error: the job fails as it would without it.

Cost: what a watch costs (the benchmark's figures), plus one short write a sample; the file grows by about
80 bytes a sample (3 MB an hour at 10 Hz).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from memviz.errors import InputError, InputTypeError
from memviz.watching.cuda_history import DEFAULT_MAX_ENTRIES, CudaHistory, add_oom_listener, remove_oom_listener
from memviz.watching.sampler import Sampler, check_interval
from memviz.watching.samples import Sample
from memviz.watching.sim_trace import sim_snapshot, trace_position
from memviz.watching.sources import CudaSource, SampleReader, SimLabSource, lab_source
from memviz.watching.statsfile import event_line, header_line, sample_line
from memviz.watching.steps import StepCounter

__all__ = ["Recorder", "record"]


def rank() -> int | None:
    """This process's rank under ``torchrun`` (``RANK``, else ``LOCAL_RANK``), or None outside one."""
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


class Recorder:
    """Writes a stats file while a job runs (see the module docstring); made by :func:`record`.

    Attributes: ``path`` (the stats file), ``source``, ``samples_written``, ``snapshots`` (the snapshot files
    written), ``error`` (the sampler's error line, or None).
    """

    def __init__(self, path: str | os.PathLike[str], source: Any = None, *, interval_s: float = 0.1,
                 snapshot: bool = True, max_entries: int = DEFAULT_MAX_ENTRIES,
                 reset_peak: bool = True) -> None:  # fmt: skip
        if not isinstance(path, str | os.PathLike):
            raise InputTypeError(f"record(path) takes a file path, not {type(path).__name__}")
        the_rank = rank()
        try:
            self.path = Path(str(path).format(rank=the_rank if the_rank is not None else 0))
        except (KeyError, IndexError, ValueError) as error:
            raise InputError(f"record({str(path)!r}): the only field a path may hold is {{rank}} ({error})") from None
        if not self.path.parent.is_dir():
            raise InputError(f"record({str(path)!r}): the folder {self.path.parent} does not exist")
        for name, value in (("snapshot", snapshot), ("reset_peak", reset_peak)):
            if not isinstance(value, bool):
                raise InputTypeError(f"{name} must be True or False, not {value!r}")
        self.interval_s = check_interval(interval_s)
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise InputError(f"max_entries must be an int >= 1 (events of memory history kept), not {max_entries!r}")
        self.rank = the_rank
        if source is None:
            self.source: CudaSource | SimLabSource = CudaSource()
        elif isinstance(source, int) and not isinstance(source, bool):
            self.source = CudaSource(source)
        else:
            self.source = lab_source(source)
        self.snapshot, self.max_entries, self.reset_peak = snapshot, max_entries, reset_peak
        self.samples_written = 0
        self.snapshots: list[Path] = []
        self._counter = StepCounter()
        self._lock = threading.Lock()  # the sampler's lines and the OOM observer's event share the file
        self._file: Any = None
        self._sampler: Sampler | None = None
        self._reader: SampleReader | None = None
        self._history: CudaHistory | None = None
        self._trace_start = 0
        self._lab_seen = 0
        self._t0 = 0.0

    def start(self) -> Recorder:
        source = self.source
        self._counter.start()
        if self.reset_peak:
            source.reset_peak()
        if isinstance(source, SimLabSource):
            self._trace_start = trace_position(source.lab)
            self._lab_seen = len(source.lab.events)
        else:
            if self.snapshot:
                self._history = CudaHistory(source.index, self.max_entries)
                self._history.start()
            add_oom_listener(self._on_cuda_oom)
        self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed by stop()
        self._write(header_line(device=source.device_name, total_bytes=source.total_bytes, cap_bytes=source.cap_bytes,
                                kind=source.kind, interval_s=self.interval_s, pid=os.getpid(),
                                host=socket.gethostname(), rank=self.rank, started_unix=time.time()))  # fmt: skip
        self._t0 = time.perf_counter()
        self._reader = SampleReader(source, self._counter, self._t0, peaks_from_start=self.reset_peak)
        self._write_samples(self._reader())
        self._sampler = Sampler(self._poll, self.interval_s, self._write_samples, name="memviz-recorder").start()
        return self

    def _poll(self) -> list[Sample]:
        """The reader's sample; on a simulated lab, an ``oom`` line for each OOM event the lab recorded since."""
        assert self._reader is not None
        samples = self._reader()
        if isinstance(self.source, SimLabSource):
            events = self.source.lab.events
            new, self._lab_seen = events[self._lab_seen :], len(events)
            for e in new:
                if e.oom is not None:  # no snapshot from this thread: the end's holds the OOM's event
                    self._write(event_line("oom", time.perf_counter() - self._t0, self._counter.count,
                                           message=e.oom.message))
        return samples

    def _write(self, line: str) -> None:
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def _write_samples(self, samples: list[Sample]) -> None:
        self._write("\n".join(sample_line(s) for s in samples))
        self.samples_written += len(samples)

    def _dump(self, suffix: str) -> str | None:
        """Write the snapshot beside the stats file; its name, or None without a history."""
        target = self.path.with_name(self.path.name + suffix)
        source = self.source
        if isinstance(source, SimLabSource):
            from memviz.snapshots import dump_snapshot

            dump_snapshot(sim_snapshot(source.lab, self._trace_start, self.max_entries), target)
        elif self._history is not None:
            import torch

            torch.cuda.memory._dump_snapshot(str(target))
        else:
            return None
        self.snapshots.append(target)
        return target.name

    def _on_cuda_oom(self, device: int, alloc_bytes: int, limit_bytes: int, free_bytes: int) -> None:
        assert isinstance(self.source, CudaSource)
        if device != self.source.index or self._file is None:
            return
        name = self._dump(".oom.pickle") if self.snapshot else None
        self._write(event_line("oom", time.perf_counter() - self._t0, self._counter.count, snapshot=name,
                               message=f"out of memory requesting {alloc_bytes} bytes ({free_bytes} free of "
                                       f"{limit_bytes})"))  # fmt: skip

    def stop(self, error: BaseException | None = None) -> None:
        """Stop the sampler, write the last sample, the end snapshot and the ``end`` line, close the file."""
        if self._file is None:
            return
        assert self._sampler is not None and self._reader is not None
        self._sampler.stop()
        source = self.source
        if isinstance(source, SimLabSource):
            source.lab.observe("end of the recording")
        self._write_samples(self._poll())
        self._counter.stop()
        if isinstance(source, CudaSource):
            remove_oom_listener(self._on_cuda_oom)
        try:
            name = self._dump(".end.pickle") if self.snapshot else None
            message = "" if error is None else f"{type(error).__name__}: {error}"
            self._write(event_line("end", time.perf_counter() - self._t0, self._counter.count, message=message,
                                   snapshot=name))  # fmt: skip
        finally:
            if self._history is not None:
                self._history.stop()
            with self._lock:
                self._file.close()
                self._file = None

    @property
    def error(self) -> str | None:
        return self._sampler.error if self._sampler is not None else None

    def __enter__(self) -> Recorder:
        if self._file is None and self._sampler is None:
            self.start()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self.stop(exc)
        return False


def record(path: str | os.PathLike[str], source: Any = None, *, interval_s: float = 0.1, snapshot: bool = True,
           max_entries: int = DEFAULT_MAX_ENTRIES, reset_peak: bool = True) -> Recorder:  # fmt: skip
    """Write this job's memory to a stats file as it runs, for ``memviz.watch(path)`` in a notebook.

    Args:
        path: the stats file (replaced if it exists); ``{rank}`` in it becomes the torchrun rank (0 outside).
        source: None (the current CUDA device), a CUDA device index, or a :class:`memviz.Lab`.
        interval_s: seconds between samples (default 0.1).
        snapshot: record the memory history and dump it beside the file at the end and at an OOM (default True).
        max_entries: events of history kept (default 100,000).
        reset_peak: reset the peak stats at the start, so the file's peaks are the job's own (default True).

    Returns:
        The running :class:`Recorder`; as a context manager it stops (and writes the end) when the block ends,
        and never hides an error.

    Raises:
        InputError / InputTypeError: a bad path (its folder missing) or argument; RuntimeError: no CUDA.
    """
    return Recorder(path, source, interval_s=interval_s, snapshot=snapshot, max_entries=max_entries,
                    reset_peak=reset_peak).start()  # fmt: skip

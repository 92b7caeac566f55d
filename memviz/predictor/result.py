"""What :func:`memviz.predict` returns: peaks, fits / OOM, the log, the breakdown, the snapshot."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memviz.sim import CachingAllocator, replay
from memviz.units import format_bytes

from .events import CATEGORIES, AllocatorCall, as_ops
from .gpus import GpuArch

__all__ = ["OutOfMemory", "Prediction"]


@dataclass(frozen=True)
class OutOfMemory:
    """The allocation that did not fit: ``requested_bytes``, torch's ``message``, the aten ``op``, the
    ``module`` (or autograd node in backward), the user's ``line`` (``file:line (function)``), the
    ``phase`` and the index the call would have had in the log."""

    requested_bytes: int
    message: str
    op: str
    module: str
    line: str
    phase: str
    event_index: int

    def __str__(self) -> str:
        where = f" in {self.module}" if self.module else ""
        return f"{format_bytes(self.requested_bytes)} for {self.op}{where} at {self.line}: {self.message}"


class Prediction:
    """The predicted memory of one run of a program on one simulated GPU.

    Attributes:
        fits: no allocation failed.
        peak_allocated_bytes / peak_reserved_bytes: the allocator's peaks (``max_memory_allocated()`` /
            ``max_memory_reserved()``).
        stats: the simulated ``torch.cuda.memory_stats()`` at the end.
        oom: None, or :class:`OutOfMemory` for the first allocation that failed.
        events: the log, a tuple of :class:`memviz.predictor.events.AllocatorCall`, one per allocator call.
        phases: ``(call index, phase)`` each time the phase changed (setup, forward, backward,
            optimizer, other).
        device: the simulated device; arch: its :class:`memviz.predictor.gpus.GpuArch`.
        cap_bytes / alloc_conf: the limit and config it ran under.
        context_bytes: what the simulated device holds outside the allocator (the CUDA context): the
            allocator could get at most the device's memory less this, or the cap if that is less.
        trace_seconds: how long the prediction took.
        notes: what this prediction met but does not model (empty when everything it ran is modelled),
            e.g. recurrent layers' cuDNN buffers, several streams, rules measured on another architecture.
    """

    def __init__(self, *, calls: tuple[AllocatorCall, ...], phases: tuple[tuple[int, str], ...],
                 allocator: CachingAllocator, new_allocator: Callable[[], CachingAllocator], device: Any,
                 arch: GpuArch, cap_bytes: int | None, alloc_conf: str, oom: OutOfMemory | None,
                 notes: tuple[str, ...], trace_seconds: float) -> None:
        self._allocator = allocator
        self._new_allocator = new_allocator
        self.device = device
        self.arch = arch
        self.cap_bytes = cap_bytes
        self.alloc_conf = alloc_conf
        self.context_bytes: int = allocator.context_bytes
        self.events = calls
        self.phases = phases
        self.stats: dict[str, int] = dict(allocator.memory_stats())
        self.peak_allocated_bytes: int = allocator.max_memory_allocated()
        self.peak_reserved_bytes: int = allocator.max_memory_reserved()
        self.oom = oom
        self.fits: bool = oom is None
        self.trace_seconds = trace_seconds
        self.notes: list[str] = list(notes)

    # ---- views

    def timeline(self) -> list[dict[str, Any]]:
        """One dict per call: action, nbytes, category, op, module, line, phase, allocated/reserved after."""
        return [e._asdict() for e in self.events]

    def breakdown_over_time(self) -> list[dict[str, int]]:
        """Bytes live per category after each call (requested sizes, as ``requested_bytes`` counts)."""
        live = dict.fromkeys(CATEGORIES, 0)
        out = []
        for e in self.events:
            live[e.category] += e.nbytes if e.action == "alloc" else -e.nbytes  # empty_cache: 0 bytes
            out.append(dict(live))
        return out

    @property
    def peak_event_index(self) -> int:
        """The call after which allocated bytes peaked (the first such)."""
        best, index = -1, 0
        for i, e in enumerate(self.events):
            if e.allocated_bytes > best:
                best, index = e.allocated_bytes, i
        return index

    def breakdown(self, at: int | None = None) -> dict[str, int]:
        """Bytes live per category after call ``at`` (default: at the peak of allocated bytes)."""
        at = self.peak_event_index if at is None else at
        live = dict.fromkeys(CATEGORIES, 0)
        for e in self.events[:at + 1]:
            live[e.category] += e.nbytes if e.action == "alloc" else -e.nbytes
        return live

    def snapshot(self, at: int | None = None) -> dict[str, Any]:
        """The simulated allocator's state in ``torch.cuda.memory._snapshot()`` form (segments and the
        device trace) at the end, or after call ``at``: the log replayed (:func:`memviz.sim.replay`) through a
        fresh allocator with the same capacity, cap and config — the simulator is deterministic, so the segments
        are the prediction's. Open it with memviz's SnapshotViewer, ``what_if``, or ``torch.cuda._memory_viz``.

        Raises:
            IndexError: ``at`` is not a call index.
        """
        if at is None:
            return self._allocator.snapshot()
        if not -len(self.events) <= at < len(self.events):
            raise IndexError(f"event index {at} out of range: the prediction has {len(self.events)} events")
        allocator = self._new_allocator()
        replay(as_ops(self.events[:at % len(self.events) + 1]), allocator)
        return allocator.snapshot()

    def summary(self) -> str:
        """A few lines: device, fits or the OOM, the peaks, the breakdown at the peak."""
        lines = [f"{self.device}{' cap ' + format_bytes(self.cap_bytes) if self.cap_bytes else ''}"
                 f"{' ' + self.alloc_conf if self.alloc_conf else ''}: "
                 + ("fits" if self.fits else "OUT OF MEMORY"),
                 f"peak allocated {format_bytes(self.peak_allocated_bytes)}, "
                 f"peak reserved {format_bytes(self.peak_reserved_bytes)}"]
        if self.oom:
            lines.append(f"OOM: {self.oom}")
        lines += [f"not modelled: {note}" for note in self.notes]
        lines.append("at the peak: " + ", ".join(f"{k} {format_bytes(v)}" for k, v in self.breakdown().items() if v))
        return "\n".join(lines)

    def __repr__(self) -> str:
        verdict = "fits" if self.fits else "OOM"
        return (f"<Prediction {verdict}: peak allocated {format_bytes(self.peak_allocated_bytes)}, "
                f"reserved {format_bytes(self.peak_reserved_bytes)} on {self.device.name}>")

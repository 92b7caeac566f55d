"""What :func:`memviz.predict` returns: peaks, fits / OOM, the timeline, the breakdown, the snapshot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memviz.units import format_bytes

from .trace import Event, Session

__all__ = ["CATEGORIES", "OutOfMemory", "Prediction"]

CATEGORIES = ("parameters", "gradients", "optimizer state", "activations", "temporaries", "workspaces")
"""The breakdown's categories, in stacking order. Parameters (and buffers) are what modules own;
gradients are the parameters' ``.grad``; optimizer state is what ``opt.state`` holds after a step;
activations are the other tensors made before or during a forward pass (the inputs, what autograd
saves, the outputs); temporaries are the others made in backward, the optimizer step or after;
workspaces are the libraries' non-tensor requests (cuBLAS, cuBLASLt, cuDNN, flash attention)."""


@dataclass(frozen=True)
class OutOfMemory:
    """The allocation that did not fit: ``requested_bytes``, torch's ``message``, the aten ``op``, the
    ``module`` (or autograd node in backward), the user's ``line`` (``file:line (function)``), the
    ``phase`` and the index of the event it would have been."""

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


def _category(e: Event) -> str:
    if e.category is not None:
        return e.category
    return "activations" if e.phase in ("forward", "setup") else "temporaries"


class Prediction:
    """The predicted memory of one run of a program on one simulated GPU.

    Attributes:
        fits: no allocation failed.
        peak_allocated_bytes / peak_reserved_bytes: the allocator's peaks (``max_memory_allocated()`` /
            ``max_memory_reserved()``).
        stats: the simulated ``torch.cuda.memory_stats()`` at the end.
        oom: None, or :class:`OutOfMemory` for the first allocation that failed.
        events: the timeline, one :class:`memviz.predict.trace.Event` per allocator call.
        phases: ``(event index, phase)`` each time the phase changed (setup, forward, backward,
            optimizer, other).
        device: the simulated device; arch: its :class:`memviz.predict.gpus.GpuArch`.
        cap_bytes / alloc_conf: the limit and config it ran under.
        context_bytes: what the simulated device holds outside the allocator (the CUDA context): the
            allocator could get at most the device's memory less this, or the cap if that is less.
        trace_seconds: how long the prediction took.
        notes: what this prediction met but does not model (empty when everything it ran is modelled),
            e.g. recurrent layers' cuDNN buffers, several streams, workspaces extrapolated to the arch.
    """

    def __init__(self, session: Session, cap_bytes: int | None, alloc_conf: str, trace_seconds: float) -> None:
        a = session.allocator
        self._allocator = a
        self._new_allocator = session.new_allocator
        self.device = session.device
        self.arch = session.arch
        self.cap_bytes = cap_bytes
        self.alloc_conf = alloc_conf
        self.context_bytes: int = a.context_bytes
        self.events: list[Event] = session.events
        self.phases: list[tuple[int, str]] = session.phase_marks
        self.stats: dict[str, int] = dict(a.memory_stats())
        self.peak_allocated_bytes: int = a.max_memory_allocated()
        self.peak_reserved_bytes: int = a.max_memory_reserved()
        self.oom = OutOfMemory(**session.oom) if session.oom else None
        self.fits: bool = self.oom is None
        self.trace_seconds = trace_seconds
        self.notes: list[str] = list(session.notes)
        for e in self.events:  # one category per allocation, its free included
            if e.action == "alloc":
                e.category = _category(e)
            elif e.action == "free":
                e.category = self.events[e.alloc_index].category

    # ---- views

    def timeline(self) -> list[dict[str, Any]]:
        """One dict per event: action, nbytes, category, op, module, line, phase, allocated/reserved after."""
        return [e.as_dict() for e in self.events]

    def breakdown_over_time(self) -> list[dict[str, int]]:
        """Bytes live per category after each event (requested sizes, as ``requested_bytes`` counts)."""
        live = dict.fromkeys(CATEGORIES, 0)
        out = []
        for e in self.events:
            live[e.category] += e.nbytes if e.action == "alloc" else -e.nbytes  # empty_cache: 0 bytes
            out.append(dict(live))
        return out

    @property
    def peak_event_index(self) -> int:
        """The event after which allocated bytes peaked (the first such)."""
        best, index = -1, 0
        for i, e in enumerate(self.events):
            if e.allocated_bytes > best:
                best, index = e.allocated_bytes, i
        return index

    def breakdown(self, at: int | None = None) -> dict[str, int]:
        """Bytes live per category after event ``at`` (default: at the peak of allocated bytes)."""
        at = self.peak_event_index if at is None else at
        live = dict.fromkeys(CATEGORIES, 0)
        for e in self.events[:at + 1]:
            live[e.category] += e.nbytes if e.action == "alloc" else -e.nbytes
        return live

    def snapshot(self, at: int | None = None) -> dict[str, Any]:
        """The simulated allocator's state in ``torch.cuda.memory._snapshot()`` form (segments and the
        device trace) at the end, or after event ``at`` (the events replayed through a fresh allocator
        with the same capacity, cap and config: the simulator is deterministic, so the segments are the
        prediction's). Open it with memviz's SnapshotViewer, ``what_if``, or ``torch.cuda._memory_viz``.

        Raises:
            IndexError: ``at`` is not an event index.
        """
        if at is None:
            return self._allocator.snapshot()
        if not -len(self.events) <= at < len(self.events):
            raise IndexError(f"event index {at} out of range: the prediction has {len(self.events)} events")
        a = self._new_allocator()
        ptrs: dict[int, int] = {}
        for i, e in enumerate(self.events[:at % len(self.events) + 1]):
            if e.action == "alloc":
                ptrs[i] = a.malloc(e.nbytes)
            elif e.action == "free":
                a.free(ptrs.pop(e.alloc_index))
            else:
                a.empty_cache()
        return a.snapshot()

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

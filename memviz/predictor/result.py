"""What :func:`memviz.predict` returns: peaks, fits / OOM, the log, the breakdown, the snapshot."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from memviz.sim import CachingAllocator, replay
from memviz.units import format_bytes

from .distributed import OutsideAllocator, outside_allocator
from .events import CATEGORIES, AllocatorCall, as_ops
from .gpus import GpuArch

__all__ = ["OutOfMemory", "Prediction", "RankPredictions"]


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
            e.g. recurrent layers' cuDNN buffers, record_stream's timing, rules measured on another architecture.
        world_size / rank: the job and the rank this prediction played (None for a single-GPU program).
        outside: what the rank's process holds outside the allocator (the CUDA context and, for a job of several
            ranks, NCCL's buffers): an estimate, labelled with its basis, never in the peaks above
            (:class:`memviz.predictor.distributed.OutsideAllocator`).
    """

    def __init__(self, *, calls: tuple[AllocatorCall, ...], phases: tuple[tuple[int, str], ...],
                 allocator: CachingAllocator, new_allocator: Callable[[], CachingAllocator], device: Any,
                 arch: GpuArch, cap_bytes: int | None, alloc_conf: str, oom: OutOfMemory | None,
                 notes: tuple[str, ...], trace_seconds: float, world_size: int | None = None,
                 rank: int | None = None) -> None:
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
        self.world_size = world_size
        self.rank = rank
        self.outside: OutsideAllocator = outside_allocator(allocator.context_bytes, world_size or 1)
        self.streams: tuple[int, ...] = tuple(sorted({e.stream for e in calls if e.action == "alloc"}))

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
        as_rank = f"rank {self.rank} of {self.world_size} on " if self.world_size is not None else ""
        lines = [f"{as_rank}{self.device}{' cap ' + format_bytes(self.cap_bytes) if self.cap_bytes else ''}"
                 f"{' ' + self.alloc_conf if self.alloc_conf else ''}: "
                 + ("fits" if self.fits else "OUT OF MEMORY"),
                 f"peak allocated {format_bytes(self.peak_allocated_bytes)}, "
                 f"peak reserved {format_bytes(self.peak_reserved_bytes)}"]
        if self.world_size is not None:
            lines.append(f"outside the allocator (estimate): CUDA context {format_bytes(self.outside.context_bytes)}"
                         f", NCCL {format_bytes(self.outside.nccl_bytes)} ({self.outside.basis})")
        if self.oom:
            lines.append(f"OOM: {self.oom}")
        lines += [f"not modelled: {note}" for note in self.notes]
        lines.append("at the peak: " + ", ".join(f"{k} {format_bytes(v)}" for k, v in self.breakdown().items() if v))
        return "\n".join(lines)

    def __repr__(self) -> str:
        verdict = "fits" if self.fits else "OOM"
        as_rank = f" rank {self.rank}/{self.world_size}" if self.world_size is not None else ""
        return (f"<Prediction{as_rank} {verdict}: peak allocated {format_bytes(self.peak_allocated_bytes)}, "
                f"reserved {format_bytes(self.peak_reserved_bytes)} on {self.device.name}>")


class RankPredictions(Mapping[int, Prediction]):
    """One :class:`Prediction` per rank of a distributed job (``memviz.predict(..., world_size=N, rank="all")``).

    A mapping rank → prediction. Ranks differ where they hold different shards (FSDP2's uneven shards: a dimension
    the world size does not divide leaves the last ranks fewer rows, and their optimizer state follows).

    Attributes:
        world_size: the job's number of ranks.
        fits: every rank fits.
        peak_allocated_bytes / peak_reserved_bytes: the largest rank's peaks.
        worst_rank: the rank with the highest peak reserved (the first such).
    """

    def __init__(self, world_size: int, by_rank: dict[int, Prediction]) -> None:
        self.world_size = world_size
        self._by_rank = dict(by_rank)
        self.fits: bool = all(p.fits for p in by_rank.values())
        self.worst_rank: int = max(by_rank, key=lambda r: (by_rank[r].peak_reserved_bytes, -r))
        self.peak_allocated_bytes: int = max(p.peak_allocated_bytes for p in by_rank.values())
        self.peak_reserved_bytes: int = by_rank[self.worst_rank].peak_reserved_bytes

    def __getitem__(self, rank: int) -> Prediction:
        return self._by_rank[rank]

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_rank)

    def __len__(self) -> int:
        return len(self._by_rank)

    def groups(self) -> list[list[int]]:
        """Ranks whose predictions agree (the same peaks and fit), in rank order."""
        seen: dict[tuple[int, int, bool], list[int]] = {}
        for rank, p in self._by_rank.items():
            seen.setdefault((p.peak_allocated_bytes, p.peak_reserved_bytes, p.fits), []).append(rank)
        return list(seen.values())

    def table(self) -> list[dict[str, Any]]:
        """One row per rank: rank, fits, peak allocated / reserved bytes, the estimate outside the allocator."""
        return [{"rank": r, "fits": p.fits, "peak_allocated_bytes": p.peak_allocated_bytes,
                 "peak_reserved_bytes": p.peak_reserved_bytes, "outside_allocator_bytes": p.outside.total_bytes}
                for r, p in self._by_rank.items()]

    def summary(self) -> str:
        """One line per group of ranks that agree."""
        lines = [f"{self.world_size} ranks: " + ("every rank fits" if self.fits else "some rank runs OUT OF MEMORY")]
        for group in self.groups():
            p = self._by_rank[group[0]]
            names = f"rank {group[0]}" if len(group) == 1 else f"ranks {', '.join(map(str, group))}"
            lines.append(f"{names}: {'fits' if p.fits else 'OOM'}, peak allocated "
                         f"{format_bytes(p.peak_allocated_bytes)}, peak reserved {format_bytes(p.peak_reserved_bytes)}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"<RankPredictions {self.world_size} ranks, {'fit' if self.fits else 'OOM'}: worst rank "
                f"{self.worst_rank}, peak reserved {format_bytes(self.peak_reserved_bytes)}>")

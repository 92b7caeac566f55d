"""What the lab records: one :class:`Event` per action, with the allocator's stats before and after."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from memviz.fragmentation import Fragmentation
from memviz.shapes import Request
from memviz.units import format_bytes

__all__ = ["LAB_ACTIONS", "Event", "OOMRecord"]

LAB_ACTIONS = ("allocate", "free", "gc", "empty_cache", "reset_peak", "reset_stats", "observe", "new_stream",
               "record_stream", "queue_work", "synchronize", "new_pool", "release_pool", "capture", "end_capture",
               "replay", "delete_graph")
"""Every ``Event.action``; ``"observe"`` marks memory that changed outside the lab (plain notebook code); the
actions from ``"new_stream"`` on are the streams, pools and graphs of :mod:`memviz.lab_streams`."""


@dataclass(frozen=True)
class OOMRecord:
    """An allocation that ran out of memory, kept as data (no exception, traceback or frame is kept).

    Attributes:
        message: the allocator's error text (``str(torch.cuda.OutOfMemoryError)``).
        request: the request that failed.
        succeeded: how many tensors of the same call were allocated before it failed.
        fragmentation: the cache right after the failure (the allocator had already released every
            wholly free segment and retried).
        op_index: position of the failed request in the lab's op log (for what-if replays).
    """

    message: str
    request: Request
    succeeded: int
    fragmentation: Fragmentation
    op_index: int

    @property
    def breakdown(self) -> str:
        """The message's device-independent part: "X is allocated by PyTorch, and Y is reserved by PyTorch
        but unallocated" (the rest names the device and its free memory, which differ between GPUs)."""
        start = self.message.find("Of the allocated memory ")
        end = self.message.find(" If reserved", start)
        if start < 0 or end < 0:
            return self.message
        return self.message[start + len("Of the allocated memory ") : end]


@dataclass(frozen=True)
class Event:
    """One lab action.

    Attributes:
        index: position in ``lab.events`` (0-based).
        time_s: seconds since the lab started.
        action: one of :data:`LAB_ACTIONS`.
        ok: False when an allocation ran out of memory (see ``oom``).
        names: tensors allocated or freed.
        nbytes: bytes requested by the tensors allocated, or held by the tensors freed.
        detail: one line for the event log, with the size arithmetic for allocations.
        stats_before / stats_after: ``memory_stats()`` around the action.
        oom: the failure, when ``ok`` is False.
    """

    index: int
    time_s: float = field(repr=False)
    action: str
    ok: bool
    names: tuple[str, ...]
    nbytes: int
    detail: str
    stats_before: Mapping[str, int] = field(repr=False)
    stats_after: Mapping[str, int] = field(repr=False)
    oom: OOMRecord | None = field(default=None, repr=False)

    @property
    def allocated_bytes(self) -> int:
        """``memory_allocated()`` after the action."""
        return self.stats_after.get("allocated_bytes.all.current", 0)

    @property
    def reserved_bytes(self) -> int:
        """``memory_reserved()`` after the action."""
        return self.stats_after.get("reserved_bytes.all.current", 0)

    @property
    def active_bytes(self) -> int:
        """``active_bytes.all.current`` after the action."""
        return self.stats_after.get("active_bytes.all.current", 0)

    def delta(self, key: str) -> int:
        """How much stat ``key`` changed in this action."""
        return self.stats_after.get(key, 0) - self.stats_before.get(key, 0)

    def _repr_pretty_(self, printer, cycle: bool) -> None:  # IPython shows the readable line
        printer.text(str(self))

    def __str__(self) -> str:
        d_alloc = format_bytes(self.delta("allocated_bytes.all.current"))
        d_res = format_bytes(self.delta("reserved_bytes.all.current"))
        status = "" if self.ok else "OOM! "
        return (
            f"#{self.index} {self.action}: {status}{self.detail}  "
            f"[allocated {format_bytes(self.allocated_bytes)} ({d_alloc}), "
            f"reserved {format_bytes(self.reserved_bytes)} ({d_res})]"
        )

"""Why an allocation ran out of memory, from the state the lab recorded, and which config would have fit it.

The what-if part replays the lab's allocator ops (its own allocations, frees and empty_cache calls, in
order) through the simulator under other ``PYTORCH_CUDA_ALLOC_CONF`` settings, on the same device size
and cap, and reports whether the failed request would have succeeded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memviz.backends import fraction_for_cap
from memviz.events import Event
from memviz.sim import CachingAllocator, OutOfMemoryError
from memviz.units import format_bytes

if TYPE_CHECKING:
    from memviz.lab import Lab

__all__ = ["CANDIDATE_CONFIGS", "OOMExplanation", "WhatIf", "explain_oom", "replay_ops"]

CANDIDATE_CONFIGS = (
    "expandable_segments:True",
    "max_split_size_mb:64",
    "max_split_size_mb:128",
    "garbage_collection_threshold:0.6,max_split_size_mb:128",
    "roundup_power2_divisions:4",
)
"""The configs :func:`explain_oom` tries by default: the four non-default configs recorded on a real H200
(golden traces), and ``max_split_size_mb:128`` alone (recorded in the training workload)."""


@dataclass(frozen=True)
class WhatIf:
    """One replay of the lab's ops under ``alloc_conf``.

    Attributes:
        alloc_conf: the settings replayed.
        fits: the failed request succeeds under these settings.
        ooms: allocations that failed in the replay (the last op included).
        peak_reserved_bytes: ``reserved_bytes.all.peak`` of the replay.
    """

    alloc_conf: str
    fits: bool
    ooms: int
    peak_reserved_bytes: int


@dataclass(frozen=True)
class OOMExplanation:
    """An OOM, explained. All sizes in bytes.

    Attributes:
        message: the allocator's own error text.
        request_bytes: what the tensor asked for.
        pool: ``"small"`` (requests up to 1 MiB) or ``"large"``.
        largest_free_bytes: the largest free block in that pool after the failure.
        reserved_unallocated_bytes: cached but unallocated ("reserved by PyTorch but unallocated").
        releasable_bytes: what ``empty_cache()`` could still release (the allocator already released
            every wholly free segment before raising, so this is usually 0).
        headroom_bytes: what the cap (or device) still allowed to reserve.
        replay_reproduces: replaying the lab's ops under its own config fails too (False when memory
            that the lab does not know about, such as plain-code tensors, took part).
        what_ifs: the replays under other configs.
    """

    message: str
    request_bytes: int
    pool: str
    largest_free_bytes: int
    reserved_unallocated_bytes: int
    releasable_bytes: int
    headroom_bytes: int
    replay_reproduces: bool
    what_ifs: tuple[WhatIf, ...]

    @property
    def fragmented(self) -> bool:
        """True when the cache held more free bytes than the request, just not in one usable place."""
        return self.reserved_unallocated_bytes >= self.request_bytes

    def __str__(self) -> str:
        f = format_bytes
        lines = [f"Asked for {f(self.request_bytes)} ({self.pool} pool)."]
        if self.fragmented:
            lines.append(
                f"The cache held {f(self.reserved_unallocated_bytes)} reserved but unallocated — more than the "
                f"request — yet its largest free {self.pool}-pool block was {f(self.largest_free_bytes)}: "
                "that memory is fragmented."
            )
        else:
            lines.append(
                f"Only {f(self.reserved_unallocated_bytes)} of the cache was unallocated: the tensors alive "
                "simply take the memory."
            )
        lines.append(f"The cap allowed {f(self.headroom_bytes)} more to be reserved.")
        lines.append(
            f"empty_cache() could release {f(self.releasable_bytes)} now: the allocator already released "
            "every wholly free segment and retried before raising."
        )
        if not self.replay_reproduces:
            lines.append("(The simulator's replay of the lab's ops does not fail: memory outside the lab took part.)")
        fixes = [w.alloc_conf for w in self.what_ifs if w.fits]
        tried = ", ".join(w.alloc_conf for w in self.what_ifs)
        if fixes:
            lines.append("Would have fit under: " + "; ".join(fixes) + ".")
        elif self.what_ifs:
            lines.append(f"None of the configs tried would have fit it ({tried}): free or shrink tensors instead.")
        return "\n".join(lines)


def replay_ops(
    ops: Sequence[tuple], total_memory_bytes: int, memory_fraction: float | None, alloc_conf: str
) -> tuple[CachingAllocator, int, bool]:
    """Replay lab ops through a fresh simulator.

    Returns:
        ``(allocator, ooms, last_ok)``: the allocator after the replay, how many mallocs failed, and
        whether the last malloc succeeded.
    """
    sim = CachingAllocator(total_memory_bytes, memory_fraction=memory_fraction, alloc_conf=alloc_conf)
    live: dict[int, int] = {}
    ooms = 0
    last_ok = True
    for op in ops:
        if op[0] == "malloc":
            try:
                address = sim.malloc(op[2])
            except OutOfMemoryError:
                ooms += 1
                last_ok = False
                continue
            last_ok = True
            if op[1] is not None:
                live[op[1]] = address
        elif op[0] == "free":
            address = live.pop(op[1], None)
            if address is not None:
                sim.free(address)
        else:
            sim.empty_cache()
    return sim, ooms, last_ok


def explain_oom(lab: Lab, event: Event, configs: Sequence[str] | None = None) -> OOMExplanation:
    """Explain the OOM of ``event`` and try ``configs`` (default :data:`CANDIDATE_CONFIGS`) in the simulator."""
    record = event.oom
    if record is None:
        raise ValueError(f"event #{event.index} is not an OOM")
    backend = lab.backend
    frag = record.fragmentation
    pool = "small" if record.request.nbytes <= (1 << 20) else "large"
    stats = event.stats_after
    reserved = stats.get("reserved_bytes.all.current", 0)
    limit = backend.cap_bytes if backend.cap_bytes is not None else backend.total_memory_bytes
    fraction = fraction_for_cap(backend.cap_bytes, backend.total_memory_bytes)
    ops = lab.ops[: record.op_index + 1]
    _, _, own_ok = replay_ops(ops, backend.total_memory_bytes, fraction, backend.alloc_conf)
    what_ifs = []
    for conf in CANDIDATE_CONFIGS if configs is None else configs:
        sim, ooms, ok = replay_ops(ops, backend.total_memory_bytes, fraction, conf)
        what_ifs.append(WhatIf(conf, ok, ooms, sim.memory_stats()["reserved_bytes.all.peak"]))
    return OOMExplanation(
        message=record.message,
        request_bytes=record.request.nbytes,
        pool=pool,
        largest_free_bytes=frag.largest_free_small_bytes if pool == "small" else frag.largest_free_large_bytes,
        reserved_unallocated_bytes=frag.reserved_unallocated_bytes,
        releasable_bytes=frag.releasable_bytes,
        headroom_bytes=max(0, limit - reserved),
        replay_reproduces=not own_ok,
        what_ifs=tuple(what_ifs),
    )

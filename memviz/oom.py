"""Why an allocation ran out of memory, from the state the lab recorded, and which config would have fit it.

The what-if part replays the lab's allocator ops (its own allocations, frees and empty_cache calls, in
order) through the simulator under other ``PYTORCH_CUDA_ALLOC_CONF`` settings, on the same device size
and cap, and reports whether the failed request would have succeeded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memviz.errors import InputError, InputTypeError
from memviz.events import Event
from memviz.sim import CANDIDATE_CONFIGS, CachingAllocator, Op, ReplayOutcome, fraction_for_cap, replay
from memviz.sim.constants import SMALL_SIZE
from memviz.units import format_bytes

__all__ = ["CANDIDATE_CONFIGS", "OOMExplanation", "WhatIf", "explain_oom"]


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


def _replay(ops: Sequence[Op], total_memory_bytes: int, fraction: float | None, alloc_conf: str
            ) -> tuple[CachingAllocator, ReplayOutcome]:
    """Replay ``ops`` through a fresh simulator of that size, cap and config."""
    sim = CachingAllocator(total_memory_bytes, memory_fraction=fraction, alloc_conf=alloc_conf)
    return sim, replay(ops, sim)


def explain_oom(event: Event, ops: Sequence[Op], *, total_memory_bytes: int, cap_bytes: int | None,
                alloc_conf: str, configs: Sequence[str] | None = None) -> OOMExplanation:
    """Explain the OOM of ``event`` and try ``configs`` (default :data:`CANDIDATE_CONFIGS`) in the simulator.

    Args:
        event: the lab's event whose allocation ran out of memory.
        ops: the lab's allocator ops (``Lab.ops``); those up to the failed request are replayed.
        total_memory_bytes, cap_bytes, alloc_conf: the device, cap (None: none) and config the lab ran on.
        configs: ``PYTORCH_CUDA_ALLOC_CONF`` strings to try instead (default :data:`CANDIDATE_CONFIGS`).

    Raises:
        InputError: ``event`` is not an OOM.
    """
    record = event.oom
    if record is None:
        raise InputError(f"event #{event.index} ({event.action}) is not an OOM: pass an event whose .oom is set")
    if isinstance(configs, str):
        raise InputTypeError(f"configs must be a list of PYTORCH_CUDA_ALLOC_CONF strings, not the string "
                             f"{configs!r}: wrap it, configs=[{configs!r}]")
    frag = record.fragmentation
    pool = "small" if record.request.nbytes <= SMALL_SIZE else "large"
    stats = event.stats_after
    reserved = stats.get("reserved_bytes.all.current", 0)
    limit = cap_bytes if cap_bytes is not None else total_memory_bytes
    fraction = fraction_for_cap(cap_bytes, total_memory_bytes)
    ops = ops[: record.op_index + 1]
    _, own = _replay(ops, total_memory_bytes, fraction, alloc_conf)
    what_ifs = []
    for conf in CANDIDATE_CONFIGS if configs is None else configs:
        sim, outcome = _replay(ops, total_memory_bytes, fraction, conf)
        what_ifs.append(WhatIf(conf, outcome.last_ok, outcome.ooms, sim.max_memory_reserved()))
    return OOMExplanation(
        message=record.message,
        request_bytes=record.request.nbytes,
        pool=pool,
        largest_free_bytes=frag.largest_free_small_bytes if pool == "small" else frag.largest_free_large_bytes,
        reserved_unallocated_bytes=frag.reserved_unallocated_bytes,
        releasable_bytes=frag.releasable_bytes,
        headroom_bytes=max(0, limit - reserved),
        replay_reproduces=not own.last_ok,
        what_ifs=tuple(what_ifs),
    )

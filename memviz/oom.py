"""Why an allocation ran out of memory, from the state the lab recorded, and which config would have fit it.

The what-if part replays the lab's allocator ops (``Lab.ops``: its allocations, frees, ``empty_cache`` calls,
private pools, captures and frees that waited on other streams, in order) through the simulator under other
``PYTORCH_CUDA_ALLOC_CONF`` settings, on the same device size and cap, and reports whether the failed request
would have succeeded. It first replays them under the lab's own settings: only when that replay runs out of
memory at the same request with the lab's own reserved and allocated bytes do the what-ifs mean something;
otherwise (memory the log does not hold took part: tensors made outside the lab, another program on the GPU, a
cap changed since) the explanation says the lab is not replayable, and why, and tries no config.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from memviz.errors import InputError, InputTypeError
from memviz.events import Event
from memviz.sim import CANDIDATE_CONFIGS, CachingAllocator, Op, ReplayOutcome, fraction_for_cap, replay
from memviz.sim.constants import SMALL_SIZE
from memviz.sim.replay import END_POOL, RELEASE_POOL
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
        failure: where torch's own allocator fails under these settings before the request (a CUDA error, an
            internal assertion, a pool it deleted with blocks in it), else None.
    """

    alloc_conf: str
    fits: bool
    ooms: int
    peak_reserved_bytes: int
    failure: str | None = None


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
        replay_reproduces: replaying the lab's ops under its own config fails at the same request with the
            lab's own reserved and allocated bytes; when not, ``what_ifs`` is empty and ``not_replayable`` says why.
        what_ifs: the replays under other configs.
        not_replayable: why the lab's ops do not reproduce it (None when they do).
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
    not_replayable: str | None = None

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
        if self.not_replayable is not None:
            lines.append(f"No what-if: the lab cannot be replayed exactly ({self.not_replayable}).")
            return "\n".join(lines)
        failed = [f"{w.alloc_conf}: {w.failure}" for w in self.what_ifs if w.failure is not None]
        if failed:
            lines.append("torch's allocator itself fails earlier under " + "; ".join(failed) + ".")
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
    ops = _up_to(ops, record.op_index)
    sim, own = _replay(ops, total_memory_bytes, fraction, alloc_conf)
    why = _differs(sim, own, stats, alloc_conf)
    what_ifs = []
    for conf in (CANDIDATE_CONFIGS if configs is None else configs) if why is None else ():
        sim, outcome = _replay(ops, total_memory_bytes, fraction, conf)
        what_ifs.append(WhatIf(conf, outcome.last_ok, outcome.ooms, sim.max_memory_reserved(), outcome.failure))
    return OOMExplanation(
        message=record.message,
        request_bytes=record.request.nbytes,
        pool=pool,
        largest_free_bytes=frag.largest_free_small_bytes if pool == "small" else frag.largest_free_large_bytes,
        reserved_unallocated_bytes=frag.reserved_unallocated_bytes,
        releasable_bytes=frag.releasable_bytes,
        headroom_bytes=max(0, limit - reserved),
        replay_reproduces=why is None,
        what_ifs=tuple(what_ifs),
        not_replayable=why,
    )


def _up_to(ops: Sequence[Op], index: int) -> list[Op]:
    """The ops up to the failed request at ``index``, and the ``use_mem_pool`` exit right after it (its
    ``end_allocate_to_pool`` and ``release_pool``), which the lab's numbers after the failure include."""
    end = index + 1
    while end < len(ops) and ops[end].kind in (END_POOL, RELEASE_POOL):
        end += 1
    return list(ops[:end])


def _differs(sim: CachingAllocator, own: ReplayOutcome, stats: Mapping[str, int], alloc_conf: str) -> str | None:
    """Why replaying the lab's ops under its own settings is not the lab (None: it is)."""
    conf = alloc_conf or "default"
    if own.failure is not None:
        return f"under its own settings ({conf}) the replay stops where torch's allocator fails: {own.failure}"
    got = (sim.memory_reserved(), sim.memory_allocated())
    want = (stats.get("reserved_bytes.all.current", 0), stats.get("allocated_bytes.all.current", 0))
    if own.last_ok or got != want:
        ran = "serves the request" if own.last_ok else "runs out of memory there too"
        return (f"the replay of its ops under its own settings ({conf}) {ran} with {format_bytes(got[0])} reserved "
                f"and {format_bytes(got[1])} allocated, where the lab had {format_bytes(want[0])} and "
                f"{format_bytes(want[1])}: memory its log does not hold took part (tensors made outside the lab, "
                "another program or lab on this GPU, a cap changed since)")
    return None

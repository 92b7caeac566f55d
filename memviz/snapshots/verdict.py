"""Whether a recording can be replayed exactly, and if not, why: the evidence behind a fidelity check.

:func:`~memviz.snapshots.check_fidelity` replays the recorded requests under the recorded config and compares
them with the recording. Where they differ, every what-if of the recording would be built on a wrong replay, so
:func:`verdict` names the first difference and what the recording shows about its cause, in this order:

1. **Settings changed at run time.** Expandable-segment maps under settings without expandable segments (or
   ``cudaMalloc`` segments under settings with them): ``_set_allocator_settings`` was called, and no snapshot
   shows when.
2. **An out-of-memory error the replay did not have** (or the other way round, or retries the recording shows no
   need for): the run was capped, or its GPU was shared, or the device given to the replay is not the recording's
   (one of 16 TiB has address space for three expandable segments).
3. **A pool no snapshot names.** torch's trace entries carry no pool; only a snapshot's segments do. A
   ``MemPool`` or a CUDA graph's pool that held no segment when the only snapshot was taken (deleted, or emptied,
   by then) leaves segments whose pool the replay had to guess (:attr:`~.history_pools.PoolAssignment.guessed`).
   Where the allocator's own rules show that some of them lay in such a pool
   (:attr:`~.history_pools.PoolAssignment.conflicts`: a new segment although a segment of the same pool had a
   free block for it, a release that freed one segment and kept another of the same pool entirely free), the
   recording cannot be replayed exactly, even when the replay under the recorded config happens to match: which
   of its segments shared that pool decides what other configs do. Else, when such a segment is where the replay
   first differs (the recording made a segment although the pool the replay assumed had a fitting free block,
   or served a request from memory that pool did not hold, or released other segments), the guess was wrong.
   The remedy: snapshots taken while the pool held its segments (``earlier_snapshots``).
4. Anything else: the first event where the replay differs.

All sizes are bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memviz.units import format_bytes

if TYPE_CHECKING:
    from .history import SnapshotHistory

__all__ = ["POOL_REMEDY", "Verdict", "verdict"]

POOL_REMEDY = ("pass snapshots taken while the pool was alive (SnapshotHistory(final, earlier_snapshots=[...]), each "
               "a torch.cuda.memory._snapshot() taken after the pool's allocations): their segments name its pool")
_LOST_POOL = ("a MemPool or a CUDA graph's pool that held no segment when the snapshot was taken (deleted or emptied "
              "by then), whose allocations the trace does not mark")
_REQUESTS = ("alloc", "free_completed", "oom")


@dataclass(frozen=True)
class Verdict:
    """Can the recording be replayed exactly?

    Attributes:
        replayable: the replay under the recorded config reproduced it (what-ifs of it can be trusted).
        cause: why not: ``"pools"``, ``"settings"``, ``"oom"`` or ``"differs"``; None when replayable.
        reason: one sentence: what differs first and what the recording shows about it (None when replayable).
        remedy: what would make it replayable (None when replayable).
        first_event: the first event where the replay differs (None when replayable, or only the end differs).
    """

    replayable: bool
    cause: str | None = None
    reason: str | None = None
    remedy: str | None = None
    first_event: int | None = None

    def describe(self) -> str:
        """``"cannot be replayed exactly: <reason>; <remedy>"``, or that it can."""
        if self.replayable:
            return "the recording can be replayed exactly: its replay under the recorded config reproduces it"
        return f"cannot be replayed exactly: {self.reason}; {self.remedy}"


def _request_text(e: dict[str, Any]) -> str:
    action = e.get("action")
    size = format_bytes(e.get("size", 0))
    if action == "alloc":
        return f"the {size} request on stream 0x{e.get('stream', 0):x}"
    if action == "oom":
        return f"the {size} request that ran out of memory on stream 0x{e.get('stream', 0):x}"
    return f"the free of a {size} block"


def _guessed_segments(history: SnapshotHistory, index: int, stream: int) -> int:
    """How many segments of ``stream`` live at event ``index`` have a pool no snapshot names."""
    pools, events = history.pools, history.events
    count = 0
    for lives in pools.ranges.values():
        for born, died, _ in lives:
            if born in pools.guessed and born <= index < died and events[born].get("stream", 0) == stream:
                count += 1
    return count


def _pool_evidence(history: SnapshotHistory, result: Any, first: int | None) -> str | None:
    """The reason when the first difference lies in a segment whose pool was guessed, else None."""
    events, tl, guessed = history.events, history.timeline, history.pools.guessed
    if not guessed:
        return None
    if first is None:  # only the end differs: the releases after the last request
        last = max((i for i, e in enumerate(events) if e.get("action") in _REQUESTS), default=-1)
        released = [k for k in range(last + 1, len(events)) if k in guessed]
        if not released:
            return None
        return (f"after the last request the recording released segments (event {released[0]:,} on) whose pool no "
                f"snapshot names, and the replay released others: {_LOST_POOL}")
    start = first
    while start > 0 and events[start - 1].get("action") not in _REQUESTS:
        start -= 1
    here = [k for k in range(start, first + 1) if k in guessed]
    e = events[first]
    stream = e.get("stream", 0)
    live = _guessed_segments(history, first, stream)
    if not here and not live:
        return None
    before = tl.reserved_bytes[start - 1] if start else tl.initial["reserved_bytes"]
    replay_before = result.reserved_bytes[start - 1] if start else before  # equal up to the first difference
    grew = tl.reserved_bytes[first] - before
    replay_grew = result.reserved_bytes[first] - replay_before
    if grew > replay_grew:
        what = (f"at event {first:,} the recording reserved {format_bytes(grew)} more for {_request_text(e)}, a new "
                "segment, although the pool the replay assumed had a fitting free block")
    elif grew < replay_grew:
        what = (f"at event {first:,} the recording served {_request_text(e)} from memory the pool the replay "
                "assumed did not hold")
    else:
        what = f"from event {first:,} ({_request_text(e)}) the replay's segments differ from the recording's"
    segments = f"{live} segment{'s' if live != 1 else ''}" if live else "segments"
    belong = "belongs" if live == 1 else "belong"
    return f"{what}; {segments} of stream 0x{stream:x} there {belong} to a pool no snapshot names: {_LOST_POOL}"


def _settings_evidence(history: SnapshotHistory, first: int | None) -> str | None:
    """The reason when the trace's segments contradict the settings in force (a run-time settings change)."""
    stop = len(history.events) if first is None else first + 1
    for k, e in enumerate(history.events[:stop]):
        action = e.get("action")
        if action in ("segment_map", "segment_alloc"):
            expandable = history.settings_at(k).expandable_segments
            if (action == "segment_map") != expandable:
                kind = "an expandable segment's map" if action == "segment_map" else "a cudaMalloc segment"
                return (f"event {k:,} is {kind}, but the snapshot's settings "
                        f"({history.settings_at(k).alloc_conf() or 'default'}) say otherwise: the allocator "
                        "settings changed at run time (torch.cuda.memory._set_allocator_settings)")
    return None


def _oom_evidence(history: SnapshotHistory, result: Any, first: int | None) -> str | None:
    """The reason when the recording ran out of memory where the replay did not (or the other way round)."""
    stop = len(history.events) if first is None else first + 1
    avoided = [i for i in result.recorded_ooms_avoided if i < stop]
    device = format_bytes(result.device_total_bytes)
    if avoided:
        i = avoided[0]
        return (f"the recording ran out of memory at event {i:,} ({_request_text(history.events[i])}) where the "
                f"replay, on a {device} device with no cap, did not: the run was capped "
                "(set_per_process_memory_fraction) or shared a fuller GPU")
    extra = [i for i in result.oom_event_indices if i < stop and history.events[i].get("action") != "oom"]
    if extra:
        return (f"the replay ran out of memory at event {extra[0]:,}, on a {device} device, where the recording "
                "did not")
    retries = result.allocator.memory_stats()["num_alloc_retries"]
    if retries and result.allowed_bytes is None and not history.timeline.oom_indices:
        return (f"the replay, on a {device} device, had to release its cache and retry {retries} allocation"
                f"{'s' if retries > 1 else ''} (out of memory, or of address space for expandable segments, each "
                "of which reserves 1 1/8 of the device): the recording shows no such shortage")
    return None


def verdict(history: SnapshotHistory, result: Any, *, exact: bool, first_event: int | None) -> Verdict:
    """The :class:`Verdict` on a replay of ``history`` under its recorded config.

    Args:
        history: the recording.
        result: the replay (a :class:`~memviz.snapshots.ReplayResult` with its timeline).
        exact: whether the fidelity check found every compared event and state equal.
        first_event: the first event that differed (None: only the final state did).
    """
    conflicts = history.pools.conflicts
    if exact and not conflicts:
        return Verdict(True)
    reason = _settings_evidence(history, first_event)
    if reason is not None:
        return Verdict(False, "settings", reason, "pass the snapshots taken before and after each "
                       "_set_allocator_settings call (earlier_snapshots)", first_event)
    if conflicts:
        event, finding = conflicts[0]
        more = f" (and {len(conflicts) - 1} more such finding{'s' if len(conflicts) > 2 else ''})" \
            if len(conflicts) > 1 else ""
        return Verdict(False, "pools", f"{finding}{more}: a pool no snapshot names held some of "
                       f"them, {_LOST_POOL}", POOL_REMEDY, event)
    reason = _oom_evidence(history, result, first_event)
    if reason is not None:
        return Verdict(False, "oom", reason, "give the cap it ran under (cap_bytes, or recorded_cap in "
                       "WhatIfTable) and the device's real size (device_total_bytes), or no size: the recording's "
                       "own is used", first_event)
    reason = _pool_evidence(history, result, first_event)
    if reason is not None:
        return Verdict(False, "pools", reason, POOL_REMEDY, first_event)
    where = "at the end" if first_event is None else f"from event {first_event:,} on"
    return Verdict(False, "differs", f"the replay under the recorded config differs from the recording {where}",
                   "check the settings and cap it ran under; a trace the simulator does not follow (another "
                   "allocator backend, several devices) cannot be replayed", first_event)

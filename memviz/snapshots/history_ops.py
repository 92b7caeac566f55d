"""A recorded trace as the allocator calls its program made: the ops a what-if or fidelity replay runs.

Every ``alloc`` becomes a ``malloc`` on its recorded stream, in its recorded pool (:mod:`.history_pools`):
allocations into a private pool run between ``begin_allocate_to_pool`` and ``end_allocate_to_pool`` of that
pool, as during a capture or ``use_mem_pool`` (the pool's first run makes it and leaves one user, its graph or
``MemPool``; each later run adds a user and releases it after, as ``use_mem_pool`` does). Keys are the recorded
addresses: a ``free_completed`` frees what the ``alloc`` at its address got (a free that waited on another
stream's events returns its block when it completed, as it did). A recorded ``oom`` becomes a probe: its
request, freed at once if it fits.

Segments released by the program's ``empty_cache()`` (or a ``MemPool``'s deletion) show as a run of
``segment_free`` / ``segment_unmap`` entries that no allocation follows; each run becomes an ``empty_cache``:
of one private pool when the run frees only that pool's segments, else of every pool. A private pool whose
segments are released that way had no user left by then (its graphs and ``MemPool`` deleted): its last user
is released just before, unless it is allocated into later. A run that an allocation's new segment (or an
``oom``) follows is that allocation's own retry or garbage collection when the replay runs under a cap
(``allowed_bytes``) the recorded reserved bytes would have exceeded; the replay's allocator then does it itself,
and the frees the retry completed are completed after the allocation (already done, if it retried too).

Settings changed at run time (``_set_allocator_settings``) show only in the snapshots taken before and after
(:attr:`~memviz.snapshots.SnapshotHistory.earlier`): when they differ, the replay starts under the first
snapshot's settings and changes them right after the snapshot that preceded the change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memviz.sim import Op
from memviz.sim.constants import MiB
from memviz.sim.pools import DEFAULT_POOL, PoolId
from memviz.sim.replay import (
    BEGIN_POOL,
    EMPTY_CACHE,
    END_POOL,
    FREE,
    FREE_COMPLETED,
    FREE_REQUESTED,
    MALLOC,
    PROBE,
    RELEASE_POOL,
    SET_SETTINGS,
)

if TYPE_CHECKING:
    from .history import SnapshotHistory
    from .settings import RecordedSettings

__all__ = ["compile_requests"]

_RELEASES = ("segment_free", "segment_unmap")
_QUIET = ("snapshot", "annotate")  # entries that change no memory
_NEW_SEGMENT = ("segment_alloc", "segment_map", "oom")


def compile_requests(history: SnapshotHistory, allowed_bytes: int | None = None) -> tuple[list[Op], list[int]]:
    """Return the ops to replay, in order, and the event index of each (-1: live at the start, or a pool call).

    Args:
        history: the recording.
        allowed_bytes: the memory cap the recording ran under, if any (default: None): tells an
            allocation's own release of cached segments from an ``empty_cache()`` (see the module docstring).

    Runtime complexity: O(n) for n events (plus :func:`~memviz.snapshots.history_pools.assign_pools`).
    """
    return _Compiler(history, allowed_bytes).run()


def _full_conf(settings: RecordedSettings) -> str:
    """``settings`` as a ``_set_allocator_settings`` string that names every option a call would otherwise keep
    (torch resets only max_split_size, roundup_power2_divisions and garbage_collection_threshold)."""
    explicit = [f"expandable_segments:{settings.expandable_segments}",
                f"large_segment_size_mb:{settings.large_segment_size // MiB}",
                f"max_non_split_rounding_mb:{settings.max_non_split_rounding_size // MiB}"]
    rest = [part for part in settings.alloc_conf().split(",") if part and not part.startswith(
        ("expandable_segments:", "large_segment_size_mb:", "max_non_split_rounding_mb:"))]
    return ",".join(explicit + rest)


class _Compiler:
    def __init__(self, history: SnapshotHistory, allowed_bytes: int | None) -> None:
        self.history = history
        self.events = history.events
        self.pools = history.pools
        self.allowed = allowed_bytes
        self.gc = history.settings.garbage_collection_threshold
        self.ops: list[Op] = []
        self.where: list[int] = []
        self.opened: PoolId | None = None  # the pool the next mallocs go to (None: the device's own)
        self.opened_first = False
        self.made: set[PoolId] = set()
        self.released: set[PoolId] = set()
        self.last_alloc: dict[PoolId, int] = {}
        for i, pool in self.pools.alloc_pool.items():
            if pool != DEFAULT_POOL and i > self.last_alloc.get(pool, -1):
                self.last_alloc[pool] = i

    def emit(self, op: Op, index: int) -> None:
        self.ops.append(op)
        self.where.append(index)

    def enter(self, pool: PoolId) -> None:
        """Route the next mallocs into ``pool``."""
        if pool == (self.opened or DEFAULT_POOL):
            return
        self.leave()
        if pool != DEFAULT_POOL:
            self.emit(Op(BEGIN_POOL, pool), -1)
            self.opened, self.opened_first = pool, pool not in self.made
            self.made.add(pool)

    def leave(self) -> None:
        if self.opened is not None:
            self.emit(Op(END_POOL, self.opened), -1)
            if not self.opened_first:
                self.emit(Op(RELEASE_POOL, self.opened), -1)
            self.opened = None

    def run(self) -> tuple[list[Op], list[int]]:
        history, events = self.history, self.events
        initial_pool = self.pools.initial_pool
        changes = [(at, _full_conf(settings)) for at, settings in history.settings_changes]
        if changes and changes[0][0] == 0:
            self.emit(Op(SET_SETTINGS, changes.pop(0)[1]), -1)
        for b in history.initial_blocks:
            self.enter(initial_pool.get(b.address, DEFAULT_POOL))
            self.emit(Op(MALLOC, b.address, b.requested_size, b.stream), -1)
        self.leave()
        alloc_pool = self.pools.alloc_pool
        waiting: set[int] = set()  # addresses freed but waiting on another stream's events
        after_malloc: list[int] = []  # frees a malloc's own retry completes: replayed after it
        n = len(events)
        i = 0
        while i < n:
            while changes and changes[0][0] <= i:
                self.leave()
                self.emit(Op(SET_SETTINGS, changes.pop(0)[1]), -1)
            e = events[i]
            action = e["action"]
            if action == "alloc":
                self.enter(alloc_pool.get(i, DEFAULT_POOL))
                self.emit(Op(MALLOC, e["addr"], e["size"], e.get("stream", 0)), i)
                for addr in after_malloc:
                    self.emit(Op(FREE_COMPLETED, addr), -1)
                after_malloc.clear()
            elif action == "free_requested":
                nxt = events[i + 1] if i + 1 < n else None
                if not (nxt is not None and nxt["action"] == "free_completed" and nxt.get("addr") == e["addr"]):
                    self.emit(Op(FREE_REQUESTED, e["addr"]), i)
                    waiting.add(e["addr"])
                # else completed at once: one free, at its free_completed
            elif action == "free_completed":
                if e["addr"] not in waiting:
                    self.emit(Op(FREE, e["addr"]), i)
                else:
                    waiting.discard(e["addr"])
                    if self._retry_follows(i):
                        after_malloc.append(e["addr"])
                    else:
                        self.emit(Op(FREE_COMPLETED, e["addr"]), i)
            elif action == "oom":
                self.leave()
                self.emit(Op(PROBE, None, e["size"], e.get("stream", 0)), i)
                for addr in after_malloc:
                    self.emit(Op(FREE_COMPLETED, addr), -1)
                after_malloc.clear()
            elif action in _RELEASES:
                end = self._run_end(i)
                inside = self._malloc_internal(i, end)
                for k in range(i, end + 1):
                    ek = events[k]
                    if ek["action"] == "free_completed" and ek["addr"] in waiting:
                        waiting.discard(ek["addr"])
                        if inside:
                            after_malloc.append(ek["addr"])
                        else:
                            self.emit(Op(FREE_COMPLETED, ek["addr"]), k)
                if not inside:
                    self._empty_cache(i, end)
                i = end + 1
                continue
            i += 1
        self.leave()
        return self.ops, self.where

    def _run_end(self, i: int) -> int:
        """The last release entry of the run starting at ``i`` (frees completed and quiet entries inside it)."""
        events, n = self.events, len(self.events)
        end = i
        k = i + 1
        while k < n and (events[k]["action"] in _RELEASES or events[k]["action"] in _QUIET
                         or events[k]["action"] == "free_completed"):
            if events[k]["action"] in _RELEASES:
                end = k
            k += 1
        return end

    def _next_memory_event(self, k: int) -> dict[str, Any] | None:
        events = self.events
        while k < len(events) and events[k]["action"] in _QUIET:
            k += 1
        return events[k] if k < len(events) else None

    def _malloc_internal(self, start: int, end: int) -> bool:
        """Whether the release run ``[start, end]`` is an allocation's own (retry, garbage collection)."""
        if self.allowed is None:
            return False
        nxt = self._next_memory_event(end + 1)
        if nxt is None or nxt["action"] not in _NEW_SEGMENT:
            return False
        if nxt["action"] == "oom":
            return True
        tl = self.history.timeline
        before = tl.reserved_bytes[start - 1] if start else tl.initial["reserved_bytes"]
        return before + nxt["size"] > self.allowed or (self.gc > 0 and before > self.gc * self.allowed)

    def _retry_follows(self, i: int) -> bool:
        """Whether the completed free at ``i`` opens an allocation's own release run (its synchronize)."""
        events = self.events
        k = i + 1
        while k < len(events) and (events[k]["action"] == "free_completed" or events[k]["action"] in _QUIET):
            k += 1
        return k < len(events) and events[k]["action"] in _RELEASES and self._malloc_internal(k, self._run_end(k))

    def _empty_cache(self, start: int, end: int) -> None:
        """Replay the release run ``[start, end]`` as the ``empty_cache`` calls that made it."""
        self.leave()
        segment_pool = self.pools.segment_pool
        runs: list[PoolId] = []  # the pools freed, in order, consecutive repeats merged
        for k in range(start, end + 1):
            if self.events[k]["action"] in _RELEASES:
                pool = segment_pool.get(k, DEFAULT_POOL)
                if not runs or runs[-1] != pool:
                    runs.append(pool)
        for pool in runs:
            if pool != DEFAULT_POOL and pool in self.made and pool not in self.released \
                    and self.last_alloc.get(pool, -1) < start:
                self.released.add(pool)
                self.emit(Op(RELEASE_POOL, pool), -1)
        if DEFAULT_POOL in runs:
            self.emit(Op(EMPTY_CACHE), end)
            return
        for k, pool in enumerate(runs):
            self.emit(Op(EMPTY_CACHE, pool), end if k == len(runs) - 1 else -1)

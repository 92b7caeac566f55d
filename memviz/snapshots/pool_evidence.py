"""What the allocator's own rules say about segments no snapshot names: which of them cannot share a pool.

A trace entry names no pool, but two rules of c10's CUDACachingAllocator hold whatever the pools were:

1. **A new segment means the pool had no block to give.** ``malloc`` calls ``alloc_block`` (a ``segment_alloc``,
   or ``segment_map`` under expandable segments) only after ``get_free_block`` found nothing in the request's
   pool: no free block on the request's stream, of its size class, of at least the rounded size and within
   ``max_split_size``'s oversize rules. A live segment that held such a block then was in another pool.
2. **A release frees all it can of each pool it releases.** ``release_cached_blocks`` (``empty_cache()``, an
   allocation's retry, a ``MemPool``'s deletion) frees every entirely free segment, and unmaps every free whole
   page of an expandable one, in each pool it releases. A segment entirely free (holding a free whole page) when
   a release starts and still there, unchanged, after it was in none of the pools whose segments that release
   freed or unmapped.

Rule 1 is not applied to a request whose own release came right before its new segment (the frees that release
completed came after ``get_free_block``), nor where expandable segments were turned off at run time; rule 2 not to
a release followed by a new segment under ``max_split_size`` or ``garbage_collection_threshold`` (there an
allocation releases some of one pool's segments, not all).

:class:`PoolEvidence` reads them while :func:`~.history_pools.assign_pools` follows the segments, and keeps each
finding as an :class:`Apart`: two groups of segment ids (the union-find ids of :mod:`.history_pools`) no member of
which shares a pool with a member of the other.
All sizes are bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from memviz.sim.constants import SIZE_MAX, SMALL_BUFFER, SMALL_SIZE
from memviz.units import format_bytes

from .state import INACTIVE, Segment, State

if TYPE_CHECKING:
    from .history import SnapshotHistory
    from .settings import RecordedSettings

__all__ = ["Apart", "PoolEvidence"]

_RELEASES = ("segment_free", "segment_unmap")
_CREATES = ("segment_alloc", "segment_map")
_QUIET = ("snapshot", "annotate")
_REQUESTS = ("alloc", "free_requested", "free_completed", "oom")


class Apart(NamedTuple):
    """Two groups of segments that lay in different pools, and why.

    Attributes:
        first / second: segment ids (:mod:`.history_pools`'s, before union) of the two groups.
        event: the trace entry the rule was read at.
        why: one sentence with ``{sid}`` where a segment is named (:mod:`.history_pools` says where it was made),
            e.g. "at event 8 the 100.00 KiB request on stream 0x0 made a new segment although the segment {0} had
            a free 1.70 MiB block that it would have taken from the same pool".
    """

    first: frozenset[int]
    second: frozenset[int]
    event: int
    why: str


def _fits(block_size: int, rounded: int, settings: RecordedSettings) -> bool:
    """Whether ``get_free_block`` would hand out a free block of ``block_size`` for a rounded request (the
    smallest fitting block of a pool is the one it looks at; a larger one of the same segment passes whenever
    that one does)."""
    if block_size < rounded:
        return False
    limit = settings.max_split_size
    if limit == SIZE_MAX:
        return True
    if rounded < limit:
        return block_size < limit
    return block_size < rounded + settings.max_non_split_rounding_size


def _releasable(seg: Segment, settings: RecordedSettings) -> bool:
    """Whether a release of ``seg``'s pool would free or unmap some of it: entirely free, or (expandable)
    holding a free block that covers a whole page."""
    if not seg.expandable:
        return len(seg.blocks) == 1 and seg.blocks[0].state == INACTIVE
    page = SMALL_BUFFER if seg.kind == "small" else settings.large_segment_size
    for b in seg.blocks:
        if b.state == INACTIVE:
            first = seg.addr + -(-(b.addr - seg.addr) // page) * page
            if first + page <= b.addr + b.size:
                return True
    return False


class PoolEvidence:
    """Reads the two rules (module docstring) while :func:`~.history_pools.assign_pools` plays the events.

    ``assign_pools`` calls :meth:`before` with each event (its segment ranges as they were before it), then
    :meth:`after` (ranges updated); ``sid_of(address)`` gives the id of the segment or mapped range holding an
    address at that moment (None: none). :attr:`found` holds every finding, whatever the pools named later.

    Runtime complexity: O(n) events plus, at each new segment and each release, O(s·b) for the s live segments
    of b blocks.
    """

    def __init__(self, history: SnapshotHistory) -> None:
        self.history = history
        self.events = history.events
        self.st = State.thaw(history._initial, history.settings_at(0))
        self.found: list[Apart] = []
        self._after_release = False
        self._run: _Run | None = None
        self._pending: tuple[int, int, list[tuple[int, int]]] | None = None  # (first new segment, request, had)

    def before(self, i: int, e: Mapping[str, Any], sid_of: Callable[[int], int | None]) -> None:
        """Read event ``i`` against the state before it."""
        action = e["action"]
        events = self.events
        st = self.st
        if action in _CREATES and (i == 0 or events[i - 1]["action"] not in _CREATES) and not self._after_release:
            self._pending = self._had(i, sid_of)
        if action in _RELEASES:
            self._after_release = True
            run = self._run
            if run is None:
                run = self._run = _Run(i, {sid for seg in st.segs.values() if _releasable(seg, st.settings)
                                           and (sid := sid_of(seg.addr)) is not None})
            sid = sid_of(e["addr"])
            if sid is not None:
                run.released.add(sid)
        elif action in _CREATES or (action in _REQUESTS and action != "free_completed"):
            self._after_release = False
        elif action == "free_completed" and self._run is not None:
            sid = sid_of(e["addr"])
            if sid is not None:
                self._run.touched.add(sid)

    def after(self, i: int, e: Mapping[str, Any], sid_of: Callable[[int], int | None]) -> None:
        """Apply event ``i`` to the state; close a finding it completes."""
        self.history._apply(self.st, i, e)
        pending = self._pending
        if pending is not None and i == pending[1]:
            self._pending = None
            mine = sid_of(e["addr"])
            if mine is not None:
                self._new_segment(pending[0], e, mine, pending[2])
        run = self._run
        events = self.events
        if run is not None and (i + 1 == len(events) or events[i + 1]["action"] not in (
                *_RELEASES, *_QUIET, "free_completed")):
            self._run = None
            self._release(run, i, sid_of)

    def _had(self, i: int, sid_of: Callable[[int], int | None]) -> tuple[int, int, list[tuple[int, int]]] | None:
        """Rule 1 at the first new segment ``i`` of a request: the segments that had a block for it."""
        events = self.events
        j = i
        while j < len(events) and events[j]["action"] in (*_CREATES, *_QUIET):
            j += 1
        if j == len(events) or events[j]["action"] != "alloc":
            return None  # an OOM, or a trace cut short
        request = events[j]
        stream = request.get("stream", 0)
        settings = self.history.settings_at(j)
        rounded = settings.round_size(request["size"])
        kind = "small" if rounded <= SMALL_SIZE else "large"
        had = []
        for seg in self.st.segs.values():
            if seg.stream != stream or seg.kind != kind or (seg.expandable and not settings.expandable_segments):
                continue
            fitting = [b.size for b in seg.blocks if b.state == INACTIVE and _fits(b.size, rounded, settings)]
            if fitting and (sid := sid_of(seg.addr)) is not None:
                had.append((sid, max(fitting)))
        return (i, j, had) if had else None

    def _new_segment(self, i: int, request: Mapping[str, Any], mine: int, had: list[tuple[int, int]]) -> None:
        had = [(sid, size) for sid, size in had if sid != mine]
        if not had:
            return
        sid, size = had[0]
        more = f" (and {len(had) - 1} more)" if len(had) > 1 else ""
        why = (f"at event {i:,} the {format_bytes(request['size'])} request on stream 0x{request.get('stream', 0):x} "
               f"made a new segment although the segment {{{sid}}}{more} had a free {format_bytes(size)} block that "
               "it would have taken from the same pool")
        self.found.append(Apart(frozenset({mine}), frozenset(s for s, _ in had), i, why))

    def _release(self, run: _Run, end: int, sid_of: Callable[[int], int | None]) -> None:
        """Rule 2 at the end of a run of releases."""
        settings = self.st.settings
        if settings.max_split_size != SIZE_MAX or settings.garbage_collection_threshold > 0:
            nxt = next((e["action"] for e in self.events[end + 1:] if e["action"] not in _QUIET), None)
            if nxt in (*_CREATES, "oom"):
                return
        kept = set()
        for seg in self.st.segs.values():
            sid = sid_of(seg.addr)
            if sid is not None and sid in run.releasable and sid not in run.released \
                    and sid not in run.touched and _releasable(seg, settings):
                kept.add(sid)
        if not kept or not run.released:
            return
        why = (f"at event {run.start:,} a release of cached memory freed the segment {{{min(run.released)}}}"
               f"{_more(run.released)} but kept the segment {{{min(kept)}}}{_more(kept)}, entirely free, which it "
               "would have freed in the same pool")
        self.found.append(Apart(frozenset(run.released), frozenset(kept), run.start, why))


def _more(group: set[int]) -> str:
    return f" (and {len(group) - 1} more)" if len(group) > 1 else ""


class _Run:
    """A run of releases: where it started, the releasable segments then, what it released, what it touched."""

    __slots__ = ("releasable", "released", "start", "touched")

    def __init__(self, start: int, releasable: set[int]) -> None:
        self.start = start
        self.releasable = releasable
        self.released: set[int] = set()
        self.touched: set[int] = set()

"""Which private pool every segment of a recorded trace belonged to (CUDA graphs, ``MemPool``).

torch's trace entries name no pool; only a snapshot's ``segments`` do (``segment_pool_id``: ``(0, 0)`` the
device's own pools, ``(n, 0)`` a graph's pool, ``(0, n)`` a ``MemPool`` or ``graph_pool_handle()``).
:func:`assign_pools` follows every segment through the trace — a ``segment_alloc`` starts one, a
``segment_free`` ends it; an expandable segment's ``segment_map`` ranges that touch on one stream are one
segment — and names its pool from the segments of the final snapshot and of any earlier snapshot of the
same recording (a snapshot whose trace is a prefix of this one, e.g. one taken after each phase of a
program). A segment gone before every snapshot that was given has no recorded pool (:attr:`PoolAssignment.guessed`
lists the events in such segments):

- A CUDA graph's capture, where the recording's torch version registers the default generator at
  ``capture_begin`` (:func:`memviz.sim.graphs.registers_generator_at_capture`; up to torch 2.13): two 8-byte
  allocations in a row on a side stream, while no such pair is live, are the generator's seed and offset, in
  the device's own pool; the stream's allocations after them, until the pair is freed (the last graph
  deleted), went to the capture's pool: the private pool the snapshots name on that stream then, else a
  graph pool of their own (:attr:`PoolAssignment.captures`).
- Any other takes the first of these that the allocator's rules allow (:mod:`.pool_evidence`: a segment that had
  a free block for a request which made a new segment instead, or that a release of cached memory left entirely
  free beside segments it freed, was not in their pool): the pool of the nearest allocations on its stream
  (before and after its first one) that have one, when they agree; the device's own (``(0, 0)``); any other pool a
  snapshot names. Where the rules leave none of them, or keep apart two segments no snapshot names that nothing
  else separates, some segment lay in a pool no snapshot names: :attr:`PoolAssignment.conflicts` says where.

:attr:`PoolAssignment.inferred` counts the segments named either way; whether the guess holds, only a replay
can tell (:func:`memviz.snapshots.check_fidelity` says which recordings cannot be replayed, and why).
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from memviz.sim.graphs import GENERATOR_TENSOR_BYTES, registers_generator_at_capture
from memviz.sim.pools import DEFAULT_POOL, PoolId

from .load import load_snapshot
from .pool_evidence import Apart, PoolEvidence
from .settings import RecordedSettings, settings_from_snapshot

if TYPE_CHECKING:
    from .history import SnapshotHistory

__all__ = ["Capture", "EarlierSnapshot", "PoolAssignment", "assign_pools", "earlier_snapshots"]

_NEVER = 1 << 62  # the end of a segment still present at the end


class EarlierSnapshot(NamedTuple):
    """A snapshot taken earlier in the same recording: after ``events`` trace entries (its trace is that prefix).

    Attributes:
        events: how many entries its trace holds (its own ``snapshot`` entry is the next one).
        segments: its ``segments`` of the device.
        settings: the allocator options in force then (they change with ``_set_allocator_settings``).
    """

    events: int
    segments: list[dict[str, Any]]
    settings: RecordedSettings


class Capture(NamedTuple):
    """CUDA graph captures found by the default generator's registration (see the module docstring).

    Attributes:
        stream: the capture stream.
        generator_events: the two 8-byte allocations (the generator's seed and offset, in the device's pool).
        end: the event that freed them (the last graph deleted), or None if they live at the end.
        pool: the pool the stream's allocations in between were given.
        named: whether a snapshot names that pool (else it is one of its own, ``(n, 0)`` past every named one).
    """

    stream: int
    generator_events: tuple[int, int]
    end: int | None
    pool: PoolId
    named: bool


@dataclass
class PoolAssignment:
    """The pool of each allocation and segment event of a trace.

    Attributes:
        alloc_pool: event index of every ``alloc`` → the pool its block lies in.
        segment_pool: event index of every ``segment_alloc`` / ``segment_free`` / ``segment_map`` /
            ``segment_unmap`` → the pool of that segment.
        initial_pool: address of every block live before the first event → its pool.
        segments: segments followed (each ``segment_alloc``, each expandable segment, each present at the start).
        inferred: those whose pool no snapshot recorded (see the module docstring).
        ranges: start address → ``(first event, last event + 1, pool)`` of each segment (or expandable mapped
            range) that began there; -1: present at the start.
        guessed: the allocation and segment events in segments whose pool no snapshot recorded.
        captures: the captures the generator's registration showed (:class:`Capture`).
        by_neighbours: how many of the ``inferred`` segments took the pool of the allocations around them or the
            allocator's rules allowed (the rest the capture rule named).
        conflicts: where the allocator's rules show that some segment lay in a pool no snapshot names, as
            ``(event, sentence)``, in trace order (empty: none shown).
    """

    alloc_pool: dict[int, PoolId]
    segment_pool: dict[int, PoolId]
    initial_pool: dict[int, PoolId]
    segments: int
    inferred: int
    ranges: dict[int, list[tuple[int, int, PoolId]]]
    guessed: frozenset[int] = frozenset()
    captures: tuple[Capture, ...] = ()
    by_neighbours: int = 0
    conflicts: tuple[tuple[int, str], ...] = ()

    def pool_at(self, index: int, address: int) -> PoolId:
        """The pool of the segment starting at ``address`` right after event ``index`` (-1: before the first)."""
        for birth, death, pool in self.ranges.get(address, ()):
            if birth <= index < death:
                return pool
        return DEFAULT_POOL

    @property
    def private(self) -> bool:
        """Whether any segment is in a private pool."""
        return any(p != DEFAULT_POOL for p in (*self.alloc_pool.values(), *self.segment_pool.values(),
                                               *self.initial_pool.values()))


class _Ranges:
    """Live address ranges ``[start, end)`` (segments, or mapped ranges of expandable ones), each with a segment id."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.rows: dict[int, list[Any]] = {}  # start -> [end, segment id, stream, expandable]
        self.lives: dict[int, list[list[int]]] = {}  # start -> [[first event, last event + 1, segment id], ...]
        self.now = -1  # the event being played

    def add(self, start: int, end: int, sid: int, stream: int, expandable: bool) -> None:
        if start in self.rows:
            self.remove(start)
        insort(self.starts, start)
        self.rows[start] = [end, sid, stream, expandable]
        self.lives.setdefault(start, []).append([self.now, _NEVER, sid])

    def remove(self, start: int) -> None:
        del self.rows[start]
        self.starts.pop(bisect_right(self.starts, start) - 1)
        self.lives[start][-1][1] = self.now

    def at(self, addr: int) -> int | None:
        """The start of the range holding ``addr``, or None."""
        k = bisect_right(self.starts, addr) - 1
        if k < 0:
            return None
        start = self.starts[k]
        return start if addr < self.rows[start][0] else None


class _Segments:
    """Segment ids with a union-find (touching mapped ranges of one expandable segment become one id)."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.pool: list[PoolId | None] = []
        self.stream: list[int] = []
        self.born: list[int] = []  # the event that made it (-1: there before recording started)

    def new(self, stream: int, born: int) -> int:
        self.parent.append(len(self.parent))
        self.pool.append(None)
        self.stream.append(stream)
        self.born.append(born)
        return len(self.parent) - 1

    def find(self, sid: int) -> int:
        parent = self.parent
        while parent[sid] != sid:
            parent[sid] = parent[parent[sid]]
            sid = parent[sid]
        return sid

    def union(self, a: int, b: int) -> int:
        a, b = self.find(a), self.find(b)
        if a != b:
            self.parent[b] = a
            if self.pool[a] is None:
                self.pool[a] = self.pool[b]
        return a

    def name(self, sid: int, pool: PoolId) -> None:
        root = self.find(sid)
        if self.pool[root] is None:
            self.pool[root] = pool


def _pool_id(segment: Mapping[str, Any]) -> PoolId:
    raw = segment.get("segment_pool_id") or DEFAULT_POOL
    return (int(raw[0]), int(raw[1]))


def earlier_snapshots(events: Sequence[Mapping[str, Any]], device: int,
                      snapshots: Iterable[Any]) -> list[EarlierSnapshot]:
    """Load ``snapshots`` (anything :func:`~memviz.snapshots.load_snapshot` takes) taken earlier in the recording
    whose trace is ``events``, in trace order; one whose trace is not a prefix of ``events`` (another run, a trace
    that wrapped around) is left out."""
    out = []
    for snap in snapshots:
        snap = load_snapshot(snap)
        traces = snap.get("device_traces") or []
        trace = traces[device] if device < len(traces) else []
        n = len(trace)
        if n > len(events) or any(trace[k].get("action") != events[k].get("action")
                                  or trace[k].get("addr") != events[k].get("addr") for k in (0, n - 1) if n):
            continue
        out.append(EarlierSnapshot(n, [s for s in snap.get("segments", []) if s.get("device", 0) == device],
                                   settings_from_snapshot(snap)))
    return sorted(out, key=lambda s: s.events)


def assign_pools(history: SnapshotHistory) -> PoolAssignment:
    """Name the pool of every allocation and segment event of ``history`` from its final segments and those of
    its :attr:`~memviz.snapshots.SnapshotHistory.earlier` snapshots (see the module docstring).

    Runtime complexity: O(n log s) for n events and s live segments.
    """
    events = history.events
    hints: dict[int, list] = {}
    for snap in history.earlier:
        hints.setdefault(snap.events, []).extend(snap.segments)
    segs = _Segments()
    ranges = _Ranges()
    initial_sid: dict[int, int] = {}
    for fs in history._initial[0]:
        sid = segs.new(fs.stream, -1)
        ranges.add(fs.addr, fs.addr + fs.size, sid, fs.stream, fs.expandable)
        for b in fs.blocks:
            initial_sid[b.addr] = sid
    alloc_sid: dict[int, int] = {}
    segment_sid: dict[int, int] = {}

    def name_from(segments: list) -> None:
        for s in segments:
            start = ranges.at(s["address"])
            if start is not None:
                segs.name(ranges.rows[start][1], _pool_id(s))

    def sid_of(addr: int) -> int | None:
        start = ranges.at(addr)
        return None if start is None else ranges.rows[start][1]

    evidence = PoolEvidence(history)
    if 0 in hints:
        name_from(hints[0])
    for i, e in enumerate(events):
        ranges.now = i
        evidence.before(i, e, sid_of)
        action = e.get("action")
        if action == "alloc":
            start = ranges.at(e["addr"])
            if start is not None:
                alloc_sid[i] = ranges.rows[start][1]
        elif action == "segment_alloc":
            sid = segment_sid[i] = segs.new(e.get("stream", 0), i)
            ranges.add(e["addr"], e["addr"] + e["size"], sid, e.get("stream", 0), False)
        elif action == "segment_free":
            if e["addr"] in ranges.rows:
                segment_sid[i] = ranges.rows[e["addr"]][1]
                ranges.remove(e["addr"])
        elif action == "segment_map":
            segment_sid[i] = _map(segs, ranges, e["addr"], e["addr"] + e["size"], e.get("stream", 0))
        elif action == "segment_unmap":
            sid = _unmap(ranges, e["addr"], e["addr"] + e["size"])
            if sid is not None:
                segment_sid[i] = sid
        evidence.after(i, e, sid_of)
        if i + 1 in hints:
            name_from(hints[i + 1])
    name_from(history.final_segments)
    unnamed = {k for k in range(len(segs.parent)) if segs.find(k) == k and segs.pool[k] is None}
    captures = _captures(segs, events, alloc_sid) if registers_generator_at_capture(history.torch_version) else ()
    by_neighbours, conflicts = _infer(segs, events, alloc_sid, evidence.found)

    def pool_of(sid: int) -> PoolId:
        return segs.pool[segs.find(sid)] or DEFAULT_POOL

    return PoolAssignment(
        alloc_pool={i: pool_of(s) for i, s in alloc_sid.items()},
        segment_pool={i: pool_of(s) for i, s in segment_sid.items()},
        initial_pool={addr: pool_of(s) for addr, s in initial_sid.items()},
        segments=sum(1 for k in range(len(segs.parent)) if segs.find(k) == k),
        inferred=len(unnamed),
        ranges={start: [(b, d, pool_of(sid)) for b, d, sid in lives] for start, lives in ranges.lives.items()},
        guessed=frozenset(i for table in (alloc_sid, segment_sid) for i, s in table.items()
                          if segs.find(s) in unnamed),
        captures=tuple(captures),
        by_neighbours=by_neighbours,
        conflicts=tuple(conflicts),
    )


def _map(segs: _Segments, ranges: _Ranges, start: int, end: int, stream: int) -> int:
    """Map ``[start, end)``: joins the expandable range of ``stream`` it touches on either side (one segment)."""
    sid = None
    before = ranges.at(start - 1) if start else None
    if before is not None:
        row = ranges.rows[before]
        if row[3] and row[2] == stream and row[0] == start:
            sid = row[1]
            ranges.remove(before)
            start = before
    after = ranges.rows.get(end)
    if after is not None and after[3] and after[2] == stream:
        sid = after[1] if sid is None else segs.union(sid, after[1])
        ranges.remove(end)
        end = after[0]
    if sid is None:
        sid = segs.new(stream, ranges.now)
    ranges.add(start, end, segs.find(sid), stream, True)
    return sid


def _unmap(ranges: _Ranges, start: int, end: int) -> int | None:
    """Unmap ``[start, end)`` from the mapped range holding it (split in two when inside); its segment id."""
    at = ranges.at(start)
    if at is None:
        return None
    r_end, sid, stream, expandable = ranges.rows[at]
    ranges.remove(at)
    if at < start:
        ranges.add(at, start, sid, stream, expandable)
    if end < r_end:
        ranges.add(end, r_end, sid, stream, expandable)
    return sid


def _generator_pairs(events: Sequence[Mapping[str, Any]]) -> list[tuple[int, int, int | None]]:
    """``(first, second, freed)``: each pair of 8-byte allocations in a row on a side stream while no such pair
    lives (the default generator's seed and offset), and the event that freed the later of the two (None: live
    at the end)."""
    pairs = []
    live: tuple[int, set[int]] | None = None  # the pair's position in ``pairs`` and its addresses still live
    n = len(events)
    for i, e in enumerate(events):
        action = e.get("action")
        if live is not None:
            if action == "free_requested" and e.get("addr") in live[1]:
                live[1].discard(e["addr"])
                if not live[1]:
                    first, second, _ = pairs[live[0]]
                    pairs[live[0]] = (first, second, i)
                    live = None
            continue
        if action != "alloc" or e.get("size") != GENERATOR_TENSOR_BYTES or not e.get("stream", 0):
            continue
        j = i + 1
        while j < n and events[j].get("action") in ("snapshot", "annotate"):
            j += 1
        nxt = events[j] if j < n else {}
        if nxt.get("action") == "alloc" and nxt.get("size") == GENERATOR_TENSOR_BYTES \
                and nxt.get("stream", 0) == e.get("stream", 0):
            pairs.append((i, j, None))
            live = (len(pairs) - 1, {e["addr"], nxt["addr"]})
    return pairs


def _captures(segs: _Segments, events: Sequence[Mapping[str, Any]], alloc_sid: dict[int, int]) -> list[Capture]:
    """Name the segments no snapshot named that a capture allocated into (see the module docstring)."""
    captures = []
    next_graph = 1 + max((p[0] for p in segs.pool if p is not None), default=0)
    for first, second, freed in _generator_pairs(events):
        stream = events[first].get("stream", 0)
        end = len(events) if freed is None else freed
        holders = {segs.find(alloc_sid[k]) for k in (first, second) if k in alloc_sid}
        for root in holders:
            if segs.pool[root] is None:
                segs.pool[root] = DEFAULT_POOL  # the generator's own segment
        inside = {segs.find(alloc_sid[k]) for k in range(second + 1, end)
                  if k in alloc_sid and events[k].get("stream", 0) == stream} - holders
        named = {segs.pool[r] for r in inside if segs.pool[r] not in (None, DEFAULT_POOL)}
        if len(named) == 1:
            pool, is_named = named.pop(), True
        else:
            pool, is_named = (next_graph, 0), False
        unnamed = [r for r in inside if segs.pool[r] is None]
        if not unnamed:
            continue
        if not is_named:
            next_graph += 1
        for r in unnamed:
            segs.pool[r] = pool
        captures.append(Capture(stream, (first, second), freed, pool, is_named))
    return captures


def _infer(segs: _Segments, events: Sequence[Mapping[str, Any]], alloc_sid: dict[int, int],
           apart: Sequence[Apart]) -> tuple[int, list[tuple[int, str]]]:
    """Give each segment no snapshot named the first pool the allocator's rules (``apart``) allow, of: the pool of
    the nearest named allocations on its stream, the device's own, any other named pool. Returns how many it named,
    and the conflicts: where the rules show a pool no snapshot names (see the module docstring)."""
    order = sorted(alloc_sid)
    by_stream: dict[int, list[tuple[int, int]]] = {}  # stream -> (event index, segment root) of its allocs
    first: dict[int, int] = {}  # segment root -> position of its first alloc in its stream's list
    for i in order:
        root = segs.find(alloc_sid[i])
        lst = by_stream.setdefault(events[i].get("stream", 0), [])
        first.setdefault(root, len(lst))
        lst.append((i, root))
    unknown = [k for k in range(len(segs.parent)) if segs.find(k) == k and segs.pool[k] is None]
    named = sorted({p for p in segs.pool if p is not None and p != DEFAULT_POOL})
    roots_stream = {root: stream for stream, lst in by_stream.items() for _, root in lst}
    candidates: dict[int, list[PoolId]] = {}
    for root in unknown:
        guess = None
        if root in first:  # else never allocated from: the device's own
            lst = by_stream[roots_stream[root]]
            k = first[root]
            before = next((segs.pool[r] for _, r in reversed(lst[:k]) if segs.pool[r] is not None), None)
            after = next((segs.pool[r] for _, r in lst[k + 1:] if segs.pool[r] is not None), None)
            if before is not None and (after is None or after == before):
                guess = before
            elif before is None and after is not None:
                guess = after
        candidates[root] = list(dict.fromkeys(p for p in (guess, DEFAULT_POOL, *named) if p is not None))
    conflicts = _apply_rules(segs, candidates, apart)
    for root in unknown:
        segs.pool[root] = candidates[root][0] if candidates[root] else DEFAULT_POOL
    return len(unknown), conflicts


def _apply_rules(segs: _Segments, candidates: dict[int, list[PoolId]],
                 apart: Sequence[Apart]) -> list[tuple[int, str]]:
    """Drop from each unnamed segment's ``candidates`` (first: its pool) the pools the rules keep it out of, until
    every finding of ``apart`` holds or shows a pool no snapshot names; those findings, as sentences.

    Runtime complexity: O(f·g) a pass for f findings of g segments each, one pass per pool dropped."""
    def pool(root: int) -> PoolId | None:
        if root in candidates:
            return candidates[root][0] if candidates[root] else None
        return segs.pool[root]

    groups = [({segs.find(s) for s in finding.first}, {segs.find(s) for s in finding.second}) for finding in apart]
    shown: dict[int, tuple[int, str]] = {}  # finding -> the conflict it shows
    changed = True
    while changed:
        changed = False
        for n, (first, second) in enumerate(groups):
            if n in shown:
                continue
            pair = _sharing(first, second, pool)
            if pair is None:
                continue
            moves = [r for r in pair if r in candidates]
            why = _sentence(segs, apart[n].why)
            if len(moves) == 1:  # one side named: the other was elsewhere
                candidates[moves[0]].pop(0)
                changed = True
                if not candidates[moves[0]]:
                    shown[n] = (apart[n].event, why + ", so it lay in another pool, and none a snapshot names (nor "
                                "the device's own) fits")
            elif len(moves) == 2:
                shown[n] = (apart[n].event, why + ", so the two lay in different pools, and no snapshot names the "
                            "pool of either")
    return sorted(shown.values())


def _sharing(first: set[int], second: set[int], pool: Any) -> tuple[int, int] | None:
    """A segment of ``first`` and another of ``second`` in one pool (as ``pool`` gives it), or None."""
    by_pool: dict[PoolId, list[int]] = {}
    for root in first:
        p = pool(root)
        if p is not None and len(by_pool.setdefault(p, [])) < 2:  # two: one of them is not ``root`` below
            by_pool[p].append(root)
    for root in second:
        for a in by_pool.get(pool(root), ()):
            if a != root:
                return a, root
    return None


def _sentence(segs: _Segments, why: str) -> str:
    """A finding's sentence with each ``{sid}`` told by where the segment was made."""
    out, k = [], 0
    while (open_ := why.find("{", k)) >= 0:
        close = why.index("}", open_)
        born = segs.born[int(why[open_ + 1:close])]
        out += [why[k:open_], "there before recording started" if born < 0 else f"made at event {born:,}"]
        k = close + 1
    return "".join(out) + why[k:]

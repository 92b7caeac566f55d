"""How much memory the recording's GPU had, read off the recording itself (a snapshot names no device size).

A replay needs the device's memory (``totalGlobalMem``) twice: an allocation fails where the device is full,
and every expandable segment reserves address space for 1 1/8 of it (``ExpandableSegment``:
``numSegments(totalGlobalMem + totalGlobalMem / 8)`` pages of 2 MiB in the small pool, ``large_segment_size``
in the large pool). The recording bounds it:

- **From above, by expandable segments.** A ``segment_map`` starts at a reservation's base unless it continues
  a mapped range of its stream (the allocator maps the unmapped block right after a mapped one, or the first
  block of a segment), so a map that continues nothing opens a new reservation, unless it maps again the
  first pages of a live one. Two
  reservations live at the same time never overlap: one at ``base`` with an address of another ``d`` bytes
  above it was at most ``d`` bytes, which bounds the device's memory. The driver packs reservations
  bottom-up at 32 MiB boundaries (:mod:`memviz.sim.addresses`), so the nearest such address is usually the
  next reservation and the bound is within about 30 MB of the truth.
- **From below**: the recording's peak reserved bytes, and at an ``oom`` entry the reserved bytes plus the
  ``device_free`` the driver reported then. That sum is what the process could use when it ran out of memory: the
  replay models the rest of the device as held outside the cache (``context_bytes``: the CUDA context, other
  processes), so that a request fails where the recording's failed.

Without expandable segments (or in a trace that contradicts itself: ``SnapshotHistory.anomalies``) nothing
bounds the device from above. The replay then models a device with no limit of its own (only a cap makes an
OOM), sized so that its address space holds every expandable segment a what-if could make: four per stream and
pool (a small and a large one, twice over), never a size whose reservations run out where a real GPU's do not.
All sizes are bytes.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memviz.sim import rules
from memviz.sim.addresses import CHUNK, RESERVE_BASE, VA_SPLIT
from memviz.sim.constants import SMALL_SIZE, MiB
from memviz.sim.limits import MAX_DEVICE_BYTES
from memviz.sim.pools import DEFAULT_POOL
from memviz.units import format_bytes

if TYPE_CHECKING:
    from .history import SnapshotHistory

__all__ = ["DeviceEstimate", "infer_device", "reservation_bytes"]

_SLOTS_PER_POOL = 4  # expandable segments a what-if may hold per (stream, pool): small and large, twice over
_NEVER = 1 << 62  # the end of a reservation still live at the end


@dataclass(frozen=True)
class DeviceEstimate:
    """The device a recording ran on, as far as the recording tells (bytes).

    Attributes:
        total_bytes: the device memory replays use.
        lower_bytes: the least the recording allows (its peak reserved bytes, or reserved plus free at an OOM).
        upper_bytes: the most its expandable segments' reservations allow, or None (no such evidence).
        source: ``"expandable reservations"`` (bounded from above), ``"oom"`` (no bound from above, but an OOM
            showed what was usable: the rest is ``context_bytes``), ``"given"`` (the caller's) or ``"unknown"`` (no
            bound at all: a device with no limit of its own).
        note: one sentence: what was inferred and how.
        context_bytes: the memory held outside the cache when the recording ran out of memory (the device's size
            less the reserved and free bytes its ``oom`` entry shows; 0 without one).
    """

    total_bytes: int
    lower_bytes: int
    upper_bytes: int | None
    source: str
    note: str
    context_bytes: int = 0

    @property
    def label(self) -> str:
        """A short name for tables: ``"unlimited"`` when the recording does not bound it, what an OOM showed usable,
        else its size."""
        if self.source == "unknown":
            return "unlimited"
        if self.source == "oom":
            return f"{format_bytes(self.total_bytes - self.context_bytes)} usable (inferred)"
        return f"{format_bytes(self.total_bytes)} ({'inferred' if self.source != 'given' else 'given'})"


def reservation_bytes(total_bytes: int, page_bytes: int) -> int:
    """The address space one expandable segment reserves on a device of ``total_bytes``: ``total + total / 8``
    rounded up to whole ``page_bytes`` pages (``ExpandableSegment``'s ``segment_size_ * max_handles_``)."""
    wanted = total_bytes + total_bytes // 8
    return -(-wanted // page_bytes) * page_bytes


def _largest_total(limit: int) -> int:
    """The largest device memory ``t`` with ``t + t // 8 <= limit`` (0 if none)."""
    t = max(0, (8 * limit) // 9 + 8)
    while t > 0 and t + t // 8 > limit:
        t -= 1
    return t


@dataclass
class _Reservation:
    """One expandable segment's reserved range, followed through the trace."""

    base: int  # its lowest address seen
    opened: bool  # whether ``base`` is where a map opened it (else: present at the start, base unknown)
    stream: int
    kind: str | None  # "small" / "large" from the first allocation into it
    born: int  # event index; -1: live before the first event
    died: int = _NEVER
    ranges: int = 0  # mapped ranges live


class _Mapped:
    """The mapped ranges of expandable segments, by start address, each with its reservation."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.rows: dict[int, tuple[int, int, int]] = {}  # start -> (end, stream, reservation index)
        self.by_end: dict[tuple[int, int], int] = {}  # (stream, end) -> start

    def add(self, start: int, end: int, stream: int, rid: int) -> None:
        insort(self.starts, start)
        self.rows[start] = (end, stream, rid)
        self.by_end[(stream, end)] = start

    def remove(self, start: int) -> tuple[int, int, int]:
        end, stream, rid = self.rows.pop(start)
        del self.starts[bisect_right(self.starts, start) - 1]
        del self.by_end[(stream, end)]
        return end, stream, rid

    def overlaps(self, start: int, end: int) -> bool:
        """Whether ``[start, end)`` meets a mapped range."""
        k = bisect_right(self.starts, end - 1) - 1
        return k >= 0 and self.rows[self.starts[k]][0] > start

    def at(self, addr: int) -> int | None:
        k = bisect_right(self.starts, addr) - 1
        if k < 0:
            return None
        start = self.starts[k]
        return start if addr < self.rows[start][0] else None


class _Walk:
    """Follows every expandable segment's reservation through the trace (see the module docstring)."""

    def __init__(self, history: SnapshotHistory) -> None:
        self.history = history
        self.res: list[_Reservation] = []
        self.live: dict[int, set[int]] = {}  # stream -> its live reservations
        self.mapped = _Mapped()

    def run(self) -> list[_Reservation]:
        history = self.history
        for seg in history._initial[0]:
            if seg.expandable:
                kind = seg.kind if seg.kind in ("small", "large") else None
                rid = self._new(seg.addr, False, seg.stream, -1, kind)
                self._add(seg.addr, seg.addr + seg.size, seg.stream, rid)
        for i, e in enumerate(history.events):
            action = e.get("action")
            if action == "segment_map":
                self._map(i, e["addr"], e["addr"] + e["size"], e.get("stream", 0))
            elif action == "segment_unmap":
                self._unmap(i, e["addr"], e["addr"] + e["size"])
            elif action == "alloc":
                start = self.mapped.at(e["addr"])
                if start is not None:
                    r = self.res[self.mapped.rows[start][2]]
                    if r.kind is None:
                        small = history.settings_at(i).round_size(e["size"]) <= SMALL_SIZE
                        r.kind = "small" if small else "large"
        return self.res

    def _new(self, base: int, opened: bool, stream: int, born: int, kind: str | None) -> int:
        self.res.append(_Reservation(base, opened, stream, kind, born))
        self.live.setdefault(stream, set()).add(len(self.res) - 1)
        return len(self.res) - 1

    def _add(self, start: int, end: int, stream: int, rid: int) -> None:
        self.mapped.add(start, end, stream, rid)
        r = self.res[rid]
        r.ranges += 1
        r.base = min(r.base, start)

    def _map(self, i: int, start: int, end: int, stream: int) -> None:
        mapped = self.mapped
        if end <= start or mapped.overlaps(start, end):
            return  # over a mapped range: the trace contradicts itself (the history's anomalies say where)
        below = mapped.by_end.get((stream, start))
        above = mapped.rows.get(end)
        rid = None
        if below is not None:
            rid = mapped.remove(below)[2]
            self.res[rid].ranges -= 1
            start = below
        if above is not None and above[1] == stream:
            a_end, _, a_rid = mapped.remove(end)
            self.res[a_rid].ranges -= 1
            rid = a_rid if rid is None else rid
            end = a_end
        if rid is None:
            rid = self._open(i, start, stream)
        self._add(start, end, stream, rid)

    def _open(self, i: int, start: int, stream: int) -> int:
        """The reservation of a map that continues no mapped range: such a map starts at a reservation's base, so
        it is a live reservation's of its stream whose base is there (its pages there were unmapped and are mapped
        again; or at or below the lowest address seen of one present at the start), else a new one."""
        for rid in self.live.get(stream, ()):
            r = self.res[rid]
            if start == r.base if r.opened else start <= r.base:
                return rid
        return self._new(start, True, stream, i, self.history._kind_after(i))

    def _unmap(self, i: int, start: int, end: int) -> None:
        mapped = self.mapped
        at = mapped.at(start)
        if at is None or mapped.rows[at][0] < end:
            return  # not inside one mapped range: the history's anomalies say so
        r_end, stream, rid = mapped.remove(at)
        r = self.res[rid]
        r.ranges -= 1
        if at < start:
            self._add(at, start, stream, rid)
        if end < r_end:
            self._add(end, r_end, stream, rid)
        if r.ranges == 0:
            r.died = i
            self.live[stream].discard(rid)


def _oom_usable(history: SnapshotHistory) -> tuple[int, int] | None:
    """``(reserved + device_free, event)`` at the ``oom`` entry where that sum is largest, or None without one."""
    tl = history.timeline
    best = None
    for i in tl.oom_indices:
        free = history.events[i].get("device_free")
        if isinstance(free, int) and free >= 0:
            usable = (tl.reserved_bytes[i - 1] if i else tl.initial["reserved_bytes"]) + free
            if best is None or usable > best[0]:
                best = (usable, i)
    return best


def _lower_bound(history: SnapshotHistory) -> tuple[int, str]:
    """The least device memory the recording allows, and why."""
    tl = history.timeline
    peak = max(tl.reserved_bytes, default=tl.initial["reserved_bytes"])
    lower, why = peak, f"its peak reserved {format_bytes(peak)}"
    usable = _oom_usable(history)
    if usable is not None and usable[0] > lower:
        lower, why = usable[0], f"the reserved and free bytes at the OOM of event {usable[1]:,}"
    return lower, why


def _reservation_limits(history: SnapshotHistory) -> list[tuple[int, int, int]]:
    """``(limit on total + total // 8, reservation base, event)`` from each pair of expandable reservations live
    at once, the upper one the nearest such: the lower one's reservation ends at or below the upper one's lowest
    address. Reservations opened again at one base (after ``empty_cache`` unmapped them) are compared once, by
    their lifetimes.

    Runtime complexity: O(g^2 + g l) for g distinct (base, size class) and l lifetimes in all.
    """
    lives: dict[tuple[int, str | None, bool], list[tuple[int, int, int]]] = {}
    for r in _Walk(history).run():
        lives.setdefault((r.base, r.kind, r.opened), []).append((r.born, r.died, r.born))
    groups = sorted(lives.items())
    limits = []
    for k, ((base, kind, opened), low) in enumerate(groups):
        if not opened or kind is None:
            continue
        page = rules.page_size(kind == "small", history.settings_at(max(low[0][0], 0)).config)
        for (high_base, _, _), high in groups[k + 1:]:
            if high_base <= base:
                continue
            together = _first_overlap(low, high)
            if together is not None:
                room = high_base - base
                limits.append((room // page * page, base, together))
                break
    return limits


def _first_overlap(a: list[tuple[int, int, int]], b: list[tuple[int, int, int]]) -> int | None:
    """The birth event of the first lifetime in ``a`` (sorted ``(born, died, born)``) that overlaps one in ``b``."""
    j = 0
    for born, died, _ in a:
        while j < len(b) and b[j][1] <= born:
            j += 1
        if j < len(b) and b[j][0] < died:
            return born
    return None


def infer_device(history: SnapshotHistory) -> DeviceEstimate:
    """The device memory of ``history``'s recording (see the module docstring).

    Runtime complexity: O(n (log m + s)) for n events, m mapped ranges and s live expandable segments per stream,
    plus :func:`_reservation_limits`.
    """
    lower, lower_why = _lower_bound(history)
    limits = [] if history.anomalies else _reservation_limits(history)
    if limits:
        limit, base, born = min(limits)
        upper = _largest_total(limit)
        if upper >= lower:
            packed = _largest_total(max(limit - CHUNK, 0)) + 1  # if the next reservation was packed right above
            where = "before the first event" if born < 0 else f"at event {born:,}"
            note = (f"device memory {format_bytes(upper)} ({upper:,} B), inferred from its expandable segments: "
                    f"the reservation at 0x{base:x} (opened {where}) has another's range "
                    f"{format_bytes(limit)} above it, and each reserves 1 1/8 of the device, so at most "
                    f"{upper:,} B (at least {max(packed, lower):,} B if they were packed as the driver packs them)")
            usable = _oom_usable(history)
            context = 0 if usable is None else upper - usable[0]
            if context:
                note += (f"; {format_bytes(context)} of it held outside the cache (the OOM of event {usable[1]:,} "
                         "shows what was reserved and free)")
            return DeviceEstimate(upper, max(lower, min(packed, upper)), upper, "expandable reservations", note,
                                  context)
    pairs = {(history.events[i].get("stream", 0), pool) for i, pool in history.pools.alloc_pool.items()}
    pairs |= {(b.stream, history.pools.initial_pool.get(b.address, DEFAULT_POOL)) for b in history.initial_blocks}
    slots = _SLOTS_PER_POOL * max(len(pairs), 1)
    room = _largest_total((VA_SPLIT - RESERVE_BASE) // slots) // (2 * MiB) * (2 * MiB)
    total = max(min(MAX_DEVICE_BYTES, room), lower)
    why = ("its trace contradicts itself (history.anomalies)" if history.anomalies else
           "no expandable segment bounds it" if not limits else "its expandable segments contradict " + lower_why)
    note = (f"device memory not in the recording ({why}): replayed as a device with no limit of its own "
            f"({format_bytes(total)}, room for {slots} expandable segments: {_SLOTS_PER_POOL} for each of its "
            f"{len(pairs)} stream/pool pairs); at least {format_bytes(lower)} ({lower_why})")
    usable = _oom_usable(history)
    if usable is None:
        return DeviceEstimate(total, lower, None, "unknown", note)
    note += (f"; of it {format_bytes(usable[0])} usable, as its OOM of event {usable[1]:,} shows (the reserved bytes "
             "plus the driver's device_free), the rest held outside the cache")
    return DeviceEstimate(total, lower, None, "oom", note, total - usable[0])

"""Rebuild the allocator's segments and blocks at any event of a snapshot's ``device_traces``.

A snapshot holds the state at the end (``segments``) and the events that led there
(``device_traces``), but recording usually starts late: a model's parameters are allocated before
``_record_memory_history()`` is called, so their blocks sit in ``segments`` with no ``alloc`` event.
:class:`SnapshotHistory` does what PyTorch's viewer (``MemoryViz.js``, ``simulate_memory``) does to
find the starting state: begin at the final segments and undo the events from last to first
(an ``alloc`` removes its block, a ``free_completed`` brings one back, a ``segment_alloc`` removes its
segment, a ``segment_map`` unmaps its range, …). Blocks still standing at the start were allocated
before recording began. It then plays the events forward with the allocator's own split and merge
rules (spec §4.2, §5, §6.2), so every intermediate state has real block sizes, free blocks and the
stale ``requested_size`` of free blocks (spec §13.4), and the state after the last event equals the
recorded ``segments``.

All sizes and addresses are bytes. Event ``i`` is ``device_traces[device][i]``; "the state at event
``i``" is the state right after event ``i`` was applied, as in MemoryViz.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right, insort
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from memviz.sim.constants import SMALL_BUFFER, SMALL_SIZE

from .errors import SnapshotError
from .load import TRACE_ACTIONS, load_snapshot
from .progress import progress_bar
from .settings import RecordedSettings, settings_from_snapshot

__all__ = ["TRACE_ACTION_CODES", "HistoryTimeline", "InitialBlock", "SnapshotHistory"]

#: Action codes used by :attr:`HistoryTimeline.action` (index into this tuple): the trace actions the loader knows
#: (``annotate`` carries no memory), then ``other`` for anything else.
TRACE_ACTION_CODES = (*(a for a in TRACE_ACTIONS if a != "annotate"), "other")
_CODE = {name: i for i, name in enumerate(TRACE_ACTION_CODES)}
_SEGMENT_CODES = (_CODE["segment_alloc"], _CODE["segment_free"], _CODE["segment_map"], _CODE["segment_unmap"])
_ALLOCATED, _PENDING, _INACTIVE = "active_allocated", "active_pending_free", "inactive"
_CHECKPOINT_EVERY = 2048  # events between stored states; state_at() replays at most this many


class _Block:
    __slots__ = ("addr", "frames", "requested", "seg", "size", "state")

    def __init__(self, addr: int, size: int, requested: int, state: str, frames: Any, seg: _Segment) -> None:
        self.addr, self.size, self.requested, self.state, self.frames, self.seg = (
            addr, size, requested, state, frames, seg)


class _Segment:
    __slots__ = ("addr", "blocks", "expandable", "frames", "kind", "size", "stream")

    def __init__(self, addr: int, size: int, stream: int, kind: str, expandable: bool, frames: Any) -> None:
        self.addr, self.size, self.stream, self.kind, self.expandable, self.frames = (
            addr, size, stream, kind, expandable, frames)
        self.blocks: list[_Block] = []


@dataclass(frozen=True)
class InitialBlock:
    """A block that was live when recording started (allocated before ``_record_memory_history``).

    Attributes:
        address: device address (bytes).
        size: block size in bytes (exact when the block is still in the final ``segments``; otherwise
            inferred from ``round_size`` of the request and the space up to the next block).
        requested_size: the request in bytes.
        stream: the allocation stream.
        state: ``"active_allocated"`` or ``"active_pending_free"``.
    """

    address: int
    size: int
    requested_size: int
    stream: int
    state: str


@dataclass(frozen=True)
class HistoryTimeline:
    """Per-event memory totals, for a timeline plot or a slider; arrays of length ``len(history)``.

    Entry ``i`` is the value right after event ``i``. The arrays are ``array.array("q")`` (int64 bytes,
    compact; ``numpy.asarray`` and plotly take them as they are); index lists are plain lists.

    Attributes:
        allocated_bytes: sum of ``active_allocated`` block sizes (``memory_allocated()``).
        active_bytes: allocated plus blocks freed but pending on another stream.
        requested_bytes: sum of the unrounded requests of active blocks.
        reserved_bytes: sum of segment sizes (``memory_reserved()``).
        action: the event's action as an index into :data:`TRACE_ACTION_CODES` (``array('B')``).
        time_us: the event's ``time_us`` (µs since the epoch), or None if the trace has none.
        oom_indices: indices of ``oom`` events.
        segment_indices: indices of ``segment_alloc``/``segment_free``/``segment_map``/``segment_unmap``.
        snapshot_indices: indices of ``snapshot`` events.
        initial: the four totals before the first event, as a dict keyed like the arrays.
    """

    allocated_bytes: array
    active_bytes: array
    requested_bytes: array
    reserved_bytes: array
    action: array
    time_us: array | None
    oom_indices: list[int]
    segment_indices: list[int]
    snapshot_indices: list[int]
    initial: dict[str, int]


class _State:
    """Segments sorted by address plus an address → block map; mutated by :meth:`apply`."""

    def __init__(self, settings: RecordedSettings) -> None:
        self.settings = settings
        self.starts: list[int] = []
        self.segs: dict[int, _Segment] = {}
        self.by_addr: dict[int, _Block] = {}
        self.allocated = self.active = self.requested = self.reserved = 0
        self.anomalies: list[str] = []

    # -- segments -------------------------------------------------------------------------------
    def add_segment(self, seg: _Segment) -> None:
        insort(self.starts, seg.addr)
        self.segs[seg.addr] = seg
        for b in seg.blocks:
            self.by_addr[b.addr] = b

    def drop_segment(self, seg: _Segment) -> None:
        self.starts.remove(seg.addr)
        del self.segs[seg.addr]
        by_addr = self.by_addr
        for b in seg.blocks:
            if by_addr.get(b.addr) is b:
                del by_addr[b.addr]

    def segment_at(self, addr: int) -> _Segment | None:
        i = bisect_right(self.starts, addr) - 1
        if i < 0:
            return None
        seg = self.segs[self.starts[i]]
        return seg if addr < seg.addr + seg.size else None

    def _rekey(self, seg: _Segment, new_addr: int) -> None:
        self.starts.remove(seg.addr)
        del self.segs[seg.addr]
        seg.addr = new_addr
        insort(self.starts, new_addr)
        self.segs[new_addr] = seg

    # -- events ---------------------------------------------------------------------------------
    def alloc(self, i: int, addr: int, size: int, frames: Any) -> None:
        b = self.by_addr.get(addr)
        if b is None or b.state != _INACTIVE:
            b = self._carve(i, addr)
            if b is None:
                return
        seg = b.seg
        rounded = self.settings.round_size(size)
        small = rounded <= SMALL_SIZE
        if seg.expandable:
            seg.kind = "small" if small else "large"
        if rounded < b.size and self.settings.should_split(b.size, rounded, small=small,
                                                           expandable=seg.expandable):
            nb = _Block(addr, rounded, size, _ALLOCATED, frames, seg)
            seg.blocks.insert(seg.blocks.index(b), nb)
            b.addr += rounded
            b.size -= rounded
            self.by_addr[b.addr] = b
            self.by_addr[addr] = nb
            b = nb
        else:
            if rounded > b.size:
                self.anomalies.append(f"event {i}: alloc of {size} B (rounded {rounded}) at {addr} "
                                      f"only has a {b.size} B free block")
            b.state, b.requested, b.frames = _ALLOCATED, size, frames
        self.allocated += b.size
        self.active += b.size
        self.requested += size

    def _carve(self, i: int, addr: int) -> _Block | None:
        """Find the free block containing ``addr`` and split off its head so a block starts at ``addr``."""
        seg = self.segment_at(addr)
        if seg is not None:
            for b in seg.blocks:
                if b.addr < addr < b.addr + b.size and b.state == _INACTIVE:
                    head = _Block(b.addr, addr - b.addr, b.requested, _INACTIVE, None, seg)
                    seg.blocks.insert(seg.blocks.index(b), head)
                    self.by_addr[head.addr] = head
                    b.size -= addr - b.addr
                    b.addr = addr
                    self.by_addr[addr] = b
                    return b
        self.anomalies.append(f"event {i}: alloc at {addr}, where no free block starts")
        return None

    def free_requested(self, i: int, addr: int) -> None:
        b = self.by_addr.get(addr)
        if b is None or b.state != _ALLOCATED:
            self.anomalies.append(f"event {i}: free_requested at {addr}, where no block is allocated")
            return
        b.state = _PENDING
        self.allocated -= b.size

    def free_completed(self, i: int, addr: int) -> None:
        b = self.by_addr.get(addr)
        if b is None or b.state == _INACTIVE:
            self.anomalies.append(f"event {i}: free_completed at {addr}, where no block is active")
            return
        if b.state == _ALLOCATED:
            self.allocated -= b.size
        self.active -= b.size
        self.requested -= b.requested
        b.state, b.frames = _INACTIVE, None
        blocks = b.seg.blocks
        j = blocks.index(b)
        by_addr = self.by_addr
        if j + 1 < len(blocks) and blocks[j + 1].state == _INACTIVE:
            nxt = blocks.pop(j + 1)
            del by_addr[nxt.addr]
            b.size += nxt.size
        if j > 0 and blocks[j - 1].state == _INACTIVE:
            prv = blocks.pop(j - 1)
            del by_addr[b.addr]
            b.addr = prv.addr
            b.size += prv.size
            by_addr[b.addr] = b
        if b.seg.addr == b.addr and b.seg.blocks[0] is not b:
            self.anomalies.append(f"event {i}: merge order broken at {addr}")

    def segment_alloc(self, addr: int, size: int, stream: int, frames: Any) -> None:
        kind = "small" if size <= SMALL_BUFFER else "large"
        seg = _Segment(addr, size, stream, kind, False, frames)
        seg.blocks.append(_Block(addr, size, 0, _INACTIVE, None, seg))
        self.add_segment(seg)
        self.reserved += size

    def segment_free(self, i: int, addr: int, size: int) -> None:
        seg = self.segs.get(addr)
        if seg is None:
            self.anomalies.append(f"event {i}: segment_free at {addr}, where no segment starts")
            return
        if len(seg.blocks) != 1 or seg.blocks[0].state != _INACTIVE:
            self.anomalies.append(f"event {i}: segment_free at {addr} of a segment that is not one free block")
        self.drop_segment(seg)
        self.reserved -= seg.size

    def segment_map(self, addr: int, size: int, stream: int, kind: str, frames: Any) -> None:
        end = addr + size
        prev = self.segment_at(addr - 1) if addr else None
        if prev is not None and not (prev.expandable and prev.stream == stream
                                     and prev.addr + prev.size == addr):
            prev = None
        nxt = self.segs.get(end)
        if nxt is not None and not (nxt.expandable and nxt.stream == stream):
            nxt = None
        self.reserved += size
        if prev is None and nxt is None:
            seg = _Segment(addr, size, stream, kind, True, frames)
            seg.blocks.append(_Block(addr, size, 0, _INACTIVE, None, seg))
            self.add_segment(seg)
            return
        if prev is None:
            assert nxt is not None
            first = nxt.blocks[0]
            self._rekey(nxt, addr)
            nxt.size += size
            if first.state == _INACTIVE:
                del self.by_addr[first.addr]
                first.addr = addr
                first.size += size
                self.by_addr[addr] = first
            else:
                nb = _Block(addr, size, 0, _INACTIVE, None, nxt)
                nxt.blocks.insert(0, nb)
                self.by_addr[addr] = nb
            return
        last = prev.blocks[-1]
        prev.size += size
        if last.state == _INACTIVE:
            last.size += size
        else:
            last = _Block(addr, size, 0, _INACTIVE, None, prev)
            prev.blocks.append(last)
            self.by_addr[addr] = last
        if nxt is not None:
            self.starts.remove(nxt.addr)
            del self.segs[nxt.addr]
            prev.size += nxt.size
            blocks = nxt.blocks
            if blocks[0].state == _INACTIVE:
                head = blocks.pop(0)
                del self.by_addr[head.addr]
                last.size += head.size
            for b in blocks:
                b.seg = prev
            prev.blocks.extend(blocks)

    def segment_unmap(self, i: int, addr: int, size: int) -> None:
        seg = self.segment_at(addr)
        end = addr + size
        if seg is None or end > seg.addr + seg.size:
            self.anomalies.append(f"event {i}: segment_unmap of [{addr}, {end}) outside any segment")
            return
        blocks = seg.blocks
        j = next(k for k, b in enumerate(blocks) if b.addr <= addr < b.addr + b.size)
        b = blocks[j]
        if b.state != _INACTIVE or end > b.addr + b.size:
            self.anomalies.append(f"event {i}: segment_unmap of [{addr}, {end}) that is not free")
            return
        self.reserved -= size
        b_end = b.addr + b.size
        left = blocks[:j]
        right = blocks[j + 1:]
        del self.by_addr[b.addr]
        if addr > b.addr:
            b.size = addr - b.addr
            left.append(b)
            self.by_addr[b.addr] = b
        if b_end > end:
            tail = _Block(end, b_end - end, 0 if addr > b.addr else b.requested, _INACTIVE, None, seg)
            right.insert(0, tail)
            self.by_addr[end] = tail
        seg_end = seg.addr + seg.size
        self.starts.remove(seg.addr)
        del self.segs[seg.addr]
        if left:
            seg.blocks = left
            seg.size = addr - seg.addr
            insort(self.starts, seg.addr)
            self.segs[seg.addr] = seg
        if right:
            rseg = _Segment(end, seg_end - end, seg.stream, seg.kind, True, seg.frames)
            rseg.blocks = right
            for rb in right:
                rb.seg = rseg
            insort(self.starts, end)
            self.segs[end] = rseg

    # -- copies ---------------------------------------------------------------------------------
    def freeze(self) -> tuple:
        segs = self.segs
        return (
            tuple(
                (s.addr, s.size, s.stream, s.kind, s.expandable, s.frames,
                 tuple((b.addr, b.size, b.requested, b.state, b.frames) for b in s.blocks))
                for s in (segs[a] for a in self.starts)
            ),
            (self.allocated, self.active, self.requested, self.reserved),
        )

    @classmethod
    def thaw(cls, frozen: tuple, settings: RecordedSettings) -> _State:
        st = cls(settings)
        seg_rows, totals = frozen
        st.allocated, st.active, st.requested, st.reserved = totals
        for addr, size, stream, kind, expandable, frames, block_rows in seg_rows:
            seg = _Segment(addr, size, stream, kind, expandable, frames)
            seg.blocks = [_Block(ba, bs, br, bst, bf, seg) for ba, bs, br, bst, bf in block_rows]
            st.starts.append(addr)
            st.segs[addr] = seg
            for b in seg.blocks:
                st.by_addr[b.addr] = b
        return st


class SnapshotHistory:
    """The allocator state at every event of a recorded snapshot, rebuilt from its ``device_traces``.

    Building it undoes the events backwards from the final ``segments`` (to find the blocks that
    were live before recording started), then plays them forward once, storing the per-event totals
    (:attr:`timeline`) and a copy of the state every 2048 events.

    Args:
        snapshot: a path, file, bytes or dict accepted by :func:`~memviz.snapshots.load_snapshot`.
        device: which device's trace to use (default: 0).
        progress: show a ``tqdm.auto`` bar while playing forward; None shows one for traces of
            50,000 events or more (default: None).

    Runtime complexity: O(n·b) to build for n events and b blocks per segment; :meth:`state_at` replays
    at most 2048 events from the nearest stored state.

    >>> h = SnapshotHistory({"segments": [], "device_traces": [[
    ...     {"action": "segment_alloc", "addr": 0, "size": 2097152, "stream": 0},
    ...     {"action": "alloc", "addr": 0, "size": 1000, "stream": 0}]]})
    >>> [b["size"] for b in h.state_at(1)[0]["blocks"]], int(h.timeline.allocated_bytes[1])
    ([1024, 2096128], 1024)
    """

    def __init__(self, snapshot: Any, device: int = 0, *, progress: bool | None = None) -> None:
        self.snapshot: dict[str, Any] = load_snapshot(snapshot)
        self.device = device
        traces = self.snapshot["device_traces"]
        if device >= len(traces) and traces:
            raise SnapshotError(f"device {device} has no trace: the snapshot has {len(traces)} device traces")
        self.events: list[dict[str, Any]] = traces[device] if device < len(traces) else []
        self.settings: RecordedSettings = settings_from_snapshot(self.snapshot)
        self.final_segments: list[dict[str, Any]] = [
            s for s in self.snapshot["segments"] if s.get("device", 0) == device
        ]
        self._unknown_requested: dict[int, int] = {}
        self._initial = self._rebuild_initial()
        self.initial_blocks: list[InitialBlock] = self._initial_blocks()
        self._checkpoints: list[tuple] = []
        self.anomalies: list[str] = []
        self.timeline: HistoryTimeline = self._play(progress)

    def __len__(self) -> int:
        return len(self.events)

    # ------------------------------------------------------------------------------------------
    # Backwards: the state before the first event
    def _rebuild_initial(self) -> tuple:
        settings = self.settings
        fixed: dict[int, list] = {}  # addr -> [addr, size, stream, kind, frames]
        ranges: list[list] = []  # expandable mapped ranges: [addr, size, stream, kind, frames]
        live: dict[int, list] = {}  # addr -> [size | None, requested, state, frames, stream]
        for s in self.final_segments:
            row = [s["address"], s["total_size"], s.get("stream", 0), s["segment_type"], s.get("frames")]
            if s.get("is_expandable"):
                ranges.append(row)
            else:
                fixed[s["address"]] = row
            for b in s["blocks"]:
                if b["state"] != _INACTIVE:
                    live[b["address"]] = [b["size"], b["requested_size"], b["state"], b.get("frames"),
                                          s.get("stream", 0)]
        for e in reversed(self.events):
            action = e.get("action")
            if action == "alloc":
                live.pop(e["addr"], None)
            elif action == "free_requested":
                b = live.get(e["addr"])
                if b is not None:
                    b[2] = _ALLOCATED
            elif action == "free_completed":
                live[e["addr"]] = [None, e["size"], _PENDING, e.get("frames"), e.get("stream", 0)]
            elif action == "segment_alloc":
                fixed.pop(e["addr"], None)
            elif action == "segment_free":
                size = e["size"]
                fixed[e["addr"]] = [e["addr"], size, e.get("stream", 0),
                                    "small" if size <= SMALL_BUFFER else "large", e.get("frames")]
            elif action == "segment_map":
                _unmap_range(ranges, e["addr"], e["size"])
            elif action == "segment_unmap":
                _map_range(ranges, e["addr"], e["size"], e.get("stream", 0))
        # Lay the surviving blocks out in their segments, free gaps between them.
        rows = [(r[0], r[1], r[2], r[3], False, r[4]) for r in fixed.values()]
        rows += [(r[0], r[1], r[2], r[3], True, r[4]) for r in ranges]
        rows.sort()
        live_addrs = sorted(live)
        k = 0
        frozen_segs = []
        allocated = active = requested = reserved = 0
        unknown = self._unknown_requested
        for addr, size, stream, kind, expandable, frames in rows:
            end = addr + size
            reserved += size
            while k < len(live_addrs) and live_addrs[k] < addr:
                k += 1  # a live block outside every segment: ignore it
            inside = []
            while k < len(live_addrs) and live_addrs[k] < end:
                inside.append(live_addrs[k])
                k += 1
            blocks = []
            cursor = addr
            for n, baddr in enumerate(inside):
                bsize, breq, bstate, bframes, _ = live[baddr]
                limit = inside[n + 1] if n + 1 < len(inside) else end
                if bsize is None:
                    rounded = settings.round_size(breq)
                    gap = limit - baddr
                    small = rounded <= SMALL_SIZE
                    split = rounded < gap and settings.should_split(gap, rounded, small=small,
                                                                    expandable=expandable)
                    bsize = rounded if split else gap
                    live[baddr][0] = bsize
                if baddr > cursor:
                    blocks.append(self._unknown_free(cursor, baddr - cursor, unknown))
                blocks.append((baddr, bsize, breq, bstate, bframes))
                cursor = baddr + bsize
                active += bsize
                requested += breq
                if bstate == _ALLOCATED:
                    allocated += bsize
            if cursor < end:
                blocks.append(self._unknown_free(cursor, end - cursor, unknown))
            frozen_segs.append((addr, size, stream, kind, expandable, frames, tuple(blocks)))
        self._live_at_start = live
        return (tuple(frozen_segs), (allocated, active, requested, reserved))

    @staticmethod
    def _unknown_free(addr: int, size: int, unknown: dict[int, int]) -> tuple:
        """A free block whose stale ``requested_size`` is unknown yet: a negative placeholder id."""
        token = -(len(unknown) + 1)
        unknown[token] = 0
        return (addr, size, token, _INACTIVE, None)

    def _initial_blocks(self) -> list[InitialBlock]:
        out = []
        for seg in self._initial[0]:
            stream = seg[2]
            for addr, size, req, state, _ in seg[6]:
                if state != _INACTIVE:
                    out.append(InitialBlock(addr, size, req, stream, state))
        return out

    # ------------------------------------------------------------------------------------------
    # Forwards
    def _play(self, progress: bool | None) -> HistoryTimeline:
        events = self.events
        n = len(events)
        st = _State.thaw(self._initial, self.settings)
        initial = {"allocated_bytes": st.allocated, "active_bytes": st.active,
                   "requested_bytes": st.requested, "reserved_bytes": st.reserved}
        allocated = array("q", bytes(8 * n))
        active = array("q", bytes(8 * n))
        requested = array("q", bytes(8 * n))
        reserved = array("q", bytes(8 * n))
        codes = array("B", bytes(n))
        has_time = n > 0 and "time_us" in events[0]
        times = array("q", bytes(8 * n)) if has_time else None
        code_of = _CODE.get
        other = _CODE["other"]
        bar = progress_bar(n, progress, "rebuilding history")
        apply = self._apply
        for i, e in enumerate(events):
            if i % _CHECKPOINT_EVERY == 0:
                self._checkpoints.append(st.freeze())
                if bar is not None and i:
                    bar.update(_CHECKPOINT_EVERY)
            action = e["action"]
            apply(st, i, e)
            allocated[i] = st.allocated
            active[i] = st.active
            requested[i] = st.requested
            reserved[i] = st.reserved
            codes[i] = code_of(action, other)
            if times is not None:
                times[i] = e.get("time_us", 0)
        if bar is not None:
            bar.update(n - bar.n)
            bar.close()
        self.anomalies = st.anomalies
        self._resolve_unknown(st)
        self._final_state = st
        return HistoryTimeline(
            allocated_bytes=allocated, active_bytes=active, requested_bytes=requested,
            reserved_bytes=reserved, action=codes, time_us=times,
            oom_indices=[i for i, c in enumerate(codes) if c == _CODE["oom"]],
            segment_indices=[i for i, c in enumerate(codes) if c in _SEGMENT_CODES],
            snapshot_indices=[i for i, c in enumerate(codes) if c == _CODE["snapshot"]],
            initial=initial,
        )

    def _kind_after(self, i: int) -> str:
        """Pool of the first allocation after event ``i`` (to label a new expandable segment)."""
        for e in self.events[i + 1:i + 64]:
            if e.get("action") == "alloc":
                return "small" if self.settings.round_size(e["size"]) <= SMALL_SIZE else "large"
        return "large"

    def _resolve_unknown(self, final: _State) -> None:
        """Give free blocks that predate recording the stale ``requested_size`` the final snapshot shows."""
        recorded = {}
        for s in self.final_segments:
            for b in s["blocks"]:
                if b["state"] == _INACTIVE:
                    recorded[b["address"]] = b["requested_size"]
        for b in final.by_addr.values():
            if b.state == _INACTIVE and b.requested < 0 and b.addr in recorded:
                self._unknown_requested[b.requested] = recorded[b.addr]

    # ------------------------------------------------------------------------------------------
    # Queries
    def _state(self, index: int) -> _State:
        n = len(self.events)
        if not -n <= index < n:
            raise IndexError(f"event index {index} out of range for a trace of {n} events")
        index %= n
        if index == n - 1:
            return self._final_state
        c = index // _CHECKPOINT_EVERY
        st = _State.thaw(self._checkpoints[c], self.settings)
        events = self.events
        apply = self._apply
        for i in range(c * _CHECKPOINT_EVERY, index + 1):
            apply(st, i, events[i])
        return st

    def _apply(self, st: _State, i: int, e: dict[str, Any]) -> None:
        """Play trace event ``e`` (number ``i``) onto ``st``; actions that change no block are skipped."""
        action = e["action"]
        if action == "alloc":
            st.alloc(i, e["addr"], e["size"], e.get("frames"))
        elif action == "free_requested":
            st.free_requested(i, e["addr"])
        elif action == "free_completed":
            st.free_completed(i, e["addr"])
        elif action == "segment_alloc":
            st.segment_alloc(e["addr"], e["size"], e.get("stream", 0), e.get("frames"))
        elif action == "segment_free":
            st.segment_free(i, e["addr"], e["size"])
        elif action == "segment_map":
            st.segment_map(e["addr"], e["size"], e.get("stream", 0), self._kind_after(i), e.get("frames"))
        elif action == "segment_unmap":
            st.segment_unmap(i, e["addr"], e["size"])

    def _export(self, st: _State) -> list[dict[str, Any]]:
        unknown = self._unknown_requested
        device = self.device
        out = []
        for addr in st.starts:
            s = st.segs[addr]
            blocks = []
            allocated = active = requested = 0
            for b in s.blocks:
                req = unknown.get(b.requested, 0) if b.requested < 0 else b.requested
                blocks.append({"address": b.addr, "size": b.size, "requested_size": req, "state": b.state,
                               "frames": b.frames if b.frames is not None else []})
                if b.state != _INACTIVE:
                    active += b.size
                    requested += req
                    if b.state == _ALLOCATED:
                        allocated += b.size
            out.append({
                "device": device, "address": s.addr, "total_size": s.size, "allocated_size": allocated,
                "active_size": active, "requested_size": requested, "stream": s.stream,
                "segment_type": s.kind, "segment_pool_id": (0, 0), "is_expandable": s.expandable,
                "frames": s.frames if s.frames is not None else [], "blocks": blocks,
            })
        return out

    def state_at(self, index: int) -> list[dict[str, Any]]:
        """Return the segments right after event ``index``, shaped like ``_snapshot()["segments"]``.

        Segments are sorted by address; each has ``address, total_size, allocated_size, active_size,
        requested_size, stream, segment_type, is_expandable, blocks`` (bytes), and each block
        ``address, size, requested_size, state, frames``. Negative indices count from the end.

        Runtime complexity: O(2048 + s) (replay from the nearest stored state, s = live blocks).
        """
        return self._export(self._state(index))

    def initial_state(self) -> list[dict[str, Any]]:
        """Return the segments before the first event (what recording started from), like :meth:`state_at`."""
        return self._export(_State.thaw(self._initial, self.settings))

    def snapshot_at(self, index: int) -> dict[str, Any]:
        """Return a full snapshot dict (segments, the events up to ``index``, settings) for export."""
        n = len(self.events)
        stop = (index % n) + 1 if n else 0
        traces: list[list[dict[str, Any]]] = [[] for _ in self.snapshot["device_traces"]] or [[]]
        traces[self.device if self.device < len(traces) else 0] = list(self.events[:stop])
        return {
            "segments": self.state_at(index) if n else self.initial_state(),
            "device_traces": traces,
            "allocator_settings": dict(self.snapshot.get("allocator_settings") or {}),
            "external_annotations": [],
        }

    def iter_events(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
        """Yield ``(index, event)`` for events ``start`` to ``stop`` (exclusive)."""
        stop = len(self.events) if stop is None else stop
        for i in range(start, stop):
            yield i, self.events[i]

    def compare_final(self) -> list[str]:
        """Return the differences between the replayed final state and the recorded ``segments`` ([] if equal).

        Frames are ignored; every other segment and block key is compared.
        """
        return compare_segments(self.state_at(-1) if self.events else self.initial_state(),
                                self.final_segments)

    def check(self, index: int) -> None:
        """Assert the state at ``index`` is consistent: blocks tile each segment, no two adjacent free blocks.

        Raises:
            AssertionError: naming the segment and what is wrong.
        """
        for s in self.state_at(index):
            cursor = s["address"]
            prev_free = False
            for b in s["blocks"]:
                assert b["address"] == cursor, f"segment {s['address']}: gap or overlap at {cursor}"
                assert b["size"] > 0, f"segment {s['address']}: empty block at {cursor}"
                free = b["state"] == _INACTIVE
                assert not (free and prev_free), f"segment {s['address']}: unmerged free blocks at {cursor}"
                prev_free = free
                cursor += b["size"]
            assert cursor == s["address"] + s["total_size"], f"segment {s['address']}: blocks do not fill it"


def _map_range(ranges: list[list], addr: int, size: int, stream: int) -> None:
    """Add the mapped range [addr, addr+size) to ``ranges``, merging with touching ranges of the stream."""
    end = addr + size
    kind = "large"
    for r in list(ranges):
        if r[2] == stream and (r[0] + r[1] == addr or r[0] == end):
            kind = r[3]
            ranges.remove(r)
            addr, end = min(addr, r[0]), max(end, r[0] + r[1])
    ranges.append([addr, end - addr, stream, kind, None])


def _unmap_range(ranges: list[list], addr: int, size: int) -> None:
    """Remove [addr, addr+size) from the mapped range holding it, splitting the range if needed."""
    end = addr + size
    for r in ranges:
        r_end = r[0] + r[1]
        if r[0] <= addr and end <= r_end:
            ranges.remove(r)
            if r[0] < addr:
                ranges.append([r[0], addr - r[0], r[2], r[3], r[4]])
            if end < r_end:
                ranges.append([end, r_end - end, r[2], r[3], r[4]])
            return


_SEGMENT_KEYS = ("address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                 "segment_type", "is_expandable")
_BLOCK_KEYS = ("address", "size", "requested_size", "state")


def compare_segments(got: list[Mapping[str, Any]], want: list[Mapping[str, Any]], *,
                     limit: int = 20) -> list[str]:
    """Return up to ``limit`` differences between two segment lists (matched by address; frames ignored)."""
    diffs: list[str] = []
    g = {s["address"]: s for s in got}
    w = {s["address"]: s for s in want}
    for addr in sorted(set(g) | set(w)):
        if addr not in g:
            diffs.append(f"segment {addr}: recorded ({w[addr]['total_size']} B) but missing")
        elif addr not in w:
            diffs.append(f"segment {addr}: present ({g[addr]['total_size']} B) but not recorded")
        else:
            a, b = g[addr], w[addr]
            for key in _SEGMENT_KEYS:
                if a.get(key) != b.get(key):
                    diffs.append(f"segment {addr}: {key} {a.get(key)!r} != recorded {b.get(key)!r}")
            ab = [tuple(x.get(k) for k in _BLOCK_KEYS) for x in a["blocks"]]
            bb = [tuple(x.get(k) for k in _BLOCK_KEYS) for x in b["blocks"]]
            if ab != bb:
                first = next((k for k, (x, y) in enumerate(zip(ab, bb, strict=False)) if x != y), min(len(ab), len(bb)))
                diffs.append(f"segment {addr}: block {first} differs: "
                             f"{ab[first] if first < len(ab) else None} != recorded "
                             f"{bb[first] if first < len(bb) else None}")
        if len(diffs) >= limit:
            break
    return diffs

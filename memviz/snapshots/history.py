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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from memviz.errors import SnapshotError
from memviz.sim.constants import SMALL_BUFFER, SMALL_SIZE
from memviz.sim.graphs import torch_version_tuple
from memviz.sim.limits import INT64_MAX, check_index

from .device import DeviceEstimate, infer_device
from .history_pools import EarlierSnapshot, PoolAssignment, assign_pools
from .history_pools import earlier_snapshots as earlier_snapshots_of
from .load import TRACE_ACTIONS, load_snapshot
from .progress import progress_bar
from .settings import RecordedSettings, settings_from_snapshot
from .state import ALLOCATED, INACTIVE, PENDING, FrozenBlock, FrozenSegment, State

__all__ = ["TRACE_ACTION_CODES", "HistoryTimeline", "InitialBlock", "SnapshotHistory"]

#: Action codes used by :attr:`HistoryTimeline.action` (index into this tuple): the trace actions the loader knows
#: (``annotate`` carries no memory), then ``other`` for anything else.
TRACE_ACTION_CODES = (*(a for a in TRACE_ACTIONS if a != "annotate"), "other")
_CODE = {name: i for i, name in enumerate(TRACE_ACTION_CODES)}
_SEGMENT_CODES = (_CODE["segment_alloc"], _CODE["segment_free"], _CODE["segment_map"], _CODE["segment_unmap"])
_CHECKPOINT_EVERY = 2048  # events between stored states; state_at() replays at most this many


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
        earlier_snapshots: snapshots taken earlier in the same run (paths, dicts, ...): their segments
            name the private pool of segments gone by the end (:attr:`pools`), their settings the
            ``_set_allocator_settings`` calls in between (:attr:`earlier`; default: none).
        torch_version: the torch that recorded it (``torch.__version__``; a snapshot does not say): which rules
            its CUDA graph captures followed (:func:`memviz.sim.graphs.registers_generator_at_capture`;
            default: None, taken as torch 2.11's).

    Attributes beyond the arguments: :attr:`pools` (the private pool of every event), :attr:`recorded_device`
    (the device's memory as the recording bounds it) and ``verdicts`` (the fidelity reports run on it, by device
    and cap: :func:`~memviz.snapshots.check_fidelity` fills it, :func:`~memviz.snapshots.what_if` reads it).

    Runtime complexity: O(n·b) to build for n events and b blocks per segment; :meth:`state_at` replays
    at most 2048 events from the nearest stored state.

    >>> h = SnapshotHistory({"segments": [], "device_traces": [[
    ...     {"action": "segment_alloc", "addr": 0, "size": 2097152, "stream": 0},
    ...     {"action": "alloc", "addr": 0, "size": 1000, "stream": 0}]]})
    >>> [b["size"] for b in h.state_at(1)[0]["blocks"]], int(h.timeline.allocated_bytes[1])
    ([1024, 2096128], 1024)
    """

    def __init__(self, snapshot: Any, device: int = 0, *, progress: bool | None = None,
                 earlier_snapshots: Iterable[Any] = (), torch_version: str | None = None) -> None:
        device = check_index(device, "device", high=INT64_MAX, what="(a CUDA device index)")
        if torch_version is not None:
            torch_version_tuple(torch_version)  # a clear error now, not at the first replay
        self.torch_version = torch_version
        self._pools: PoolAssignment | None = None
        self._private: bool | None = None
        self._device: DeviceEstimate | None = None
        self.verdicts: dict[tuple, Any] = {}  # fidelity reports by recorded device and cap (memviz.snapshots.whatif)
        self.snapshot: dict[str, Any] = load_snapshot(snapshot)
        self.device = device
        traces = self.snapshot["device_traces"]
        if device >= len(traces) and traces:
            raise SnapshotError(f"device {device} has no trace: the snapshot has {len(traces)} device traces "
                                f"(pass device=0 to {len(traces) - 1})")
        self.events: list[dict[str, Any]] = traces[device] if device < len(traces) else []
        self.settings: RecordedSettings = settings_from_snapshot(self.snapshot)
        self.earlier: list[EarlierSnapshot] = earlier_snapshots_of(self.events, device, earlier_snapshots)
        self.settings_changes: list[tuple[int, RecordedSettings]] = self._settings_changes()
        self._change_at = dict(self.settings_changes)
        self.final_segments: list[dict[str, Any]] = [
            s for s in self.snapshot["segments"] if s.get("device", 0) == device
        ]
        self._unknown_requested: dict[int, int] = {}
        self._initial_anomalies: list[str] = []
        self._initial = self._rebuild_initial()
        self.initial_blocks: list[InitialBlock] = self._initial_blocks()
        self._checkpoints: list[tuple] = []
        self.anomalies: list[str] = []
        self.timeline: HistoryTimeline = self._play(progress)

    def __len__(self) -> int:
        return len(self.events)

    def _settings_changes(self) -> list[tuple[int, RecordedSettings]]:
        """(event index, settings) for each ``_set_allocator_settings`` that the earlier snapshots show, in force
        from that event on: right after the snapshot before the change (index 0: the settings recording started
        under, when they were not the final ones). Empty when the settings never changed."""
        earlier, final = self.earlier, self.settings
        if all(snap.settings == final for snap in earlier):
            return []
        changes = [] if earlier[0].settings == final else [(0, earlier[0].settings)]
        for k in range(1, len(earlier)):
            if earlier[k].settings != earlier[k - 1].settings:
                changes.append((earlier[k - 1].events + 1, earlier[k].settings))
        if final != earlier[-1].settings:
            changes.append((earlier[-1].events + 1, final))
        return changes

    def settings_at(self, index: int) -> RecordedSettings:
        """The allocator options in force at event ``index`` (:attr:`settings` unless they changed at run time)."""
        current = self.settings
        for at, settings in self.settings_changes:
            if at > index:
                break
            current = settings
        return current

    def _has_private_pools(self) -> bool:
        """Whether any snapshot given shows a private pool (else every segment is the device's own)."""
        if self._private is None:
            segments = [*self.final_segments, *(s for snap in self.earlier for s in snap.segments)]
            self._private = any(tuple(s.get("segment_pool_id") or (0, 0)) != (0, 0) for s in segments)
        return self._private

    @property
    def pools(self) -> PoolAssignment:
        """The private pool of every allocation and segment event (:func:`~.history_pools.assign_pools`)."""
        if self._pools is None:
            self._pools = assign_pools(self)
        return self._pools

    @property
    def recorded_device(self) -> DeviceEstimate:
        """The recording's device memory as the recording bounds it (:func:`~.device.infer_device`)."""
        if self._device is None:
            self._device = infer_device(self)
        return self._device

    # ------------------------------------------------------------------------------------------
    # Backwards: the state before the first event
    def _rebuild_initial(self) -> tuple[tuple[FrozenSegment, ...], tuple[int, int, int, int]]:
        settings = self.settings_at(0)
        fixed: dict[int, _Range] = {}  # cudaMalloc segments by address
        ranges: list[_Range] = []  # mapped ranges of expandable segments
        live: dict[int, _Live] = {}  # live blocks by address
        for s in self.final_segments:
            row = _Range(s["address"], s["total_size"], s.get("stream", 0), s["segment_type"], s.get("frames"),
                         bool(s.get("is_expandable")))
            if row.expandable:
                ranges.append(row)
            else:
                fixed[row.addr] = row
            for b in s["blocks"]:
                if b["state"] != INACTIVE:
                    live[b["address"]] = _Live(b["size"], b["requested_size"], b["state"], b.get("frames"))
        for e in reversed(self.events):
            action = e.get("action")
            if action == "alloc":
                live.pop(e["addr"], None)
            elif action == "free_requested":
                b = live.get(e["addr"])
                if b is not None:
                    b.state = ALLOCATED
            elif action == "free_completed":
                live[e["addr"]] = _Live(None, e["size"], PENDING, e.get("frames"))
            elif action == "segment_alloc":
                fixed.pop(e["addr"], None)
            elif action == "segment_free":
                size = e["size"]
                fixed[e["addr"]] = _Range(e["addr"], size, e.get("stream", 0),
                                          "small" if size <= SMALL_BUFFER else "large", e.get("frames"), False)
            elif action == "segment_map":
                _unmap_range(ranges, e["addr"], e["size"])
            elif action == "segment_unmap":
                _map_range(ranges, e["addr"], e["size"], e.get("stream", 0))
        # Lay the surviving blocks out in their segments, free gaps between them.
        rows = sorted([*fixed.values(), *ranges], key=lambda r: r.addr)
        live_addrs = sorted(live)
        k = 0
        frozen_segs = []
        allocated = active = requested = reserved = 0
        unknown = self._unknown_requested
        top = None  # the end of the last segment laid out
        for row in rows:
            addr, size, expandable = row.addr, row.size, row.expandable
            end = addr + size
            if top is not None and addr < top:
                # a recorded segment over another (the final segments and the events disagree): keep the first
                self._initial_anomalies.append(f"before event 0: segment [{addr}, {end}) overlaps the one below it")
                continue
            top = end
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
                b = live[baddr]
                limit = inside[n + 1] if n + 1 < len(inside) else end
                if b.size is None:
                    rounded = settings.round_size(b.requested)
                    gap = limit - baddr
                    small = rounded <= SMALL_SIZE
                    split = rounded < gap and settings.should_split(gap, rounded, small=small, expandable=expandable)
                    b.size = rounded if split else gap
                if baddr > cursor:
                    blocks.append(self._unknown_free(cursor, baddr - cursor, unknown))
                blocks.append(FrozenBlock(baddr, b.size, b.requested, b.state, b.frames))
                cursor = baddr + b.size
                active += b.size
                requested += b.requested
                if b.state == ALLOCATED:
                    allocated += b.size
            if cursor < end:
                blocks.append(self._unknown_free(cursor, end - cursor, unknown))
            frozen_segs.append(FrozenSegment(addr, size, row.stream, row.kind, expandable, row.frames, tuple(blocks)))
        return (tuple(frozen_segs), (allocated, active, requested, reserved))

    @staticmethod
    def _unknown_free(addr: int, size: int, unknown: dict[int, int]) -> FrozenBlock:
        """A free block whose stale ``requested_size`` is unknown yet: a negative placeholder id."""
        token = -(len(unknown) + 1)
        unknown[token] = 0
        return FrozenBlock(addr, size, token, INACTIVE, None)

    def _initial_blocks(self) -> list[InitialBlock]:
        return [InitialBlock(b.addr, b.size, b.requested, seg.stream, b.state)
                for seg in self._initial[0] for b in seg.blocks if b.state != INACTIVE]

    # ------------------------------------------------------------------------------------------
    # Forwards
    def _play(self, progress: bool | None) -> HistoryTimeline:
        events = self.events
        n = len(events)
        st = State.thaw(self._initial, self.settings_at(0))
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
            try:  # the timeline holds int64, as torch's counters do
                allocated[i] = st.allocated
                active[i] = st.active
                requested[i] = st.requested
                reserved[i] = st.reserved
                if times is not None:
                    times[i] = e.get("time_us", 0)
            except (OverflowError, TypeError):
                raise SnapshotError(
                    f"device_traces[{self.device}][{i}] ({action}): the memory totals after it "
                    f"({st.reserved} B reserved, {st.allocated} B allocated) or its time_us "
                    f"({e.get('time_us')!r}) are not int64 numbers; the snapshot is not one torch recorded"
                ) from None
            codes[i] = code_of(action, other)
        if bar is not None:
            bar.update(n - bar.n)
            bar.close()
        self.anomalies = self._initial_anomalies + st.anomalies
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
                return "small" if self.settings_at(i).round_size(e["size"]) <= SMALL_SIZE else "large"
        return "large"

    def _resolve_unknown(self, final: State) -> None:
        """Give free blocks that predate recording the stale ``requested_size`` the final snapshot shows."""
        recorded = {}
        for s in self.final_segments:
            for b in s["blocks"]:
                if b["state"] == INACTIVE:
                    recorded[b["address"]] = b["requested_size"]
        for b in final.by_addr.values():
            if b.state == INACTIVE and b.requested < 0 and b.addr in recorded:
                self._unknown_requested[b.requested] = recorded[b.addr]

    # ------------------------------------------------------------------------------------------
    # Queries
    def _state(self, index: int) -> State:
        n = len(self.events)
        if not -n <= index < n:
            raise IndexError(f"event index {index} out of range for a trace of {n} events")
        index %= n
        if index == n - 1:
            return self._final_state
        c = index // _CHECKPOINT_EVERY
        st = State.thaw(self._checkpoints[c], self.settings_at(c * _CHECKPOINT_EVERY))
        events = self.events
        apply = self._apply
        for i in range(c * _CHECKPOINT_EVERY, index + 1):
            apply(st, i, events[i])
        return st

    def _apply(self, st: State, i: int, e: dict[str, Any]) -> None:
        """Play trace event ``e`` (number ``i``) onto ``st``; actions that change no block are skipped."""
        if self._change_at and i in self._change_at:
            st.settings = self._change_at[i]
        action = e["action"]
        if action == "alloc":
            st.alloc(i, e["addr"], e["size"], e.get("frames"))
        elif action == "free_requested":
            st.free_requested(i, e["addr"])
        elif action == "free_completed":
            st.free_completed(i, e["addr"])
        elif action == "segment_alloc":
            st.segment_alloc(i, e["addr"], e["size"], e.get("stream", 0), e.get("frames"))
        elif action == "segment_free":
            st.segment_free(i, e["addr"], e["size"])
        elif action == "segment_map":
            st.segment_map(i, e["addr"], e["size"], e.get("stream", 0), self._kind_after(i), e.get("frames"))
        elif action == "segment_unmap":
            st.segment_unmap(i, e["addr"], e["size"])

    def _export(self, st: State, index: int) -> list[dict[str, Any]]:
        unknown = self._unknown_requested
        device = self.device
        pools = self.pools if self._has_private_pools() else None
        out = []
        for addr in st.starts:
            s = st.segs[addr]
            blocks = []
            allocated = active = requested = 0
            for b in s.blocks:
                req = unknown.get(b.requested, 0) if b.requested < 0 else b.requested
                blocks.append({"address": b.addr, "size": b.size, "requested_size": req, "state": b.state,
                               "frames": b.frames if b.frames is not None else []})
                if b.state != INACTIVE:
                    active += b.size
                    requested += req
                    if b.state == ALLOCATED:
                        allocated += b.size
            out.append({
                "device": device, "address": s.addr, "total_size": s.size, "allocated_size": allocated,
                "active_size": active, "requested_size": requested, "stream": s.stream,
                "segment_type": s.kind, "is_expandable": s.expandable,
                "segment_pool_id": (0, 0) if pools is None else pools.pool_at(index, s.addr),
                "frames": s.frames if s.frames is not None else [], "blocks": blocks,
            })
        return out

    def state_at(self, index: int) -> list[dict[str, Any]]:
        """Return the segments right after event ``index``, shaped like ``_snapshot()["segments"]``.

        Segments are sorted by address; each has ``address, total_size, allocated_size, active_size,
        requested_size, stream, segment_type, is_expandable, segment_pool_id, blocks`` (bytes; the pool as
        :attr:`pools` names it), and each block
        ``address, size, requested_size, state, frames``. Negative indices count from the end.

        Runtime complexity: O(2048 + s) (replay from the nearest stored state, s = live blocks).
        """
        return self._export(self._state(index), index % len(self.events))

    def initial_state(self) -> list[dict[str, Any]]:
        """Return the segments before the first event (what recording started from), like :meth:`state_at`."""
        return self._export(State.thaw(self._initial, self.settings_at(0)), -1)

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
                free = b["state"] == INACTIVE
                assert not (free and prev_free), f"segment {s['address']}: unmerged free blocks at {cursor}"
                prev_free = free
                cursor += b["size"]
            assert cursor == s["address"] + s["total_size"], f"segment {s['address']}: blocks do not fill it"


@dataclass
class _Range:
    """A segment, or a mapped range of an expandable segment, while the start state is rebuilt."""

    addr: int
    size: int
    stream: int
    kind: str
    frames: Any
    expandable: bool


@dataclass
class _Live:
    """A block live at the start, while the start state is rebuilt (``size`` None: not known yet)."""

    size: int | None
    requested: int
    state: str
    frames: Any


def _map_range(ranges: list[_Range], addr: int, size: int, stream: int) -> None:
    """Add the mapped range [addr, addr+size) to ``ranges``, merging with touching ranges of the stream."""
    end = addr + size
    kind = "large"
    for r in list(ranges):
        if r.stream == stream and (r.addr + r.size == addr or r.addr == end):
            kind = r.kind
            ranges.remove(r)
            addr, end = min(addr, r.addr), max(end, r.addr + r.size)
    ranges.append(_Range(addr, end - addr, stream, kind, None, True))


def _unmap_range(ranges: list[_Range], addr: int, size: int) -> None:
    """Remove [addr, addr+size) from the mapped range holding it, splitting the range if needed."""
    end = addr + size
    for r in ranges:
        r_end = r.addr + r.size
        if r.addr <= addr and end <= r_end:
            ranges.remove(r)
            if r.addr < addr:
                ranges.append(_Range(r.addr, addr - r.addr, r.stream, r.kind, r.frames, True))
            if end < r_end:
                ranges.append(_Range(end, r_end - end, r.stream, r.kind, r.frames, True))
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

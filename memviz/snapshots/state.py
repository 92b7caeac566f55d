"""The allocator state a :class:`~memviz.snapshots.SnapshotHistory` plays events onto: segments and blocks.

:class:`State` holds the segments sorted by address plus an address → block map, and applies one trace
event at a time with the allocator's split and merge rules (spec §4.2, §5, §6.2). An event that does not
fit the state (a free of no block, a segment over another) is recorded in ``anomalies`` and changes
nothing, so a hostile or inconsistent trace never corrupts it. :meth:`State.freeze` / :meth:`State.thaw`
copy it to and from plain tuples (:class:`FrozenSegment`, :class:`FrozenBlock`) for checkpoints.
All sizes and addresses are bytes.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from typing import Any, NamedTuple

from memviz.sim.constants import SMALL_BUFFER, SMALL_SIZE

from .settings import RecordedSettings

__all__ = ["ALLOCATED", "INACTIVE", "PENDING", "Block", "FrozenBlock", "FrozenSegment", "Segment", "State"]

ALLOCATED, PENDING, INACTIVE = "active_allocated", "active_pending_free", "inactive"


class FrozenBlock(NamedTuple):
    """A block in a checkpoint: address, size, requested size (negative: a placeholder), state, frames."""

    addr: int
    size: int
    requested: int
    state: str
    frames: Any


class FrozenSegment(NamedTuple):
    """A segment in a checkpoint, with its blocks in address order."""

    addr: int
    size: int
    stream: int
    kind: str
    expandable: bool
    frames: Any
    blocks: tuple[FrozenBlock, ...]


class Block:
    """A block of a segment: ``requested`` is the stale request of a free block (negative: not known yet)."""

    __slots__ = ("addr", "frames", "requested", "seg", "size", "state")

    def __init__(self, addr: int, size: int, requested: int, state: str, frames: Any, seg: Segment) -> None:
        self.addr, self.size, self.requested, self.state, self.frames, self.seg = (
            addr, size, requested, state, frames, seg)


class Segment:
    """A segment (or an expandable segment's mapped range) and its blocks in address order."""

    __slots__ = ("addr", "blocks", "expandable", "frames", "kind", "size", "stream")

    def __init__(self, addr: int, size: int, stream: int, kind: str, expandable: bool, frames: Any) -> None:
        self.addr, self.size, self.stream, self.kind, self.expandable, self.frames = (
            addr, size, stream, kind, expandable, frames)
        self.blocks: list[Block] = []


class State:
    """Segments sorted by address plus an address → block map; mutated by :meth:`apply`."""

    def __init__(self, settings: RecordedSettings) -> None:
        self.settings = settings
        self.starts: list[int] = []
        self.segs: dict[int, Segment] = {}
        self.by_addr: dict[int, Block] = {}
        self.allocated = self.active = self.requested = self.reserved = 0
        self.anomalies: list[str] = []

    # -- segments -------------------------------------------------------------------------------
    def overlaps(self, addr: int, size: int) -> bool:
        """Whether ``[addr, addr + size)`` meets a segment already in the state."""
        i = bisect_left(self.starts, addr + size) - 1
        return i >= 0 and self.starts[i] + self.segs[self.starts[i]].size > addr

    def add_segment(self, seg: Segment) -> None:
        insort(self.starts, seg.addr)
        self.segs[seg.addr] = seg
        for b in seg.blocks:
            self.by_addr[b.addr] = b

    def drop_segment(self, seg: Segment) -> None:
        self.starts.remove(seg.addr)
        del self.segs[seg.addr]
        by_addr = self.by_addr
        for b in seg.blocks:
            if by_addr.get(b.addr) is b:
                del by_addr[b.addr]

    def segment_at(self, addr: int) -> Segment | None:
        i = bisect_right(self.starts, addr) - 1
        if i < 0:
            return None
        seg = self.segs[self.starts[i]]
        return seg if addr < seg.addr + seg.size else None

    def _rekey(self, seg: Segment, new_addr: int) -> None:
        self.starts.remove(seg.addr)
        del self.segs[seg.addr]
        seg.addr = new_addr
        insort(self.starts, new_addr)
        self.segs[new_addr] = seg

    # -- events ---------------------------------------------------------------------------------
    def alloc(self, i: int, addr: int, size: int, frames: Any) -> None:
        b = self.by_addr.get(addr)
        if b is None or b.state != INACTIVE:
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
            nb = Block(addr, rounded, size, ALLOCATED, frames, seg)
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
            b.state, b.requested, b.frames = ALLOCATED, size, frames
        self.allocated += b.size
        self.active += b.size
        self.requested += size

    def _carve(self, i: int, addr: int) -> Block | None:
        """Find the free block containing ``addr`` and split off its head so a block starts at ``addr``."""
        seg = self.segment_at(addr)
        if seg is not None:
            for b in seg.blocks:
                if b.addr < addr < b.addr + b.size and b.state == INACTIVE:
                    head = Block(b.addr, addr - b.addr, b.requested, INACTIVE, None, seg)
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
        if b is None or b.state != ALLOCATED:
            self.anomalies.append(f"event {i}: free_requested at {addr}, where no block is allocated")
            return
        b.state = PENDING
        self.allocated -= b.size

    def free_completed(self, i: int, addr: int) -> None:
        b = self.by_addr.get(addr)
        if b is None or b.state == INACTIVE:
            self.anomalies.append(f"event {i}: free_completed at {addr}, where no block is active")
            return
        if b.state == ALLOCATED:
            self.allocated -= b.size
        self.active -= b.size
        self.requested -= b.requested
        b.state, b.frames = INACTIVE, None
        blocks = b.seg.blocks
        j = blocks.index(b)
        by_addr = self.by_addr
        if j + 1 < len(blocks) and blocks[j + 1].state == INACTIVE:
            nxt = blocks.pop(j + 1)
            del by_addr[nxt.addr]
            b.size += nxt.size
        if j > 0 and blocks[j - 1].state == INACTIVE:
            prv = blocks.pop(j - 1)
            del by_addr[b.addr]
            b.addr = prv.addr
            b.size += prv.size
            by_addr[b.addr] = b
        if b.seg.addr == b.addr and b.seg.blocks[0] is not b:
            self.anomalies.append(f"event {i}: merge order broken at {addr}")

    def segment_alloc(self, i: int, addr: int, size: int, stream: int, frames: Any) -> None:
        if self.overlaps(addr, size):
            self.anomalies.append(f"event {i}: segment_alloc of [{addr}, {addr + size}) over another segment")
            return
        kind = "small" if size <= SMALL_BUFFER else "large"
        seg = Segment(addr, size, stream, kind, False, frames)
        seg.blocks.append(Block(addr, size, 0, INACTIVE, None, seg))
        self.add_segment(seg)
        self.reserved += size

    def segment_free(self, i: int, addr: int, size: int) -> None:
        seg = self.segs.get(addr)
        if seg is None:
            self.anomalies.append(f"event {i}: segment_free at {addr}, where no segment starts")
            return
        if len(seg.blocks) != 1 or seg.blocks[0].state != INACTIVE:
            self.anomalies.append(f"event {i}: segment_free at {addr} of a segment that is not one free block")
        self.drop_segment(seg)
        self.reserved -= seg.size

    def segment_map(self, i: int, addr: int, size: int, stream: int, kind: str, frames: Any) -> None:
        end = addr + size
        if self.overlaps(addr, size):
            self.anomalies.append(f"event {i}: segment_map of [{addr}, {end}) over a mapped range")
            return
        prev = self.segment_at(addr - 1) if addr else None
        if prev is not None and not (prev.expandable and prev.stream == stream
                                     and prev.addr + prev.size == addr):
            prev = None
        nxt = self.segs.get(end)
        if nxt is not None and not (nxt.expandable and nxt.stream == stream):
            nxt = None
        self.reserved += size
        if prev is None and nxt is None:
            seg = Segment(addr, size, stream, kind, True, frames)
            seg.blocks.append(Block(addr, size, 0, INACTIVE, None, seg))
            self.add_segment(seg)
            return
        if prev is None:
            assert nxt is not None
            first = nxt.blocks[0]
            self._rekey(nxt, addr)
            nxt.size += size
            if first.state == INACTIVE:
                del self.by_addr[first.addr]
                first.addr = addr
                first.size += size
                self.by_addr[addr] = first
            else:
                nb = Block(addr, size, 0, INACTIVE, None, nxt)
                nxt.blocks.insert(0, nb)
                self.by_addr[addr] = nb
            return
        last = prev.blocks[-1]
        prev.size += size
        if last.state == INACTIVE:
            last.size += size
        else:
            last = Block(addr, size, 0, INACTIVE, None, prev)
            prev.blocks.append(last)
            self.by_addr[addr] = last
        if nxt is not None:
            self.starts.remove(nxt.addr)
            del self.segs[nxt.addr]
            prev.size += nxt.size
            blocks = nxt.blocks
            if blocks[0].state == INACTIVE:
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
        if b.state != INACTIVE or end > b.addr + b.size:
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
            tail = Block(end, b_end - end, 0 if addr > b.addr else b.requested, INACTIVE, None, seg)
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
            rseg = Segment(end, seg_end - end, seg.stream, seg.kind, True, seg.frames)
            rseg.blocks = right
            for rb in right:
                rb.seg = rseg
            insort(self.starts, end)
            self.segs[end] = rseg

    # -- copies ---------------------------------------------------------------------------------
    def freeze(self) -> tuple[tuple[FrozenSegment, ...], tuple[int, int, int, int]]:
        """Copy the state: its segments, and the (allocated, active, requested, reserved) totals."""
        segs = self.segs
        new = tuple.__new__  # the NamedTuples' own __new__ is a Python call per block: 9% of a history build
        return (
            tuple(
                new(FrozenSegment, (s.addr, s.size, s.stream, s.kind, s.expandable, s.frames,
                                    tuple(new(FrozenBlock, (b.addr, b.size, b.requested, b.state, b.frames))
                                          for b in s.blocks)))
                for s in (segs[a] for a in self.starts)
            ),
            (self.allocated, self.active, self.requested, self.reserved),
        )

    @classmethod
    def thaw(cls, frozen: tuple[tuple[FrozenSegment, ...], tuple[int, int, int, int]],
             settings: RecordedSettings) -> State:
        """Rebuild a state from :meth:`freeze`'s copy."""
        st = cls(settings)
        seg_rows, totals = frozen
        st.allocated, st.active, st.requested, st.reserved = totals
        for addr, size, stream, kind, expandable, frames, block_rows in seg_rows:
            seg = Segment(addr, size, stream, kind, expandable, frames)
            seg.blocks = [Block(ba, bs, br, bst, bf, seg) for ba, bs, br, bst, bf in block_rows]
            st.starts.append(addr)
            st.segs[addr] = seg
            for b in seg.blocks:
                st.by_addr[b.addr] = b
        return st

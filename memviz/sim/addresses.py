"""A model of how the CUDA driver assigns device virtual addresses.

Byte stats never depend on addresses, but layouts do: the allocator breaks ties between
equal-size free blocks by the lowest address, so the order in which the driver places segments
decides which block a request splits. The rules below were read off the ``segment_alloc`` /
``segment_free`` events recorded on an H200 (driver 580, CUDA 13; see tests/data/golden). Replayed
against the recorded frees, they predict the driver's address for 1546 of the 1556 recorded
``cudaMalloc`` calls; the other 10 follow from a 32 MiB range that something else in the process
mapped meanwhile (see below).

The driver manages ``cudaMalloc`` address space in two levels:

- **Reservations** ("VA blocks") are whole 32 MiB chunks (``CHUNK``). A ``cudaMalloc`` that needs
  a new reservation takes ``ceil(size / CHUNK)`` chunks and starts at its bottom; the rest of the
  last chunk stays free inside the reservation. A reservation goes back to the free space only when
  every range in it has been freed; adjacent free chunks merge.
- **Ranges inside reservations.** ``cudaMalloc`` first looks for room in the reservations it already
  has, newest reservation first; inside one it takes the smallest free gap that fits (lowest
  address on a tie) and starts at the gap's bottom. Any size can land there: a small request
  continues in the unused tail of a big one's last chunk, and a big request reuses the space freed
  by an earlier one while the reservation is still held by a small neighbour.
- **New reservations** go top-down: into the highest run of free chunks *strictly longer* than
  needed (a run of exactly the needed length is passed over), at the run's top; failing that,
  directly below the lowest reservation (fresh address space grows downwards).

A fresh process already holds the address space above ``MALLOC_TOP`` (the CUDA context's own
mappings), except two free gaps that the first small segments fill: 24 MiB at the top of one
chunk and 2 MiB at the top of a lower one (the lower gap is tried first). Those offsets were the same in
every recording. Something else in the process occasionally maps a further chunk by the same
rules (twice per process in two of the recordings, once in another); that cannot be predicted from
the allocator's calls, so it is not modelled.

Expandable segments reserve their (very large) address ranges bottom-up from ``RESERVE_BASE``,
each aligned to a chunk, reusing the lowest gap that fits.

The address space is finite, as the driver's is (47 bits of user space on x86-64): ``cudaMalloc`` ranges
lie in ``[VA_SPLIT, MALLOC_TOP)`` and reservations in ``[RESERVE_BASE, VA_SPLIT)``. A request that finds
no room there fails like the driver call (``malloc`` / ``reserve`` return None, and the allocator treats
it as a failed ``cudaMalloc``), so every address is positive, below 2**47, and ranges never overlap. With
devices of at most ``memviz.sim.limits.MAX_DEVICE_BYTES`` (16 TiB) that takes a pathological layout.

Exact driver values are not reproducible (they depend on everything else the process mapped), so
the addresses are a model; what the simulator relies on is their relative order.

Cost: O(log n) per call for n live reservations (plus a C-level list insert). Two max-trees
(:class:`_MaxTree`) answer the two searches without a scan: one over reservation creation order
holds each reservation's largest free gap ("the newest reservation with a gap that fits"); one over
chunk positions below ``MALLOC_TOP`` holds the free run above each reservation ("the highest run
longer than needed"). Inside a reservation the free gaps are a sorted list of ``len << 48 | start``
keys, so "smallest gap that fits, lowest address on a tie" is one ``bisect_left``.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from .constants import MiB

__all__ = ["AddressSpace"]

CHUNK = 32 << 20  # bytes: the driver's VA reservation granularity observed for cudaMalloc
MALLOC_TOP = 0x7FE000000000  # first byte held by the CUDA context; cudaMalloc space lies below
RESERVE_BASE = 0x302000000  # where cuMemAddressReserve ranges start (observed)
VA_SPLIT = 1 << 46  # 64 TiB: cudaMalloc ranges stay above, expandable reservations below (see below)

# Free gaps the CUDA context leaves in its own chunks, relative to MALLOC_TOP: (chunk base, gap
# start) in MiB, oldest first (the newest reservation is searched first).
_CONTEXT_GAPS = ((480, 488), (384, 414))
_GAP_SHIFT = 48  # gap keys are len << 48 | start: addresses are below 2**48, so keys order (len, start)
_GAP_MASK = (1 << _GAP_SHIFT) - 1


class _MaxTree:
    """A max segment tree over leaves ``0 .. cap-1`` (all 0 at first), growing on demand.

    ``tree[cap + i]`` is leaf ``i``; ``tree[j]`` is the max of ``tree[2j]`` and ``tree[2j + 1]``.
    """

    __slots__ = ("cap", "tree")

    def __init__(self, cap: int = 64) -> None:
        self.cap = cap
        self.tree = [0] * (2 * cap)

    def set(self, i: int, value: int) -> None:
        """Set leaf ``i`` to ``value`` (``i`` may lie beyond the current capacity)."""
        if i >= self.cap:
            self.rebuild(self.leaves(), i + 1)
        tree = self.tree
        j = self.cap + i
        tree[j] = value
        j >>= 1
        while j:  # refresh the ancestors; stop where the max no longer changes
            left = tree[2 * j]
            right = tree[2 * j + 1]
            m = left if left > right else right
            if tree[j] == m:
                break
            tree[j] = m
            j >>= 1

    def leaves(self) -> list[int]:
        return self.tree[self.cap:]

    def rebuild(self, leaves: list[int], size: int) -> None:
        """Replace the leaves, with room for at least ``size`` of them."""
        cap = self.cap
        while cap < size:
            cap *= 2
        tree = [0] * cap + leaves + [0] * (cap - len(leaves))
        for j in range(cap - 1, 0, -1):
            left = tree[2 * j]
            right = tree[2 * j + 1]
            tree[j] = left if left > right else right
        self.cap = cap
        self.tree = tree

    def first_above(self, value: int) -> int:
        """Return the lowest leaf index holding more than ``value``, or -1."""
        tree = self.tree
        if tree[1] <= value:
            return -1
        j = 1
        cap = self.cap
        while j < cap:
            j *= 2
            if tree[j] <= value:
                j += 1
        return j - cap

    def last_at_least(self, value: int) -> int:
        """Return the highest leaf index holding at least ``value``, or -1."""
        tree = self.tree
        if tree[1] < value:
            return -1
        j = 1
        cap = self.cap
        while j < cap:
            j = 2 * j + 1
            if tree[j] < value:
                j -= 1
        return j - cap


class _Reservation:
    """One VA block: ``[lo, hi)``, chunk-aligned, with ``count`` live ``cudaMalloc`` ranges.

    Its free gaps are kept three ways: ``gaps``, sorted keys ``len << 48 | start``; ``gap_end``,
    start -> end; ``gap_start``, end -> start (to merge a freed range with the gaps around it).
    ``slot`` is its leaf in the creation-order tree; ``permanent`` marks the CUDA context's chunks.
    """

    __slots__ = ("count", "gap_end", "gap_start", "gaps", "hi", "lo", "permanent", "slot")

    def __init__(self, lo: int, hi: int, slot: int, permanent: bool = False) -> None:
        self.lo = lo
        self.hi = hi
        self.slot = slot
        self.permanent = permanent
        self.count = 0
        self.gaps: list[int] = []
        self.gap_end: dict[int, int] = {}
        self.gap_start: dict[int, int] = {}

    def add_gap(self, start: int, end: int) -> None:
        insort(self.gaps, (end - start) << _GAP_SHIFT | start)
        self.gap_end[start] = end
        self.gap_start[end] = start

    def remove_gap(self, start: int, end: int) -> None:
        gaps = self.gaps
        del gaps[bisect_left(gaps, (end - start) << _GAP_SHIFT | start)]
        del self.gap_end[start]
        del self.gap_start[end]

    def max_gap(self) -> int:
        """Length in bytes of the largest free gap (0 if none)."""
        gaps = self.gaps
        return gaps[-1] >> _GAP_SHIFT if gaps else 0

    def take(self, size: int) -> int:
        """Place ``size`` bytes at the bottom of the smallest gap that fits (lowest on a tie); return it.

        The caller knows that a gap fits (``max_gap() >= size``).
        """
        gaps = self.gaps
        i = bisect_left(gaps, size << _GAP_SHIFT)
        key = gaps[i]
        del gaps[i]
        start = key & _GAP_MASK
        end = self.gap_end.pop(start)
        if (key >> _GAP_SHIFT) > size:
            insort(gaps, (end - start - size) << _GAP_SHIFT | (start + size))
            self.gap_end[start + size] = end
            self.gap_start[end] = start + size
        else:
            del self.gap_start[end]
        self.count += 1
        return start

    def give_back(self, ptr: int, size: int) -> None:
        """Free the range ``[ptr, ptr + size)``, merging it with the free gaps on either side."""
        start, end = ptr, ptr + size
        below = self.gap_start.get(start)
        if below is not None:
            self.remove_gap(below, start)
            start = below
        above = self.gap_end.get(end)
        if above is not None:
            self.remove_gap(end, above)
            end = above
        self.add_gap(start, end)
        self.count -= 1


class AddressSpace:
    """Hands out and takes back device addresses for segments.

    ``malloc(size)`` / ``free(ptr)`` model ``cudaMalloc`` / ``cudaFree``; ``reserve(size)`` /
    ``unreserve(ptr)`` model ``cuMemAddressReserve`` / ``cuMemAddressFree`` for expandable segments.
    Runtime complexity of ``malloc`` / ``free``: O(log n) for n live reservations, plus list inserts.
    """

    def __init__(self) -> None:
        # newest-first search: leaf ``slot`` of _gap_tree is the largest free gap of the
        # reservation created ``slot``-th (creation order; slots are renumbered when they run out)
        self._gap_tree = _MaxTree()
        self._by_slot: list[_Reservation | None] = [None] * self._gap_tree.cap
        self._next_slot = 0
        # top-down search: leaf k of _run_tree is the free run, in chunks, directly above the
        # reservation whose top is k chunks below MALLOC_TOP (up to the next reservation or MALLOC_TOP)
        self._run_tree = _MaxTree()
        self._lows: list[int] = []  # sorted ``lo`` of the reservations below MALLOC_TOP
        self._by_lo: dict[int, _Reservation] = {}
        self._owner: dict[int, tuple[_Reservation, int]] = {}  # ptr -> (reservation, size) of a live range
        self._reserved: dict[int, int] = {}  # ptr -> size of reserved VA ranges (expandable)
        self._reserved_starts: list[int] = []  # sorted keys of _reserved
        for base, gap in _CONTEXT_GAPS:
            block = self._new_block(MALLOC_TOP + base * MiB, MALLOC_TOP + base * MiB + CHUNK, True)
            block.add_gap(MALLOC_TOP + gap * MiB, block.hi)  # the context's own mapping lies below the gap
            self._gap_tree.set(block.slot, block.max_gap())

    def _new_block(self, lo: int, hi: int, permanent: bool = False) -> _Reservation:
        """Create a reservation in the next creation slot (its gap-tree leaf is left at 0)."""
        if self._next_slot == self._gap_tree.cap:
            self._renumber()
        block = _Reservation(lo, hi, self._next_slot, permanent)
        self._by_slot[block.slot] = block
        self._next_slot += 1
        return block

    def _renumber(self) -> None:
        """Give the live reservations slots 0, 1, ... in creation order, doubling the room if half is used."""
        blocks = [b for b in self._by_slot if b is not None]
        tree = self._gap_tree
        size = tree.cap * 2 if 2 * len(blocks) >= tree.cap else tree.cap
        for slot, block in enumerate(blocks):
            block.slot = slot
        tree.rebuild([b.max_gap() for b in blocks], size)
        self._by_slot = blocks + [None] * (tree.cap - len(blocks))
        self._next_slot = len(blocks)

    def malloc(self, size: int) -> int | None:
        """Return the address ``cudaMalloc(size)`` would give (size in bytes, a multiple of 2 MiB), or None
        when no address range that large is left (nothing changes then)."""
        gap_tree = self._gap_tree
        slot = gap_tree.last_at_least(size)  # the newest reservation with a gap that fits
        if slot >= 0:
            block = self._by_slot[slot]
            ptr = block.take(size)
            gap_tree.set(slot, block.max_gap())
        else:
            need = -(-size // CHUNK) * CHUNK
            ptr = self._new_reservation(need)
            if ptr is None:
                return None
            block = self._new_block(ptr, ptr + need)
            block.count = 1
            if need > size:  # the rest of the last chunk stays free inside the reservation
                block.add_gap(ptr + size, ptr + need)
                gap_tree.set(block.slot, need - size)
            insort(self._lows, ptr)
            self._by_lo[ptr] = block
        self._owner[ptr] = (block, size)
        return ptr

    def _new_reservation(self, need: int) -> int | None:
        """Base of ``need`` bytes (whole chunks) at the top of the highest free run longer than that, or
        None when fresh space below every reservation would cross ``VA_SPLIT``.

        Updates the run tree for the new reservation (the caller records it in _lows / _by_lo).
        """
        runs = self._run_tree
        n = need // CHUNK
        k = runs.first_above(n)  # the highest reservation with a free run of more than n chunks above it
        if k >= 0:
            run = runs.tree[runs.cap + k]
            top = MALLOC_TOP - (k - run) * CHUNK  # the run's top
            runs.set(k, run - n)  # what is left of the run lies below the new reservation
        else:
            lows = self._lows
            top = lows[0] if lows else MALLOC_TOP  # fresh address space below everything
            if top - need < VA_SPLIT:
                return None
        runs.set((MALLOC_TOP - top) // CHUNK, 0)  # the new reservation ends where the run ended
        return top - need

    def free(self, ptr: int) -> None:
        """Give back the range that ``malloc`` returned at ``ptr``."""
        block, size = self._owner.pop(ptr)
        if block.count == 1 and not block.permanent:
            self._drop(block)
        else:
            block.give_back(ptr, size)
            self._gap_tree.set(block.slot, block.max_gap())

    def _drop(self, block: _Reservation) -> None:
        """Return an empty reservation's chunks to the free space."""
        self._gap_tree.set(block.slot, 0)
        self._by_slot[block.slot] = None
        lows = self._lows
        i = bisect_left(lows, block.lo)
        del lows[i]
        del self._by_lo[block.lo]
        runs = self._run_tree
        k = (MALLOC_TOP - block.hi) // CHUNK
        freed = runs.tree[runs.cap + k] + (block.hi - block.lo) // CHUNK  # its run and its own chunks
        runs.set(k, 0)
        if i > 0:  # the reservation below it gets them as its run; below the lowest all is free anyway
            below = self._by_lo[lows[i - 1]]
            kb = (MALLOC_TOP - below.hi) // CHUNK
            runs.set(kb, runs.tree[runs.cap + kb] + freed)

    def reserve(self, size: int) -> int | None:
        """Return the base of a new reserved VA range of ``size`` bytes (lowest chunk-aligned gap), or None
        when no gap below ``VA_SPLIT`` is that large."""
        ptr = RESERVE_BASE
        reserved = self._reserved
        for start in self._reserved_starts:
            if start - ptr >= size:
                break
            ptr = max(ptr, -(-(start + reserved[start]) // CHUNK) * CHUNK)
        if ptr + size > VA_SPLIT:
            return None
        reserved[ptr] = size
        insort(self._reserved_starts, ptr)
        return ptr

    def unreserve(self, ptr: int) -> None:
        """Release a range returned by ``reserve``."""
        del self._reserved[ptr]
        del self._reserved_starts[bisect_left(self._reserved_starts, ptr)]

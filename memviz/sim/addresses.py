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

Exact driver values are not reproducible (they depend on everything else the process mapped), so
the addresses are a model; what the simulator relies on is their relative order.
"""

from __future__ import annotations

from bisect import bisect_left, insort

__all__ = ["AddressSpace"]

CHUNK = 32 << 20  # bytes: the driver's VA reservation granularity observed for cudaMalloc
MALLOC_TOP = 0x7FE000000000  # first byte held by the CUDA context; cudaMalloc space lies below
RESERVE_BASE = 0x302000000  # where cuMemAddressReserve ranges start (observed)
_MiB = 1 << 20
# Free gaps the CUDA context leaves in its own chunks, relative to MALLOC_TOP: (chunk base, gap
# start) in MiB, oldest first (the newest reservation is searched first).
_CONTEXT_GAPS = ((480, 488), (384, 414))


class _Reservation:
    """One VA block: ``[lo, hi)``, chunk-aligned, holding ``cudaMalloc`` ranges ``ptr -> size``."""

    __slots__ = ("hi", "lo", "permanent", "ranges", "starts")

    def __init__(self, lo: int, hi: int, permanent: bool = False) -> None:
        self.lo = lo
        self.hi = hi
        self.ranges: dict[int, int] = {}
        self.starts: list[int] = []  # sorted keys of ranges
        self.permanent = permanent

    def add(self, ptr: int, size: int) -> None:
        self.ranges[ptr] = size
        insort(self.starts, ptr)

    def remove(self, ptr: int) -> None:
        del self.ranges[ptr]
        del self.starts[bisect_left(self.starts, ptr)]

    def best_gap(self, size: int) -> int | None:
        """Start of the smallest free gap of at least ``size`` bytes (lowest on a tie), or None."""
        best = None
        best_len = 0
        pos = self.lo
        ranges = self.ranges
        for start in self.starts:
            gap = start - pos
            if gap >= size and (best is None or gap < best_len):
                best, best_len = pos, gap
            pos = start + ranges[start]
        gap = self.hi - pos
        if gap >= size and (best is None or gap < best_len):
            best = pos
        return best


class AddressSpace:
    """Hands out and takes back device addresses for segments.

    ``malloc(size)`` / ``free(ptr)`` model ``cudaMalloc`` / ``cudaFree``; ``reserve(size)`` /
    ``unreserve(ptr)`` model ``cuMemAddressReserve`` / ``cuMemAddressFree`` for expandable segments.
    Runtime complexity: O(number of live reservations + ranges in the one searched) per call.
    """

    def __init__(self) -> None:
        self._blocks: list[_Reservation] = []  # creation order: the newest is searched first
        self._lows: list[int] = []  # sorted ``lo`` of the reservations below MALLOC_TOP
        self._by_lo: dict[int, _Reservation] = {}
        self._owner: dict[int, _Reservation] = {}  # ptr -> reservation of a live cudaMalloc range
        self._reserved: dict[int, int] = {}  # ptr -> size of reserved VA ranges (expandable)
        for base, gap in _CONTEXT_GAPS:
            block = _Reservation(MALLOC_TOP + base * _MiB, MALLOC_TOP + base * _MiB + CHUNK, True)
            block.add(block.lo, (gap - base) * _MiB)  # the context's own mapping below the gap
            self._blocks.append(block)

    def malloc(self, size: int) -> int:
        """Return the address ``cudaMalloc(size)`` would give (size in bytes, a multiple of 2 MiB)."""
        for block in reversed(self._blocks):
            ptr = block.best_gap(size)
            if ptr is not None:
                break
        else:
            need = -(-size // CHUNK) * CHUNK
            lo = self._new_reservation(need)
            block = _Reservation(lo, lo + need)
            self._blocks.append(block)
            insort(self._lows, lo)
            self._by_lo[lo] = block
            ptr = lo
        block.add(ptr, size)
        self._owner[ptr] = block
        return ptr

    def _new_reservation(self, need: int) -> int:
        """Base of ``need`` bytes (whole chunks) at the top of the highest free run longer than that."""
        lows = self._lows
        by_lo = self._by_lo
        top = MALLOC_TOP
        for i in range(len(lows) - 1, -1, -1):
            block = by_lo[lows[i]]
            if top - block.hi > need:
                return top - need
            top = block.lo
        return top - need  # fresh address space below everything

    def free(self, ptr: int) -> None:
        """Give back the range that ``malloc`` returned at ``ptr``."""
        block = self._owner.pop(ptr)
        block.remove(ptr)
        if not block.ranges and not block.permanent:
            self._blocks.remove(block)
            del self._lows[bisect_left(self._lows, block.lo)]
            del self._by_lo[block.lo]

    def reserve(self, size: int) -> int:
        """Return the base of a new reserved VA range of ``size`` bytes (lowest chunk-aligned gap)."""
        ptr = RESERVE_BASE
        for start in sorted(self._reserved):
            if start - ptr >= size:
                break
            ptr = max(ptr, -(-(start + self._reserved[start]) // CHUNK) * CHUNK)
        self._reserved[ptr] = size
        return ptr

    def unreserve(self, ptr: int) -> None:
        """Release a range returned by ``reserve``."""
        del self._reserved[ptr]

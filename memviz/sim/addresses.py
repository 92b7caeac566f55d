"""A model of how the CUDA driver assigns device virtual addresses.

Byte stats never depend on addresses, but layouts do: the allocator breaks ties between
equal-size free blocks by the lowest address, so the order in which the driver places segments
decides which block a request splits. The rules below were read off the ``segment_alloc`` events
recorded on an H200 (driver 580, CUDA 13; see tests/data/golden):

- ``cudaMalloc`` works in 32 MiB-aligned chunks of virtual address space (``CHUNK``) handed out
  top-down: every new chunk sits below the ones already in use.
- A request of less than one chunk continues right after the previous ``cudaMalloc`` range when
  that chunk still has room there. Otherwise it goes to the lowest free address of a chunk already holding
  smaller allocations when one has room (small segments pack upward inside a chunk); otherwise it
  opens the highest free chunk and starts at its bottom.
- A request of a chunk or more is placed as high as possible, its start aligned down to a chunk.
- Expandable segments reserve their (very large) address ranges bottom-up from ``RESERVE_BASE``,
  each aligned to a chunk, reusing the lowest gap that fits.

Exact driver values are not reproducible (they depend on everything else the process mapped), so
the addresses are a model; what the simulator relies on is their relative order.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort

__all__ = ["AddressSpace"]

CHUNK = 32 << 20  # bytes: the driver's VA chunk granularity observed for cudaMalloc
MALLOC_TOP = 0x7FE000000000  # first byte above the cudaMalloc region (a typical x86-64 CUDA VA)
MALLOC_BOTTOM = 0x7F0000000000  # lowest address the cudaMalloc model hands out
RESERVE_BASE = 0x302000000  # where cuMemAddressReserve ranges start (observed)


class AddressSpace:
    """Hands out and takes back device addresses for segments.

    ``malloc(size)`` / ``free(ptr)`` model ``cudaMalloc`` / ``cudaFree``; ``reserve(size)`` /
    ``unreserve(ptr)`` model ``cuMemAddressReserve`` / ``cuMemAddressFree`` for expandable segments.
    Runtime complexity: O(number of live segments) per call.
    """

    def __init__(self) -> None:
        self._live: dict[int, int] = {}  # ptr -> size of cudaMalloc ranges
        self._starts: list[int] = []  # sorted starts of live cudaMalloc ranges
        self._reserved: dict[int, int] = {}  # ptr -> size of reserved VA ranges
        self._chunks: list[int] = []  # sorted bases of chunks holding smaller-than-chunk ranges
        self._chunk_free: dict[int, int] = {}  # chunk base -> bytes not used by those ranges
        self._cursor = 0  # end of the last cudaMalloc range: the next small one continues there

    def _is_free(self, lo: int, hi: int) -> bool:
        starts = self._starts
        i = bisect_right(starts, lo)
        if i and starts[i - 1] + self._live[starts[i - 1]] > lo:
            return False
        return not (i < len(starts) and starts[i] < hi)

    def malloc(self, size: int) -> int:
        """Return the address ``cudaMalloc(size)`` would give (size in bytes, a multiple of 2 MiB)."""
        cursor = self._cursor
        if size < CHUNK:
            if cursor % CHUNK and cursor % CHUNK + size <= CHUNK and self._is_free(cursor, cursor + size):
                ptr = cursor
            else:
                ptr = self._pack_small(size)
        else:
            ptr = self._place_high(size)
        self._cursor = ptr + size
        self._live[ptr] = size
        insort(self._starts, ptr)
        if size < CHUNK:
            base = ptr - ptr % CHUNK
            if base not in self._chunk_free:
                insort(self._chunks, base)
                self._chunk_free[base] = CHUNK
            self._chunk_free[base] -= size
        return ptr

    def _pack_small(self, size: int) -> int:
        # chunks already holding smaller-than-chunk ranges, lowest address first
        live = self._live
        starts = self._starts
        chunk_free = self._chunk_free
        for base in self._chunks:
            if chunk_free[base] < size:
                continue
            pos = base
            end = base + CHUNK
            i = bisect_right(starts, base) - 1
            if i >= 0 and starts[i] + live[starts[i]] > pos:
                pos = starts[i] + live[starts[i]]
                i += 1
            else:
                i += 1
            n = len(starts)
            while pos + size <= end:
                nxt = starts[i] if i < n else end
                if nxt >= pos + size:
                    return pos
                pos = max(pos, nxt + live[nxt])
                i += 1
        return self._place_high(CHUNK)  # open the highest free chunk

    def _place_high(self, size: int) -> int:
        starts = self._starts
        live = self._live
        top = MALLOC_TOP
        while True:
            start = (top - size) // CHUNK * CHUNK
            i = bisect_left(starts, start + size) - 1  # highest live range starting below the end
            if i < 0 or starts[i] + live[starts[i]] <= start:
                return start
            top = starts[i]

    def free(self, ptr: int) -> None:
        """Give back the range that ``malloc`` returned at ``ptr``."""
        size = self._live.pop(ptr)
        starts = self._starts
        del starts[bisect_right(starts, ptr) - 1]
        if size < CHUNK:
            base = ptr - ptr % CHUNK
            self._chunk_free[base] += size
            if self._chunk_free[base] == CHUNK:
                del self._chunk_free[base]
                del self._chunks[bisect_left(self._chunks, base)]

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

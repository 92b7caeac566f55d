"""Blocks, segments and free-block pools (``Block`` / ``BlockPool`` in CUDACachingAllocator.cpp).

A :class:`Block` is a contiguous byte range of a :class:`Segment`; the blocks of a segment form a
doubly linked list in address order (``prev`` / ``next``). A :class:`BlockPool` keeps the free,
mapped blocks of one stream ordered like ``BlockComparatorSize`` — by (size, address) — as a sorted
list of integer keys ``size << ADDR_BITS | ptr``, so best fit is one ``bisect_left``. torch keeps all
streams in one set ordered by (stream, size, address) and stops a search at the first block of another
stream; one :class:`BlockPool` per (pool, stream) is the same search (see :mod:`memviz.sim.pools`).
"""

from __future__ import annotations

from bisect import bisect_left, insort

__all__ = ["ADDR_BITS", "Block", "BlockPool", "Segment"]

ADDR_BITS = 48  # device addresses are below 2**48 (x86-64 / CUDA UVA), so size << 48 | ptr orders (size, ptr)


class Segment:
    """One ``cudaMalloc`` allocation, or one expandable segment's reserved address range.

    Attributes:
        ptr: base address. size: bytes (the cudaMalloc size, or the reserved VA size when expandable).
        pool: the :class:`BlockPool` it belongs to. head: the block at the lowest address.
        expandable: whether pages are mapped on demand (``expandable_segment_``).
        page_size: bytes per mapped page (expandable only; 0 otherwise).
    """

    __slots__ = ("expandable", "head", "page_size", "pool", "ptr", "size")

    def __init__(self, ptr: int, size: int, pool: BlockPool, expandable: bool = False,
                 page_size: int = 0) -> None:
        self.ptr = ptr
        self.size = size
        self.pool = pool
        self.expandable = expandable
        self.page_size = page_size
        self.head: Block | None = None


class Block:
    """A byte range inside a segment (``Block``).

    Attributes:
        size: bytes, a multiple of 512. ptr: address.
        requested_size: the unrounded request of the *last* allocation that used this object; kept
            (stale) after the block is freed, as torch does.
        allocated: in use by a tensor, or freed and waiting on other streams' events ("active_pending_free",
            see ``CachingAllocator.pending_blocks``). torch clears ``allocated`` there and keeps ``event_count``
            above 0; every rule that reads either (best fit, merging, expandable growth) treats both alike —
            the block is neither reused nor merged — so one flag serves, and the hot paths check no more.
        mapped: backed by memory (always True outside expandable segments).
        prev, next: neighbours in the same segment. segment: the owning :class:`Segment`.
        gc_count_base: the pool's ``get_free_blocks_call_count`` when the block was last freed.

    A block's ``stream_uses`` and ``event_count`` live in the allocator (by address), touched only by programs
    that call ``record_stream``.
    """

    __slots__ = ("allocated", "gc_count_base", "mapped", "next", "prev", "ptr", "requested_size", "segment",
                 "size")

    def __init__(self, size: int, ptr: int, segment: Segment, prev: Block | None = None,
                 next: Block | None = None) -> None:
        self.size = size
        self.ptr = ptr
        self.segment = segment
        self.requested_size = 0
        self.allocated = False
        self.mapped = True
        self.prev = prev
        self.next = next
        self.gc_count_base = 0

    def is_split(self) -> bool:
        """Whether the block shares its segment with other blocks (``is_split``)."""
        return self.prev is not None or self.next is not None

    def link_before(self, new: Block) -> None:
        """Put ``new`` into the segment's list just below this block (it becomes the head if this was)."""
        prev = new.prev = self.prev
        new.next = self
        if prev is not None:
            prev.next = new
        else:
            self.segment.head = new
        self.prev = new

    def link_after(self, new: Block) -> None:
        """Put ``new`` into the segment's list just above this block."""
        nxt = new.next = self.next
        new.prev = self
        if nxt is not None:
            nxt.prev = new
        self.next = new

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else ("free" if self.mapped else "unmapped")
        return f"Block(ptr={self.ptr:#x}, size={self.size}, {state})"


class BlockPool:
    """The free blocks of one pool, small or large, on one stream (``BlockPool``).

    ``stream`` is the allocation stream of every block in it (0: the default stream); ``owner`` the
    :class:`~memviz.sim.pools.PrivatePool` it belongs to (``owner_PrivatePool``; None for the device's
    own pools). ``keys`` is sorted by (size, ptr); ``by_key`` maps each key to its block. ``unmapped`` holds the
    unmapped blocks of expandable segments in address order (``BlockComparatorAddress``).
    Insert and remove cost O(log n) to find plus O(n) memmove, fast for the few thousand free
    blocks a real program keeps.
    """

    __slots__ = ("by_key", "get_free_blocks_call_count", "is_small", "keys", "owner", "stat_type", "stream",
                 "unmapped")

    def __init__(self, is_small: bool, stat_type: int, stream: int = 0, owner: object = None) -> None:
        self.is_small = is_small
        self.stat_type = stat_type
        self.stream = stream
        self.owner = owner
        self.keys: list[int] = []
        self.by_key: dict[int, Block] = {}
        self.unmapped: list[tuple[int, Block]] = []
        self.get_free_blocks_call_count = 0

    def insert_into_blocks(self, block: Block) -> None:
        """Add a free mapped block (``insert_into_blocks``); stamps its gc age base. O(n)."""
        key = block.size << ADDR_BITS | block.ptr
        insort(self.keys, key)
        self.by_key[key] = block
        block.gc_count_base = self.get_free_blocks_call_count

    def erase(self, block: Block) -> None:
        """Remove a free mapped block. O(n)."""
        key = block.size << ADDR_BITS | block.ptr
        keys = self.keys
        del keys[bisect_left(keys, key)]
        del self.by_key[key]

    def insert_unmapped(self, block: Block) -> None:
        """Add an unmapped block of an expandable segment."""
        insort(self.unmapped, (block.ptr, block), key=lambda e: e[0])

    def erase_unmapped(self, block: Block) -> None:
        """Remove an unmapped block."""
        unmapped = self.unmapped
        i = bisect_left(unmapped, block.ptr, key=lambda e: e[0])
        assert unmapped[i][1] is block
        del unmapped[i]

    def __len__(self) -> int:
        return len(self.keys)

"""The allocator's four hot methods with their calls inlined: what ``CachingAllocator`` runs by default.

:class:`~memviz.sim.CachingAllocator`'s ``malloc``, ``alloc_found_block``, ``free`` and ``free_block`` read
line by line with c10's CUDACachingAllocator.cpp: they call ``round_size``, ``get_pool``, ``should_split``,
``insert_into_blocks``, ``try_merge_blocks``, ``increase_stat`` and ``decrease_stat`` as the C++ does. Each
function here does the same work with those calls written out in place (each marked with the call it stands
for) and the attributes it reads aliased to locals. A Python call costs about as much as the arithmetic
it wraps: replays through the methods take 1.3-1.5 times as long (``benchmarks/bench_sim.py --paths``, the
two alternating, CPU time: 2.0-2.3 against 3.0-3.4 µs/op on the 200,000-op synthetic trace), which would put
the simulator above torch's 2.4 µs/op on an H200.

``CachingAllocator(..., fast_paths=True)`` (the default) binds these four to the instance; with
``fast_paths=False`` it runs the methods as written. What they take and return is the methods' (see their
docstrings); inputs off the hot path (a size that is not a positive int below 1 EB, a free of 0 or of an
unknown address) go to the method itself. tests/test_sim_fastpath.py holds the two equal: the golden H200
traces and random programs (streams, events, private pools, expandable segments, settings changed at run
time, OOMs) replayed both ways, every counter and returned address compared after every op, the segments and
the trace at the end.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import TYPE_CHECKING

from .blocks import ADDR_BITS, Block
from .constants import MIN_BLOCK_SIZE, ONE_EXA_BYTES, SMALL_SIZE
from .stats import (
    ALLOCATED_BYTES,
    ALLOCATED_BYTES_PEAK,
    ALLOCATED_BYTES_TOTAL,
    ALLOCATION,
    ALLOCATION_PEAK,
    ALLOCATION_TOTAL,
    INACTIVE_SPLIT,
    INACTIVE_SPLIT_BYTES,
    INACTIVE_SPLIT_BYTES_PEAK,
    INACTIVE_SPLIT_BYTES_TOTAL,
    INACTIVE_SPLIT_PEAK,
    INACTIVE_SPLIT_TOTAL,
    OVERSIZE_ALLOCATIONS,
    REQUESTED_BYTES,
    REQUESTED_BYTES_PEAK,
    REQUESTED_BYTES_TOTAL,
    increase_single,
)

if TYPE_CHECKING:
    from .allocator import CachingAllocator, _AllocParams

__all__ = ["alloc_found_block", "free", "free_block", "malloc"]


def malloc(self: CachingAllocator, size: int, stream: int = 0) -> int:
    """``CachingAllocator.malloc`` with ``round_size``, ``get_pool`` (default stream) and ``should_split``
    inlined."""
    if type(size) is not int or not 0 < size < ONE_EXA_BYTES:
        return type(self).malloc(self, size, stream)  # malloc(0) or a size to check: the method
    # round_size (size >= 1 here), reading rules.division_table through self._divisions
    rounded = -(-size // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
    if self._divisions is not None:
        threshold, step = self._divisions[size.bit_length()]
        if size > threshold:
            rounded = -(-size // step) * step
    p = self._params
    p.size = rounded
    if stream or self._diverting:
        p.pool = self._slow_pool(rounded, stream)
    else:
        p.pool = self.small_blocks if rounded <= SMALL_SIZE else self.large_blocks  # get_pool
    block_found = self.get_free_block(p)
    if not block_found:
        p.alloc_size = self.get_allocation_size(rounded)
        if self._gc_active:
            self.garbage_collect_cached_blocks()
        block_found = (self.alloc_block(p, False)
                       or (self.release_available_cached_blocks(p) and self.alloc_block(p, False))
                       or (not self.captures_underway and self.release_cached_blocks()
                           and self.alloc_block(p, True)))
    if not block_found:
        self._raise_oom(p, size)
    # should_split(p.block, rounded)
    remaining = p.block.size - rounded
    if p.pool.is_small or self._expandable:
        split_remainder = remaining >= MIN_BLOCK_SIZE
    else:
        split_remainder = rounded < self._max_split_size and remaining > SMALL_SIZE
    return alloc_found_block(self, p, size, split_remainder)


def alloc_found_block(self: CachingAllocator, p: _AllocParams, orig_size: int, split_remainder: bool) -> int:
    """``CachingAllocator.alloc_found_block`` with ``insert_into_blocks`` and ``increase_stat`` /
    ``decrease_stat`` inlined."""
    block = p.block
    size = p.size
    pool = p.pool
    st = pool.stat_type
    stats = self.stats
    segment = block.segment
    if split_remainder:
        already_split = block.prev is not None or block.next is not None
        remaining = block
        prev = remaining.prev
        block = Block(size, remaining.ptr, segment, prev, remaining)
        if prev is not None:
            prev.next = block
        else:
            segment.head = block
        remaining.prev = block
        rptr = remaining.ptr = remaining.ptr + size
        rsize = remaining.size = remaining.size - size
        # pool.insert_into_blocks(remaining)
        key = rsize << ADDR_BITS | rptr
        insort(pool.keys, key)
        pool.by_key[key] = remaining
        remaining.gc_count_base = pool.get_free_blocks_call_count
        if not segment.expandable:
            if already_split:
                # decrease_stat(inactive_split_bytes, size)
                stats.pool[st][INACTIVE_SPLIT_BYTES] -= size
            else:
                # increase_stat(inactive_split_bytes, remaining.size), increase_stat(inactive_split, 1): the
                # pool's current, peak and total, then the aggregate's peak (its current is the two pools')
                s, other = stats.pools[st]
                c = s[INACTIVE_SPLIT_BYTES] + rsize
                s[INACTIVE_SPLIT_BYTES] = c
                if c > s[INACTIVE_SPLIT_BYTES_PEAK]:
                    s[INACTIVE_SPLIT_BYTES_PEAK] = c
                s[INACTIVE_SPLIT_BYTES_TOTAL] += rsize
                c += other[INACTIVE_SPLIT_BYTES]
                if c > stats.agg[INACTIVE_SPLIT_BYTES_PEAK]:
                    stats.agg[INACTIVE_SPLIT_BYTES_PEAK] = c
                c = s[INACTIVE_SPLIT] + 1
                s[INACTIVE_SPLIT] = c
                if c > s[INACTIVE_SPLIT_PEAK]:
                    s[INACTIVE_SPLIT_PEAK] = c
                s[INACTIVE_SPLIT_TOTAL] += 1
                c += other[INACTIVE_SPLIT]
                if c > stats.agg[INACTIVE_SPLIT_PEAK]:
                    stats.agg[INACTIVE_SPLIT_PEAK] = c
    elif not segment.expandable and (block.prev is not None or block.next is not None):
        # decrease_stat(inactive_split_bytes, block.size), decrease_stat(inactive_split, 1)
        s = stats.pool[st]
        s[INACTIVE_SPLIT_BYTES] -= block.size
        s[INACTIVE_SPLIT] -= 1
    block.allocated = True
    block.requested_size = orig_size
    ptr = block.ptr
    trace_extend = self._trace_extend  # record_trace
    if trace_extend is not None:
        trace_extend(("alloc", ptr, orig_size, pool.stream))
    self._active_blocks[ptr] = block
    bsize = block.size
    # increase_stat of allocation, allocated_bytes and requested_bytes, as above
    s, other = stats.pools[st]
    a = stats.agg
    c = s[ALLOCATION] + 1
    s[ALLOCATION] = c
    if c > s[ALLOCATION_PEAK]:
        s[ALLOCATION_PEAK] = c
    s[ALLOCATION_TOTAL] += 1
    c += other[ALLOCATION]
    if c > a[ALLOCATION_PEAK]:
        a[ALLOCATION_PEAK] = c
    c = s[ALLOCATED_BYTES] + bsize
    s[ALLOCATED_BYTES] = c
    if c > s[ALLOCATED_BYTES_PEAK]:
        s[ALLOCATED_BYTES_PEAK] = c
    s[ALLOCATED_BYTES_TOTAL] += bsize
    c += other[ALLOCATED_BYTES]
    if c > a[ALLOCATED_BYTES_PEAK]:
        a[ALLOCATED_BYTES_PEAK] = c
    c = s[REQUESTED_BYTES] + orig_size
    s[REQUESTED_BYTES] = c
    if c > s[REQUESTED_BYTES_PEAK]:
        s[REQUESTED_BYTES_PEAK] = c
    s[REQUESTED_BYTES_TOTAL] += orig_size
    c += other[REQUESTED_BYTES]
    if c > a[REQUESTED_BYTES_PEAK]:
        a[REQUESTED_BYTES_PEAK] = c
    if bsize >= self._max_split_size:
        increase_single(a, OVERSIZE_ALLOCATIONS, 1)
    if self._pending_free:
        stats.note_active_peak(st)
    return ptr


def free(self: CachingAllocator, ptr: int) -> None:
    """``CachingAllocator.free`` with ``decrease_stat`` and ``record_trace`` inlined."""
    block = self._active_blocks.pop(ptr, None) if type(ptr) is int else None
    if block is None:
        type(self).free(self, ptr)  # free(0), or an address to check (raises; nothing changed)
        return
    stats = self.stats
    pool = block.segment.pool
    bsize = block.size
    # decrease_stat(allocation, 1), decrease_stat(allocated_bytes, block.size)
    s = stats.pool[pool.stat_type]
    s[ALLOCATION] -= 1
    s[ALLOCATED_BYTES] -= bsize
    if self.stream_uses and ptr in self.stream_uses:  # waits on events
        self.record_trace("free_requested", ptr, block.requested_size, pool.stream)
        if bsize >= self._max_split_size:
            stats.agg[OVERSIZE_ALLOCATIONS] -= 1  # decrease_stat(oversize_allocations, 1)
        self._free_with_events(block)
        return
    trace_extend = self._trace_extend  # record_trace("free", ...): free_requested + free_completed
    if trace_extend is not None:
        trace_extend(("free", ptr, block.requested_size, pool.stream))
    if bsize >= self._max_split_size:
        stats.agg[OVERSIZE_ALLOCATIONS] -= 1  # decrease_stat(oversize_allocations, 1)
    block.allocated = False
    free_block(self, block)


def free_block(self: CachingAllocator, block: Block) -> None:
    """``CachingAllocator.free_block`` with ``try_merge_blocks`` (mapped neighbours: the freed block is
    mapped), ``insert_into_blocks`` and ``increase_stat`` / ``decrease_stat`` inlined."""
    segment = block.segment
    pool = segment.pool
    net_n = 0  # net_change_inactive_split_blocks
    net_b = 0  # net_change_inactive_split_size
    keys = pool.keys
    by_key = pool.by_key
    bsize = block.size
    prev = block.prev
    if prev is not None and not prev.allocated and prev.mapped:
        # try_merge_blocks(block, prev, pool)
        psize = prev.size
        pptr = prev.ptr
        del by_key[keys.pop(bisect_left(keys, psize << ADDR_BITS | pptr))]  # pool.erase(prev)
        block.ptr = pptr
        pprev = block.prev = prev.prev
        if pprev is not None:
            pprev.next = block
        else:
            segment.head = block
        bsize += psize
        net_b -= psize
        net_n -= 1
    nxt = block.next
    if nxt is not None and not nxt.allocated and nxt.mapped:
        # try_merge_blocks(block, next, pool)
        nsize = nxt.size
        del by_key[keys.pop(bisect_left(keys, nsize << ADDR_BITS | nxt.ptr))]  # pool.erase(next)
        nnext = block.next = nxt.next
        if nnext is not None:
            nnext.prev = block
        bsize += nsize
        net_b -= nsize
        net_n -= 1
    block.size = bsize
    # pool.insert_into_blocks(block)
    key = bsize << ADDR_BITS | block.ptr
    insort(keys, key)
    by_key[key] = block
    block.gc_count_base = pool.get_free_blocks_call_count
    stats = self.stats
    s, other = stats.pools[pool.stat_type]
    if not segment.expandable:
        if block.prev is not None or block.next is not None:  # block.is_split()
            net_n += 1
            net_b += bsize
        # increase_stat for a net gain, decrease_stat for a net loss: current += net either way
        c = s[INACTIVE_SPLIT] + net_n
        s[INACTIVE_SPLIT] = c
        if net_n > 0:
            if c > s[INACTIVE_SPLIT_PEAK]:
                s[INACTIVE_SPLIT_PEAK] = c
            s[INACTIVE_SPLIT_TOTAL] += net_n
            c += other[INACTIVE_SPLIT]
            if c > stats.agg[INACTIVE_SPLIT_PEAK]:
                stats.agg[INACTIVE_SPLIT_PEAK] = c
        c = s[INACTIVE_SPLIT_BYTES] + net_b
        s[INACTIVE_SPLIT_BYTES] = c
        if net_b > 0:
            if c > s[INACTIVE_SPLIT_BYTES_PEAK]:
                s[INACTIVE_SPLIT_BYTES_PEAK] = c
            s[INACTIVE_SPLIT_BYTES_TOTAL] += net_b
            c += other[INACTIVE_SPLIT_BYTES]
            if c > stats.agg[INACTIVE_SPLIT_BYTES_PEAK]:
                stats.agg[INACTIVE_SPLIT_BYTES_PEAK] = c
    s[REQUESTED_BYTES] -= block.requested_size  # decrease_stat(requested_bytes, requested_size)

"""The simulator's invariant check (``CachingAllocator._check``): structure, pools and every stat.

Reads the allocator only through its public read API (``iter_segments``, ``live_block``, ``live_count``,
``trace_records`` / ``trace_length``, the pools, ``stats``), so it checks what a user of that API would see.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from .blocks import ADDR_BITS
from .constants import MIN_BLOCK_SIZE
from .stats import AGGREGATE, ARRAY_FAMILIES, LARGE_POOL, SMALL_POOL

if TYPE_CHECKING:  # annotations only: allocator.py imports this module, never the other way at run time
    from .allocator import CachingAllocator
    from .blocks import Block

__all__ = ["check_invariants", "format_segment_table"]

#: per allocator: (trace entries counted so far, the counts by action, the requested bytes of the allocs), so
#: that checking after every op reads each trace entry once (the trace only grows while history is on)
_TRACE_TOTALS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ACTIONS = ("alloc", "free", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
            "segment_unmap", "oom", "snapshot")


def format_segment_table(allocator: CachingAllocator) -> str:
    """Return one line per segment: address, type, size and its blocks as size/state."""
    lines = []
    for seg in allocator.iter_segments():
        base = seg.ptr
        parts = []
        pending = set(allocator.pending_blocks())
        b = seg.head
        while b is not None:
            state = ("P" if b in pending else "A") if b.allocated else ("F" if b.mapped else "U")
            parts.append(f"{b.size}{state}@{b.ptr:#x}")
            b = b.next
        kind = "small" if seg.pool.is_small else "large"
        exp = " expandable" if seg.expandable else ""
        where = f" stream {seg.pool.stream}" if seg.pool.stream else ""
        if seg.pool.owner is not None:
            where += f" pool {seg.pool.owner.id}"
        lines.append(f"{base:#x} {kind}{exp}{where} {seg.size}: " + " ".join(parts))
    return "\n".join(lines)


def check_invariants(allocator: CachingAllocator) -> None:
    """Assert the allocator's structural and statistical invariants (see ``CachingAllocator._check``).

    - Structure: segments lie at positive addresses below 2**48 without overlapping; blocks tile each
      segment exactly, linked both ways; no two adjacent free blocks outside expandable segments; each
      free mapped block is in exactly one pool, keyed by (size, address); each allocated block is live.
    - Current stats: every ``*.current`` of every family and pool equals what the blocks imply;
      ``total_allocated_memory`` equals reserved; allocated <= reserved <= the device (and the cap).
    - Peaks and totals: every peak >= its current; the aggregate's peak >= each pool's peak; no negative
      ``allocated`` / ``freed``; ``allocated_bytes`` totals >= ``requested_bytes`` totals (a block is at
      least its request); with the history recorded and never reset, the allocation and request totals
      and the device call counts equal what the trace records.
    """
    a = allocator
    free_seen: dict[int, Block] = {}
    cur = {name: [0, 0, 0] for name in ("allocation", "allocated_bytes", "requested_bytes", "segment",
                                        "reserved_bytes", "inactive_split", "inactive_split_bytes")}
    oversize_alloc = oversize_seg = 0
    pending = set(allocator.pending_blocks())
    pend = [0, 0, 0]
    mss = a.config.max_split_size
    end_of_previous = 0
    for seg in a.iter_segments():
        base = seg.ptr
        assert end_of_previous <= base and base > 0, f"segment {base:#x} overlaps the one below or is not positive"
        assert base + seg.size <= 1 << ADDR_BITS, f"segment {base:#x} ends above 2**{ADDR_BITS}"
        end_of_previous = base + seg.size
        b = seg.head
        assert b is not None and b.prev is None and b.ptr == base, "segment head is not at its base"
        pos = base
        st = seg.pool.stat_type
        n_blocks = 0
        prev = None
        while b is not None:
            assert b.segment is seg, "block points to another segment"
            assert b.prev is prev, "broken prev link"
            assert b.ptr == pos, f"blocks do not tile segment {base:#x} at {pos:#x}"
            assert b.size > 0 and b.size % MIN_BLOCK_SIZE == 0, f"bad block size {b.size}"
            if not seg.expandable and prev is not None:
                assert prev.allocated or b.allocated, f"adjacent free blocks at {b.ptr:#x}"
            if b in pending:
                assert a.live_block(b.ptr) is None and b.ptr in a.event_count, f"pending free {b.ptr:#x} still live"
                cur["requested_bytes"][st] += b.requested_size
                pend[st] += 1
            elif b.allocated:
                assert a.live_block(b.ptr) is b, "allocated block missing from the live allocations"
                for k, v in (("allocation", 1), ("allocated_bytes", b.size), ("requested_bytes",
                                                                              b.requested_size)):
                    cur[k][st] += v
                if b.size >= mss:
                    oversize_alloc += 1
            elif b.mapped:
                key = b.size << ADDR_BITS | b.ptr
                assert seg.pool.by_key.get(key) is b, f"free block {b.ptr:#x} not in its pool"
                free_seen[id(b)] = b
            else:
                assert any(e[1] is b for e in seg.pool.unmapped), "unmapped block not in the pool"
            if b.mapped:
                cur["reserved_bytes"][st] += b.size
            pos += b.size
            n_blocks += 1
            prev = b
            b = b.next
        assert pos == base + seg.size, f"blocks of segment {base:#x} do not cover it"
        if not seg.expandable:
            cur["segment"][st] += 1
            if seg.size >= mss:
                oversize_seg += 1
            if n_blocks > 1:
                h = seg.head
                while h is not None:
                    if not h.allocated:
                        cur["inactive_split"][st] += 1
                        cur["inactive_split_bytes"][st] += h.size
                    h = h.next
    pools = list(a.block_pools())
    n_pool = sum(len(p.keys) for p in pools)
    assert n_pool == len(free_seen), "a pool holds a block that is not in any segment"
    assert sum(pend) == len(pending), "a pending free is not in any segment"
    for t in (SMALL_POOL, LARGE_POOL):
        assert a.stats.get("active", t)["current"] == cur["allocation"][t] + pend[t], "active.current wrong"
    for p in pools:
        assert p.keys == sorted(p.keys) and len(p.keys) == len(p.by_key), "pool order broken"
        for blk in p.by_key.values():
            assert blk.segment.pool is p, "free block in the wrong pool"
    stats = a.stats
    for name, per_pool in cur.items():
        for t in (SMALL_POOL, LARGE_POOL):
            got = stats.get(name, t)["current"]
            assert got == per_pool[t], f"{name}[{t}].current={got}, snapshot: {per_pool[t]}"
        all_stat = stats.get(name)
        assert all_stat["current"] == per_pool[SMALL_POOL] + per_pool[LARGE_POOL], f"{name}.all.current wrong"
    for name in ARRAY_FAMILIES:
        all_stat = stats.get(name)
        pools = [stats.get(name, t) for t in (SMALL_POOL, LARGE_POOL)]
        for field in ("allocated", "freed"):
            assert all_stat[field] == sum(d[field] for d in pools), f"{name}.all.{field} wrong"
        for d in (all_stat, *pools):
            assert d["freed"] >= 0 and d["allocated"] >= 0 and d["peak"] >= d["current"], f"{name}: {d}"
            assert d["peak"] <= all_stat["peak"], f"{name}.all.peak {all_stat['peak']} below a pool's peak {d}"
    for t in (AGGREGATE, SMALL_POOL, LARGE_POOL):
        assert stats.get("allocated_bytes", t)["allocated"] >= stats.get("requested_bytes", t)["allocated"], (
            f"allocated_bytes total below requested_bytes total (pool {t})")
    if not a.settings_changed:  # torch counts oversize blocks by the max_split_size of the moment
        assert stats.get("oversize_allocations")["current"] == oversize_alloc, "oversize_allocations.current wrong"
        assert stats.get("oversize_segments")["current"] == oversize_seg, "oversize_segments.current wrong"
    allocated = stats.get("allocated_bytes")["current"]
    reserved = stats.get("reserved_bytes")["current"]
    assert a.total_allocated_memory == reserved, "total_allocated_memory wrong"
    assert a.live_count() == stats.get("allocation")["current"], "live allocation count wrong"
    assert 0 <= allocated <= reserved, "allocated > reserved"
    assert reserved <= a.total_memory - a.context_bytes, "reserved exceeds the device"
    if a.allowed_memory_bytes is not None:
        # With expandable segments torch checks the fraction against get_allocation_size() but maps
        # whole pages, so reserved may pass the limit by less than one large page.
        slack = a.config.large_segment_size if a.config.expandable_segments else 0
        assert reserved <= a.allowed_memory_bytes + slack, "reserved exceeds the memory fraction"
    if a.record_history and stats.accumulated_resets == 0:
        _check_totals_against_trace(a)


def _check_totals_against_trace(a: CachingAllocator) -> None:
    """The event totals equal what the complete trace records (history on, never reset)."""
    seen, count, requested = _TRACE_TOTALS.get(a) or (0, dict.fromkeys(_ACTIONS, 0), 0)
    if a.trace_length() < seen:  # not the trace counted before: count afresh
        seen, count, requested = 0, dict.fromkeys(_ACTIONS, 0), 0
    for action, _, size, _, _ in a.trace_records(seen):
        count[action] += 1
        if action == "alloc":
            requested += size
    _TRACE_TOTALS[a] = (a.trace_length(), count, requested)
    stats = a.stats
    assert stats.get("allocation")["allocated"] == count["alloc"], "allocation.all.allocated != allocs in the trace"
    assert stats.get("requested_bytes")["allocated"] == requested, "requested_bytes.all.allocated != the trace's"
    assert stats.get("allocation")["freed"] == count["free"] + count["free_requested"], (
        "allocation.all.freed != frees in the trace")
    assert stats.get("active")["freed"] == count["free"] + count["free_completed"], (
        "active.all.freed != completed frees in the trace")
    assert stats.num_device_alloc == count["segment_alloc"] + count["segment_map"], "num_device_alloc wrong"
    assert stats.num_device_free == count["segment_free"] + count["segment_unmap"], "num_device_free wrong"
    assert stats.num_ooms == count["oom"], "num_ooms != OOMs in the trace"

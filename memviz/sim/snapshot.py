"""Snapshot dicts shaped like ``torch.cuda.memory._snapshot()``, and the invariant check.

A snapshot lists segments sorted by address. A non-expandable segment is one ``cudaMalloc`` range;
an expandable segment is reported as one segment per contiguous *mapped* range, as torch does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .stats import LARGE_POOL, SMALL_POOL

if TYPE_CHECKING:
    from .allocator import CachingAllocator
    from .blocks import Block

__all__ = ["build_segments", "build_snapshot", "check_invariants", "format_segment_table"]

_ROUNDUP_LABELS = [str(1 << k) for k in range(16)]  # interval starts in MiB: "1" .. "32768"


def _segment_runs(allocator: CachingAllocator) -> list[tuple[Any, list[Block]]]:
    """Return (segment, blocks) for every reported segment, in address order."""
    runs = []
    for base in sorted(allocator._segments):
        seg = allocator._segments[base]
        run: list[Block] = []
        b = seg.head
        while b is not None:
            if b.mapped:
                run.append(b)
            elif run:
                runs.append((seg, run))
                run = []
            b = b.next
        if run:
            runs.append((seg, run))
    return runs


def _block_state(b: Block) -> str:
    return "active_allocated" if b.allocated else "inactive"


def build_segments(allocator: CachingAllocator) -> list[dict[str, Any]]:
    """Build ``_snapshot()["segments"]``: the segments in address order, each with its blocks."""
    segments = []
    for seg, blocks in _segment_runs(allocator):
        bl = []
        allocated = requested = 0
        for b in blocks:
            bl.append({"address": b.ptr, "size": b.size, "requested_size": b.requested_size,
                       "state": _block_state(b), "frames": []})
            if b.allocated:
                allocated += b.size
                requested += b.requested_size
        segments.append({
            "device": 0,
            "address": blocks[0].ptr,
            "total_size": sum(b.size for b in blocks),
            "allocated_size": allocated,
            "active_size": allocated,
            "requested_size": requested,
            "stream": 0,
            "segment_type": "small" if seg.pool.is_small else "large",
            "segment_pool_id": (0, 0),
            "is_expandable": seg.expandable,
            "frames": [],
            "blocks": bl,
        })
    return segments


def build_snapshot(allocator: CachingAllocator) -> dict[str, Any]:
    """Build the ``_snapshot()`` dict: segments, device_traces, allocator_settings, external_annotations."""
    segments = build_segments(allocator)
    traces = []
    flat = allocator._trace  # action, addr, size of each entry in turn
    times = allocator._trace_times
    for k in range(0, len(flat), 3):
        action, addr, size = flat[k], flat[k + 1], flat[k + 2]
        # one "free" entry stands for free_requested + free_completed (see CachingAllocator.free_block)
        for act in (("free_requested", "free_completed") if action == "free" else (action,)):
            d: dict[str, Any] = {"action": act}
            if act == "oom":
                d["device_free"] = addr
            else:
                d["addr"] = addr
            d.update(size=size, stream=0, time_us=times[k // 3] if times is not None else len(traces),
                     compile_context="N/A", user_metadata="")
            traces.append(d)
    cfg = allocator.config
    settings = {
        "PYTORCH_CUDA_ALLOC_CONF": cfg.settings,
        "max_split_size": -1 if cfg.max_split_size >= 1 << 63 else cfg.max_split_size,
        "garbage_collection_threshold": cfg.garbage_collection_threshold,
        "expandable_segments": cfg.expandable_segments,
        "pinned_num_register_threads": cfg.other.get("pinned_num_register_threads", 1),
        "release_lock_on_cudamalloc": cfg.other.get("release_lock_on_cudamalloc", False),
        "pinned_use_cuda_host_register": cfg.other.get("pinned_use_cuda_host_register", False),
        "graph_capture_record_stream_reuse": cfg.other.get("graph_capture_record_stream_reuse", False),
        "roundup_power2_divisions": dict(zip(_ROUNDUP_LABELS, cfg.roundup_power2_divisions, strict=True)),
    }
    return {"segments": segments, "device_traces": [traces], "allocator_settings": settings,
            "external_annotations": []}


def format_segment_table(allocator: CachingAllocator) -> str:
    """Return one line per segment: address, type, size and its blocks as size/state."""
    lines = []
    for base in sorted(allocator._segments):
        seg = allocator._segments[base]
        parts = []
        b = seg.head
        while b is not None:
            state = "A" if b.allocated else ("F" if b.mapped else "U")
            parts.append(f"{b.size}{state}@{b.ptr:#x}")
            b = b.next
        kind = "small" if seg.pool.is_small else "large"
        exp = " expandable" if seg.expandable else ""
        lines.append(f"{base:#x} {kind}{exp} {seg.size}: " + " ".join(parts))
    return "\n".join(lines)


def check_invariants(allocator: CachingAllocator) -> None:
    """Assert the allocator's structural and statistical invariants (see ``CachingAllocator._check``)."""
    a = allocator
    from .blocks import ADDR_BITS

    free_seen: dict[int, Block] = {}
    cur = {name: [0, 0, 0] for name in ("allocation", "allocated_bytes", "requested_bytes", "segment",
                                        "reserved_bytes", "inactive_split", "inactive_split_bytes")}
    oversize_alloc = oversize_seg = 0
    mss = a._max_split_size
    for base, seg in a._segments.items():
        assert seg.ptr == base, "segment keyed by wrong address"
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
            assert b.size > 0 and b.size % 512 == 0, f"bad block size {b.size}"
            if not seg.expandable and prev is not None:
                assert prev.allocated or b.allocated, f"adjacent free blocks at {b.ptr:#x}"
            if b.allocated:
                assert a._active_blocks.get(b.ptr) is b, "allocated block missing from active_blocks"
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
    n_pool = sum(len(p.keys) for p in (a.small_blocks, a.large_blocks))
    assert n_pool == len(free_seen), "a pool holds a block that is not in any segment"
    for p in (a.small_blocks, a.large_blocks):
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
        pools = [stats.get(name, t) for t in (SMALL_POOL, LARGE_POOL)]
        for field in ("allocated", "freed"):
            assert all_stat[field] == sum(d[field] for d in pools), f"{name}.all.{field} wrong"
        for d in (all_stat, *pools):
            assert d["freed"] >= 0 and d["allocated"] >= 0 and d["peak"] >= d["current"], f"{name}: {d}"
    assert stats.get("oversize_allocations")["current"] == oversize_alloc, "oversize_allocations.current wrong"
    assert stats.get("oversize_segments")["current"] == oversize_seg, "oversize_segments.current wrong"
    allocated = stats.get("allocated_bytes")["current"]
    reserved = stats.get("reserved_bytes")["current"]
    assert a.total_allocated_memory == reserved, "total_allocated_memory wrong"
    assert len(a._active_blocks) == stats.get("allocation")["current"], "active_blocks count wrong"
    assert 0 <= allocated <= reserved, "allocated > reserved"
    assert reserved <= a.total_memory - a.context_bytes, "reserved exceeds the device"
    if a.allowed_memory_bytes is not None:
        # With expandable segments torch checks the fraction against get_allocation_size() but maps
        # whole pages, so reserved may pass the limit by less than one large page.
        slack = a._large_segment_size if a._expandable else 0
        assert reserved <= a.allowed_memory_bytes + slack, "reserved exceeds the memory fraction"

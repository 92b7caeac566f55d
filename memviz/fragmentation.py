"""Fragmentation, measured from an allocator snapshot (``torch.cuda.memory._snapshot()`` or the simulator's).

Reserved memory splits into bytes tensors use, bytes lost to rounding inside their blocks (internal),
and free bytes in the cache (external). Only free bytes that form a whole segment — or, for expandable
segments, whole pages — can go back to the driver: that is all ``empty_cache()`` can release.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from memviz.sim import rules
from memviz.sim.config import AllocatorConfig, parse_alloc_conf
from memviz.snapshots.settings import settings_from_snapshot
from memviz.units import format_bytes

__all__ = ["Fragmentation", "fragmentation"]


@dataclass(frozen=True)
class Fragmentation:
    """Where reserved memory is, in bytes.

    Attributes:
        reserved_bytes: all segments (``memory_reserved()``).
        allocated_bytes: blocks holding live tensors (``memory_allocated()``).
        requested_bytes: what those tensors asked for; ``allocated - requested`` is rounding.
        free_bytes: free blocks in the cache: ``reserved - allocated`` less blocks pending a free.
        releasable_bytes: free bytes ``empty_cache()`` would return to the driver.
        largest_free_block_bytes: the biggest free block, the most one allocation can get without a new
            segment (per pool below).
        largest_free_small_bytes / largest_free_large_bytes: the same within the small / large pool.
        segments: number of segments (an expandable segment counts once per mapped range).
        free_blocks: number of free blocks.
    """

    reserved_bytes: int
    allocated_bytes: int
    requested_bytes: int
    free_bytes: int
    releasable_bytes: int
    largest_free_block_bytes: int
    largest_free_small_bytes: int
    largest_free_large_bytes: int
    segments: int
    free_blocks: int

    @property
    def internal_bytes(self) -> int:
        """Bytes lost to rounding inside allocated blocks (``allocated - requested``)."""
        return self.allocated_bytes - self.requested_bytes

    @property
    def reserved_unallocated_bytes(self) -> int:
        """``reserved - allocated``: the OOM message's "reserved by PyTorch but unallocated"."""
        return self.reserved_bytes - self.allocated_bytes

    @property
    def stranded_bytes(self) -> int:
        """Free bytes that ``empty_cache()`` cannot release: they share a segment with live tensors."""
        return self.free_bytes - self.releasable_bytes

    def __str__(self) -> str:
        rows = [
            ("reserved", self.reserved_bytes), ("allocated", self.allocated_bytes),
            ("  of which rounding (internal)", self.internal_bytes),
            ("free in the cache (external)", self.free_bytes),
            ("  releasable by empty_cache()", self.releasable_bytes),
            ("  stranded beside live tensors", self.stranded_bytes),
            ("largest free block", self.largest_free_block_bytes),
        ]  # fmt: skip
        lines = [f"{label:<32}{format_bytes(value):>12}" for label, value in rows]
        lines.append(f"{'segments / free blocks':<32}{f'{self.segments} / {self.free_blocks}':>12}")
        return "\n".join(lines)


def fragmentation(segments: Iterable[Mapping] | Mapping, config: AllocatorConfig | str | None = None) -> Fragmentation:
    """Measure fragmentation from snapshot segments (``_snapshot()["segments"]`` or the dict holding them).

    Args:
        segments: the segments, or a whole snapshot dict.
        config: the allocator config the segments were made under, as an :class:`~memviz.sim.AllocatorConfig`
            or a ``PYTORCH_CUDA_ALLOC_CONF`` string: it sets the page size of expandable segments
            (``large_segment_size_mb``). Default: read from a snapshot dict's ``allocator_settings``, else
            torch's defaults.

    ``releasable_bytes`` is exactly what ``empty_cache()`` would give back: whole free segments, and for
    expandable segments the whole pages inside each free block (tests/test_fragmentation_empty_cache.py).
    """
    if isinstance(segments, Mapping):
        if config is None and segments.get("allocator_settings"):
            config = settings_from_snapshot(segments).config
        segments = segments["segments"]
    if isinstance(config, str):
        config = parse_alloc_conf(config)
    cfg = config if config is not None else AllocatorConfig()
    reserved = allocated = requested = free = releasable = n_segments = n_free = 0
    largest = {"small": 0, "large": 0}
    for seg in segments:
        n_segments += 1
        reserved += seg["total_size"]
        blocks = seg["blocks"]
        pool = "small" if seg.get("segment_type") == "small" else "large"
        expandable = seg.get("is_expandable", False)
        page = rules.page_size(pool == "small", cfg)
        offset = 0  # from the segment's start: a mapped range of an expandable segment starts on a page
        for block in blocks:
            size = block["size"]
            state = block["state"]
            if state == "active_allocated":
                allocated += size
                requested += block["requested_size"]
            elif state == "inactive":
                free += size
                n_free += 1
                largest[pool] = max(largest[pool], size)
                if expandable:
                    releasable += _whole_pages(offset, size, page)
                elif len(blocks) == 1:
                    releasable += size
            offset += size
    return Fragmentation(
        reserved, allocated, requested, free, releasable,
        max(largest.values()), largest["small"], largest["large"], n_segments, n_free,
    )  # fmt: skip


def _whole_pages(offset: int, size: int, page: int) -> int:
    """Bytes of the pages lying entirely inside ``[offset, offset + size)``, pages aligned at 0."""
    first = -(-offset // page) * page
    last = (offset + size) // page * page
    return max(0, last - first)

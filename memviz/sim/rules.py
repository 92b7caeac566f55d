"""The allocator's size rules, as pure functions of a size and an :class:`~memviz.sim.AllocatorConfig`.

One copy of each rule of CUDACachingAllocator.cpp that code outside the allocator needs too: the
snapshot history (which rebuilds block sizes from requests), fragmentation (which needs the page size)
and the allocator itself. ``CachingAllocator``'s hot paths inline :func:`round_size`, :func:`get_pool`
and :func:`should_split`, each marked where it happens; golden and property tests hold the copies equal.
All sizes are bytes.

>>> from memviz.sim import parse_alloc_conf
>>> cfg = parse_alloc_conf("roundup_power2_divisions:4")
>>> round_size(1000, cfg), round_size(5 << 20, cfg) >> 20, round_size((5 << 20) + 1, cfg) >> 20
(1024, 5, 6)
"""

from __future__ import annotations

from functools import cache

from .config import AllocatorConfig
from .constants import (
    MIN_BLOCK_SIZE,
    MIN_LARGE_ALLOC,
    ROUND_LARGE,
    ROUNDUP_POWER2_INTERVALS,
    ROUNDUP_POWER2_START_LOG2,
    SIZE_MAX,
    SMALL_BUFFER,
    SMALL_SIZE,
)

__all__ = ["SIZE_BITS", "division_table", "get_allocation_size", "is_small", "page_size", "round_size",
           "should_split"]

SIZE_BITS = 64  # sizes are size_t: below 2**64, so size.bit_length() <= 64


def divisions_for(size: int, divisions: tuple[int, ...]) -> int:
    """Return the power-of-2 divisions that apply to ``size`` bytes (``roundup_power2_divisions(size)``):
    the entry of the interval ``[2**k MiB, 2**(k+1) MiB)`` holding it, the last entry for all above."""
    index = max(0, size.bit_length() - 1 - ROUNDUP_POWER2_START_LOG2)
    return divisions[min(index, ROUNDUP_POWER2_INTERVALS - 1)]


@cache
def division_table(divisions: tuple[int, ...]) -> tuple[tuple[int, int], ...] | None:
    """``roundup_power2_divisions`` tabulated by ``size.bit_length()`` (0 .. :data:`SIZE_BITS`), or None.

    Entry ``bits`` is ``(threshold, step)``: a size of that bit length above ``threshold`` rounds up to a
    multiple of ``step`` = (its power-of-2 floor) / divisions; ``(SIZE_MAX, 0)`` where no division
    applies. None when no interval sets divisions (every size then rounds to 512 bytes).
    """
    if not any(divisions):
        return None
    table = []
    for bits in range(SIZE_BITS + 1):
        floor2 = 1 << max(0, bits - 1)
        n = divisions_for(floor2, divisions)
        # torch: roundup_power2_next_division applies when divisions > 1 and size > kMinBlockSize * divisions
        table.append((MIN_BLOCK_SIZE * n, floor2 // n) if n > 1 else (SIZE_MAX, 0))
    return tuple(table)


def round_size(size: int, cfg: AllocatorConfig) -> int:
    """Return the block size for a request of ``size`` bytes (``round_size``): at least 512 bytes, a multiple
    of 512, or of (power-of-2 floor / divisions) under ``roundup_power2_divisions``."""
    if size < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    table = division_table(cfg.roundup_power2_divisions)
    if table is not None:
        threshold, step = table[size.bit_length()]
        if size > threshold:
            return -(-size // step) * step  # roundup_power2_next_division: a power of 2 stays as it is
    return -(-size // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE


def is_small(size: int) -> bool:
    """Whether a rounded size goes to the small pool (``get_pool``: ``size <= kSmallSize``, 1 MiB)."""
    return size <= SMALL_SIZE


def get_allocation_size(size: int, cfg: AllocatorConfig) -> int:
    """Return the segment size for a rounded size (``get_allocation_size``): 2 MiB for the small pool,
    ``large_segment_size`` below 10 MiB, else the size rounded up to 2 MiB."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return cfg.large_segment_size
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def page_size(small: bool, cfg: AllocatorConfig) -> int:
    """Return the page an expandable segment maps at a time: 2 MiB (small pool) or ``large_segment_size``."""
    return SMALL_BUFFER if small else cfg.large_segment_size


def should_split(block_size: int, size: int, cfg: AllocatorConfig, *, small: bool, expandable: bool) -> bool:
    """Whether a free block of ``block_size`` bytes is split to serve a rounded ``size`` (``should_split``).

    Small-pool and expandable blocks split when at least 512 bytes remain; other large blocks when the
    request is below ``max_split_size`` and more than 1 MiB remains.
    """
    remaining = block_size - size
    if small or expandable:
        return remaining >= MIN_BLOCK_SIZE
    return size < cfg.max_split_size and remaining > SMALL_SIZE

"""Allocator statistics: torch's ``Stat`` counters and the flat ``memory_stats()`` dict.

A torch ``Stat`` (``c10::CachingDeviceAllocator::Stat``) has four fields — current, peak, allocated,
freed — and changes only through two updates:

- ``increase_stat(stat, n)``: current += n; peak = max(peak, current); allocated += n.
- ``decrease_stat(stat, n)``: current -= n; freed += n (peak unchanged).

A ``StatArray`` is three stats indexed by :data:`AGGREGATE`, :data:`SMALL_POOL`, :data:`LARGE_POOL`,
and every update of a pool's stat also updates the aggregate one by the same amount.

Layout (chosen so that ``malloc`` / ``free`` do as few list operations as possible): each pool's
counters are one flat list of ints, :attr:`DeviceStats.small` and :attr:`DeviceStats.large`, three
slots per family — current at the family's index (``ALLOCATION``, ``ALLOCATED_BYTES``, ...), then
its ``*_PEAK`` and its ``*_TOTAL`` (torch's ``allocated``). Two fields are implied, not stored:

- ``freed = total - current + base``, with ``base`` the current value at the last
  ``reset_accumulated`` (0 before): torch's updates keep ``allocated - freed`` equal to the change of
  ``current``. So a decrease is one subtraction.
- the aggregate's ``current``, ``allocated`` and ``freed`` are the sums of the two pools'. Only its
  peak is stored: :attr:`DeviceStats.agg` holds it at the family's ``*_PEAK`` slot (the current and
  total slots stay 0), then the two ``oversize_*`` stats, which are single stats (all stored).

``increase_stat`` / ``decrease_stat`` below update a family in one pool and the aggregate (and
``increase_single`` / ``decrease_single`` a single stat); :mod:`memviz.sim._fastpath` does the same
arithmetic inline. ``memory_stats()`` builds the 122-key dict from these lists only when asked.

Key grammar of ``memory_stats()`` (torch/cuda/memory.py):
``"{family}.{all,large_pool,small_pool}.{allocated,current,freed,peak}"`` for the StatArray families
below, ``"oversize_{allocations,segments}.{allocated,current,freed,peak}"``, and six scalars.
"""

from __future__ import annotations

__all__ = [
    "AGGREGATE",
    "ALLOCATED_BYTES",
    "ALLOCATION",
    "ARRAY_FAMILIES",
    "INACTIVE_SPLIT",
    "INACTIVE_SPLIT_BYTES",
    "LARGE_POOL",
    "OVERSIZE_ALLOCATIONS",
    "OVERSIZE_SEGMENTS",
    "REQUESTED_BYTES",
    "RESERVED_BYTES",
    "SCALARS",
    "SEGMENT",
    "SMALL_POOL",
    "DeviceStats",
    "decrease_single",
    "decrease_stat",
    "increase_single",
    "increase_stat",
]

AGGREGATE, SMALL_POOL, LARGE_POOL = 0, 1, 2  # StatType::AGGREGATE, SMALL_POOL, LARGE_POOL

# StatArray families: COUNT = number of blocks/segments, SUM = bytes.
ARRAY_FAMILIES = (
    "active",  # COUNT: allocated or pending-free blocks (a free waiting on record_stream's events)
    "active_bytes",  # SUM: bytes of active blocks
    "allocated_bytes",  # SUM: bytes of allocated blocks (rounded sizes)
    "allocation",  # COUNT: allocated blocks
    "inactive_split",  # COUNT: free blocks that share a segment with other blocks (non-releasable)
    "inactive_split_bytes",  # SUM: bytes of those blocks
    "requested_bytes",  # SUM: bytes the callers asked for (unrounded)
    "reserved_bytes",  # SUM: bytes of all segments (cudaMalloc / mapped pages)
    "segment",  # COUNT: segments (cudaMalloc calls still alive)
)
OVERSIZE_FAMILIES = ("oversize_allocations", "oversize_segments")  # COUNT: blocks/segments >= max_split_size
SCALARS = ("max_split_size", "num_alloc_retries", "num_device_alloc", "num_device_free", "num_ooms",
           "num_sync_all_streams")
OOM_REJECTIONS = "num_oom_rejections"  # torch 2.12+: the 123rd key (sorts just before num_ooms)

# Slot of each stored family's *current* value in a counter list; peak is the next slot, total the
# one after (ALLOCATION_PEAK == ALLOCATION + 1, ...). active / active_bytes are not stored: they are
# allocation / allocated_bytes plus the frees pending on other streams' events (DeviceStats.pending),
# which only record_stream makes.
(ALLOCATION, ALLOCATION_PEAK, ALLOCATION_TOTAL,
 ALLOCATED_BYTES, ALLOCATED_BYTES_PEAK, ALLOCATED_BYTES_TOTAL,
 REQUESTED_BYTES, REQUESTED_BYTES_PEAK, REQUESTED_BYTES_TOTAL,
 INACTIVE_SPLIT, INACTIVE_SPLIT_PEAK, INACTIVE_SPLIT_TOTAL,
 INACTIVE_SPLIT_BYTES, INACTIVE_SPLIT_BYTES_PEAK, INACTIVE_SPLIT_BYTES_TOTAL,
 RESERVED_BYTES, RESERVED_BYTES_PEAK, RESERVED_BYTES_TOTAL,
 SEGMENT, SEGMENT_PEAK, SEGMENT_TOTAL,
 # in DeviceStats.agg only: the two single (not per-pool) stats
 OVERSIZE_ALLOCATIONS, OVERSIZE_ALLOCATIONS_PEAK, OVERSIZE_ALLOCATIONS_TOTAL,
 OVERSIZE_SEGMENTS, OVERSIZE_SEGMENTS_PEAK, OVERSIZE_SEGMENTS_TOTAL) = range(27)
_N_POOL_SLOTS = 21
_FAMILY_SLOT = {"allocation": ALLOCATION, "allocated_bytes": ALLOCATED_BYTES, "requested_bytes": REQUESTED_BYTES,
                "inactive_split": INACTIVE_SPLIT, "inactive_split_bytes": INACTIVE_SPLIT_BYTES,
                "reserved_bytes": RESERVED_BYTES, "segment": SEGMENT, "active": ALLOCATION,
                "active_bytes": ALLOCATED_BYTES}


def increase_stat(stats: DeviceStats, stat_type: int, family: int, amount: int) -> None:
    """Add ``amount`` to ``family`` in pool ``stat_type`` and so in the aggregate: current, total and
    (if exceeded) peak move."""
    s, other = stats.pools[stat_type]
    c = s[family] + amount
    s[family] = c
    if c > s[family + 1]:
        s[family + 1] = c
    s[family + 2] += amount
    c += other[family]  # the aggregate's current
    if c > stats.agg[family + 1]:
        stats.agg[family + 1] = c


def decrease_stat(stats: DeviceStats, stat_type: int, family: int, amount: int) -> None:
    """Subtract ``amount`` from ``family`` in pool ``stat_type`` and so in the aggregate: current
    drops, freed grows (implied), peak stays."""
    stats.pool[stat_type][family] -= amount


def increase_single(counters: list[int], slot: int, amount: int) -> None:
    """``increase_stat`` for a single stat (``oversize_*``): current, total and peak."""
    c = counters[slot] + amount
    counters[slot] = c
    if c > counters[slot + 1]:
        counters[slot + 1] = c
    counters[slot + 2] += amount


def decrease_single(counters: list[int], slot: int, amount: int) -> None:
    """``decrease_stat`` for a single stat (``oversize_*``): current drops, freed grows (implied)."""
    counters[slot] -= amount


class DeviceStats:
    """All counters of one device (``DeviceStats`` in CachingDeviceAllocator.h), laid out flat.

    Attributes:
        small, large: the pools' counter lists (see the module docstring for the slots).
        agg: the aggregate's peak per family, then the ``oversize_*`` stats.
        pool: ``(agg, small, large)``, indexed by stat type.
        pools: ``(None, (small, large), (large, small))``: a pool's counters and the other pool's,
            by stat type (the aggregate's current is their sum).
        num_alloc_retries, num_device_alloc, num_device_free, num_ooms, num_sync_all_streams: counts.
        max_split_size: bytes, fixed at construction (-1 when unlimited).
        accumulated_resets: how many times ``reset_accumulated`` ran (0: the totals count from the start).
        pending: by stat type, ``[blocks, bytes, active peak, active_bytes peak, blocks at reset, bytes at
            reset]`` of frees waiting on events; active = allocation + pending blocks (and bytes), its peak
            the larger of allocation's and the one kept here while frees were pending.
    """

    __slots__ = ("_base", "accumulated_resets", "agg", "large", "max_split_size", "num_alloc_retries",
                 "num_device_alloc", "num_device_free", "num_ooms", "num_sync_all_streams", "pending", "pool", "pools",
                 "small")

    def __init__(self, max_split_size: int) -> None:
        self.small = [0] * _N_POOL_SLOTS
        self.large = [0] * _N_POOL_SLOTS
        self.agg = [0] * 27
        self.pool = (self.agg, self.small, self.large)
        self.pools = (None, (self.small, self.large), (self.large, self.small))
        # freed = total - current + base; base = current at the last reset_accumulated (slot-aligned)
        self._base = ([0] * 27, [0] * _N_POOL_SLOTS, [0] * _N_POOL_SLOTS)
        # Fixed at construction; SIZE_MAX (unlimited) reads back as -1 (cast to int64).
        self.max_split_size = max_split_size if max_split_size < (1 << 63) else -1
        self.num_alloc_retries = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self.num_ooms = 0
        self.num_sync_all_streams = 0
        self.accumulated_resets = 0  # reset_accumulated() calls: totals count from the last one
        self.pending = ([0] * 6, [0] * 6, [0] * 6)

    def change_pending(self, stat_type: int, blocks: int, nbytes: int) -> None:
        """A free starts (+1, +bytes) or ends (-1, -bytes) waiting on events, in pool ``stat_type``."""
        for t in (AGGREGATE, stat_type):
            p = self.pending[t]
            p[0] += blocks
            p[1] += nbytes

    def note_active_peak(self, stat_type: int) -> None:
        """After an allocation while frees are pending: raise active's peaks to active's current values."""
        for t in (AGGREGATE, stat_type):
            p = self.pending[t]
            if t == AGGREGATE:
                n = self.small[ALLOCATION] + self.large[ALLOCATION]
                b = self.small[ALLOCATED_BYTES] + self.large[ALLOCATED_BYTES]
            else:
                s = self.pool[t]
                n, b = s[ALLOCATION], s[ALLOCATED_BYTES]
            if n + p[0] > p[2]:
                p[2] = n + p[0]
            if b + p[1] > p[3]:
                p[3] = b + p[1]

    def get(self, family: str, stat_type: int = AGGREGATE) -> dict[str, int]:
        """Return one stat as torch names its fields: ``{"current", "peak", "allocated", "freed"}``.

        ``family`` is a StatArray family (``"reserved_bytes"``, ...) or ``"oversize_allocations"`` /
        ``"oversize_segments"`` (no ``stat_type``).
        """
        if family in OVERSIZE_FAMILIES:
            slot = OVERSIZE_ALLOCATIONS if family == "oversize_allocations" else OVERSIZE_SEGMENTS
            s, b = self.agg, self._base[AGGREGATE]
            current, peak, total, base = s[slot], s[slot + 1], s[slot + 2], b[slot]
        else:
            slot = _FAMILY_SLOT[family]
            if stat_type == AGGREGATE:
                current = self.small[slot] + self.large[slot]
                peak = self.agg[slot + 1]
                total = self.small[slot + 2] + self.large[slot + 2]
                base = self._base[SMALL_POOL][slot] + self._base[LARGE_POOL][slot]
            else:
                s = self.pool[stat_type]
                current, peak, total = s[slot], s[slot + 1], s[slot + 2]
                base = self._base[stat_type][slot]
            if family in ("active", "active_bytes"):
                p = self.pending[stat_type]
                k = 0 if family == "active" else 1
                current += p[k]
                peak = max(peak, p[2 + k])
                base += p[4 + k]
        return {"current": current, "peak": peak, "allocated": total, "freed": total - current + base}

    def reset_peak(self) -> None:
        """``resetPeakStats``: peak = current for every stat."""
        small, large, agg = self.small, self.large, self.agg
        for slot in range(0, _N_POOL_SLOTS, 3):
            small[slot + 1] = small[slot]
            large[slot + 1] = large[slot]
            agg[slot + 1] = small[slot] + large[slot]
        for slot in (OVERSIZE_ALLOCATIONS, OVERSIZE_SEGMENTS):
            agg[slot + 1] = agg[slot]
        for t, p in enumerate(self.pending):
            p[2] = self.get("active", t)["current"]
            p[3] = self.get("active_bytes", t)["current"]

    def reset_accumulated(self) -> None:
        """``resetAccumulatedStats``: allocated = freed = 0 and the event counters to 0."""
        for s, b in zip(self.pool, self._base, strict=True):
            for slot in range(0, len(s), 3):
                s[slot + 2] = 0
                b[slot] = s[slot]  # freed = total - current + base = 0
        for p in self.pending:
            p[4], p[5] = p[0], p[1]
        self.num_alloc_retries = self.num_device_alloc = self.num_device_free = 0
        self.num_ooms = self.num_sync_all_streams = 0
        self.accumulated_resets += 1

    def as_dict(self, oom_rejections: bool = False) -> dict[str, int]:
        """Return the flat, key-sorted dict that ``torch.cuda.memory_stats()`` returns (122 keys in 2.11;
        with ``oom_rejections``, torch 2.12+'s 123: ``num_oom_rejections``, 0 here)."""
        get = self.get
        values: list[int] = []

        def array(family: str) -> None:
            for t in (AGGREGATE, LARGE_POOL, SMALL_POOL):
                d = get(family, t)
                values.extend((d["allocated"], d["current"], d["freed"], d["peak"]))

        for family in ARRAY_FAMILIES[:6]:
            array(family)
        values.extend((self.max_split_size, self.num_alloc_retries, self.num_device_alloc, self.num_device_free,
                       self.num_ooms, self.num_sync_all_streams))
        for family in OVERSIZE_FAMILIES:
            d = get(family)
            values.extend((d["allocated"], d["current"], d["freed"], d["peak"]))
        for family in ARRAY_FAMILIES[6:]:
            array(family)
        out = dict(zip(_KEYS, values, strict=True))
        if oom_rejections:
            out[OOM_REJECTIONS] = 0
            out = dict(sorted(out.items()))
        return out


def _sorted_keys() -> tuple[str, ...]:
    keys = []
    for name in ARRAY_FAMILIES[:6]:
        keys += [f"{name}.{t}.{f}" for t in ("all", "large_pool", "small_pool")
                 for f in ("allocated", "current", "freed", "peak")]
    keys += SCALARS
    keys += [f"{name}.{f}" for name in OVERSIZE_FAMILIES for f in ("allocated", "current", "freed", "peak")]
    for name in ARRAY_FAMILIES[6:]:
        keys += [f"{name}.{t}.{f}" for t in ("all", "large_pool", "small_pool")
                 for f in ("allocated", "current", "freed", "peak")]
    assert keys == sorted(keys) and len(keys) == 122
    return tuple(keys)


_KEYS = _sorted_keys()  # torch 2.11's 122 keys, in memory_stats() (sorted) order

"""The caching allocator: ``DeviceCachingAllocator`` of c10/cuda/CUDACachingAllocator.cpp, in Python.

Function names and the split between them follow the C++ (torch 2.11), so the two can be read side
by side: ``malloc`` → ``round_size``, ``get_pool``, ``get_allocation_size``, ``get_free_block``,
``alloc_block``, ``release_available_cached_blocks``, ``release_cached_blocks``, ``should_split``,
``alloc_found_block``; ``free`` → ``insert_events`` or ``free_block`` → ``try_merge_blocks``;
``empty_cache`` → ``release_cached_blocks`` → ``synchronize_and_free_events``, ``release_blocks`` →
``release_block``; ``malloc`` starts with ``process_events``. One device; streams, ``record_stream`` and
private pools (CUDA graphs, ``MemPool``) as in :mod:`memviz.sim.pools` and :mod:`memviz.sim.graphs`. The
size rules live once, in :mod:`memviz.sim.rules`; the counters change only through :mod:`memviz.sim.stats`'s
``increase_stat`` / ``decrease_stat``.

Streams are ints (torch's ``cudaStream_t`` value; 0 is the default stream). The simulator runs no
kernels, so it cannot know when a stream's work ends: a CUDA event recorded by ``insert_events`` completes
when the program says the stream is done (:meth:`CachingAllocator.synchronize`, i.e.
``torch.cuda.synchronize()`` / ``Stream.synchronize()``), and, as in torch, the block is freed by the
next ``malloc`` (``process_events``) or by ``empty_cache`` (which waits for every event).

The default stream and the device's own pools take the short way: ``malloc`` leaves it only when
``stream`` is not 0, a capture is underway or a free waits on events (``_slow_pool``); ``free`` only for a
block that ``record_stream`` marked.

Speed comes from the data layout (see :mod:`memviz.sim.stats` and :mod:`memviz.sim.blocks`): the
counters are flat int lists with ``freed`` and the aggregate's totals derived, a pool is a sorted
list of int keys, the trace is a list of tuples turned into dicts only by ``snapshot()``. The four
methods every request runs — ``malloc``, ``alloc_found_block``, ``free``, ``free_block`` — are written
here as the C++ reads; by default the allocator runs them as :mod:`memviz.sim._fastpath` writes them, with
their calls inlined (``fast_paths=False`` runs these). ``benchmarks/bench_sim.py --paths`` times both;
tests/test_sim_fastpath.py holds them equal.
"""

from __future__ import annotations

import operator
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator
from types import MethodType
from typing import Any

from memviz.errors import InputError, InputTypeError, InvalidFreeError, OutOfMemoryError, TorchAllocatorError

from . import _fastpath, rules
from .addresses import AddressSpace
from .blocks import ADDR_BITS, Block, BlockPool, Segment
from .config import AllocatorConfig, option_names, parse_alloc_conf
from .constants import (
    MIN_LARGE_ALLOC,
    ONE_EXA_BYTES,
    SIZE_MAX,
    SMALL_BUFFER,
)
from .invariants import check_invariants, format_segment_table
from .limits import MAX_DEVICE_BYTES, check_bytes, check_fraction
from .pools import DEFAULT_POOL, PoolId, PrivatePool, StreamPools
from .snapshot import build_segments, build_snapshot
from .stats import (
    ALLOCATED_BYTES,
    ALLOCATED_BYTES_PEAK,
    ALLOCATION,
    INACTIVE_SPLIT,
    INACTIVE_SPLIT_BYTES,
    OVERSIZE_ALLOCATIONS,
    OVERSIZE_SEGMENTS,
    REQUESTED_BYTES,
    RESERVED_BYTES,
    RESERVED_BYTES_PEAK,
    SEGMENT,
    DeviceStats,
    decrease_single,
    decrease_stat,
    increase_single,
    increase_stat,
)
from .summary import memory_summary

__all__ = ["CachingAllocator"]

_SIZE_SHIFT = ADDR_BITS


class _AllocParams:
    """Per-call state of one ``malloc`` (``AllocParams``): sizes in bytes."""

    __slots__ = ("alloc_size", "block", "pool", "size")

    def __init__(self) -> None:
        self.size = 0
        self.pool: BlockPool | None = None
        self.alloc_size = 0
        self.block: Block | None = None


def _checked_size(size: object) -> int:
    """Return ``malloc``'s size as a plain int, 0 for 0; raise for what torch refuses up front."""
    size = check_bytes(size, "malloc size", high=1 << 64, example="4 << 20")
    if size >= ONE_EXA_BYTES:
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate more than 1EB memory.", requested_bytes=size)
    return size


def _every_stream(stream: int) -> bool:
    return True


def _checked_stream(stream: object) -> int:
    """Return a stream as a plain int >= 0 (torch's ``cudaStream_t`` value; 0 the default stream)."""
    if isinstance(stream, bool) or not hasattr(type(stream), "__index__") or operator.index(stream) < 0:
        raise InputError(f"a stream is an int >= 0 (0: the default stream), not {stream!r}")
    return operator.index(stream)


def _checked_pool_id(pool_id: object) -> PoolId:
    """Return a pool id as a pair of ints (``MempoolId_t``), not (0, 0)."""
    ok = (isinstance(pool_id, tuple | list) and len(pool_id) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in pool_id))
    if not ok or tuple(pool_id) == DEFAULT_POOL:
        raise InputError(f"a private pool id is a pair of ints >= 0 other than (0, 0), e.g. (1, 0), not {pool_id!r}")
    return (pool_id[0], pool_id[1])


def _checked_version(version: object) -> tuple[int, int]:
    """Return ``"major.minor[...]"`` as (major, minor)."""
    parts = str(version).split(".")
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        raise InputError(f"torch_version is 'major.minor' such as '2.11' or torch.__version__, not {version!r}")
    return int(parts[0]), int(parts[1])


def _checked_address(ptr: object) -> int:
    """Return ``free``'s address as a plain int; refuse what is not one (None, a float, a str)."""
    if isinstance(ptr, bool) or not hasattr(type(ptr), "__index__"):
        raise InputTypeError(f"free() takes the int address that malloc returned, not {type(ptr).__name__} {ptr!r}")
    return operator.index(ptr)


def format_size(size: int) -> str:
    """Format a byte count the way the allocator's OOM message does (``format_size`` in the C++)."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024.0:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576.0:.2f} MiB"
    return f"{size / 1073741824.0:.2f} GiB"


class CachingAllocator:
    """A pure-Python replica of PyTorch's CUDA caching allocator (native backend) for one device.

    Args:
        total_memory: the device's capacity in bytes (``totalGlobalMem``).
        memory_fraction: per-process memory fraction in [0, 1] (default: None, no limit; 1.0 also
            means no limit). Overrides ``per_process_memory_fraction`` from ``alloc_conf``.
        alloc_conf: a ``PYTORCH_CUDA_ALLOC_CONF`` string (default: "", torch's defaults).
        context_bytes: bytes held on the device outside the cache (CUDA context, other processes);
            they lower what ``cudaMalloc`` can get (default: 0).
        device_name: how the OOM message names the device (default: "GPU 0").
        record_history: keep a trace of allocator events for ``snapshot()["device_traces"]``
            (default: True).
        torch_version: the torch whose ``memory_stats()`` keys to return, ``"major.minor"``: 122 keys
            up to 2.11, plus ``num_oom_rejections`` from 2.12 (default: "2.11").
        clock: returns the ``time_us`` of trace entries (default: None, entries are numbered 0, 1, ...
            so that traces are deterministic).
        fast_paths: run ``malloc``, ``alloc_found_block``, ``free`` and ``free_block`` as
            :mod:`memviz.sim._fastpath` writes them, their calls inlined (default: True); False runs the methods
            below, which read line by line with the C++ and take 1.3-1.5 times as long. Same results.

    Raises:
        AllocatorConfigError: ``alloc_conf`` is malformed or names an unknown option.
        InputTypeError: ``total_memory``, ``context_bytes`` or ``memory_fraction`` is not a number.
        InputError: ``total_memory`` outside 1 byte .. :data:`~memviz.sim.limits.MAX_DEVICE_BYTES` (16 TiB),
            ``context_bytes`` above it, or ``memory_fraction`` outside [0, 1].

    Example::

        >>> a = CachingAllocator(16 << 30)
        >>> p = a.malloc(4 << 20)
        >>> a.memory_reserved(), a.memory_allocated()
        (20971520, 4194304)
    """

    def __init__(self, total_memory: int, memory_fraction: float | None = None, alloc_conf: str = "", *,
                 context_bytes: int = 0, device_name: str = "GPU 0", record_history: bool = True,
                 clock: Callable[[], int] | None = None, torch_version: str = "2.11",
                 fast_paths: bool = True) -> None:
        total_memory = check_bytes(total_memory, "total_memory", low=1, high=MAX_DEVICE_BYTES, example="80 << 30",
                                   why="the simulator models devices of up to 16 TiB (memviz.sim.limits)")
        context_bytes = check_bytes(context_bytes, "context_bytes", high=total_memory, example="0")
        self.config: AllocatorConfig = parse_alloc_conf(alloc_conf)
        cfg = self.config
        self.total_memory = total_memory
        self.context_bytes = context_bytes
        self.device_name = device_name
        self.record_history = record_history
        self._clock = clock
        # The trace, flat: action, addr, size, stream of each entry in turn (no object per entry, so a
        # long replay's history costs 4 list slots an event); time_us in _trace_times when clock is given.
        self._trace: list[str | int] = []
        self._trace_times: list[int] | None = [] if clock is not None else None
        # trace_extend((action, addr, size, stream)) records one entry; None when not recording
        self._trace_extend: Callable[[tuple[str, int, int, int]], None] | None = None
        if record_history:
            self._trace_extend = self._trace.extend if clock is None else self._extend_timed
        self._address_space = AddressSpace()
        self._params = _AllocParams()
        self.torch_version = _checked_version(torch_version)
        self.stats = DeviceStats(cfg.max_split_size)
        # the device's own pools, by stream; small_blocks / large_blocks are the default stream's
        self.own_pools = StreamPools(None)
        self.small_blocks = self.own_pools.get(True, 0)
        self.large_blocks = self.own_pools.get(False, 0)
        # private pools (graph_pools), those no graph or MemPool holds any more, and the captures or
        # use_mem_pool contexts diverting allocations to one: (pool id, filter of the stream)
        self.graph_pools: dict[PoolId, PrivatePool] = {}
        self.graph_pools_freeable: dict[PoolId, PrivatePool] = {}
        # pools torch deleted while blocks still lay in them (see release_cached_blocks), and those blocks'
        # allocations: torch keeps pointers into the deleted pool there, so a free of one is refused
        self._erased_pools: dict[PoolId, PrivatePool] = {}
        self._orphaned: dict[int, Block] = {}  # ptr -> allocated block of an erased pool
        self.captures_underway: list[tuple[PoolId, Callable[[int], bool]]] = []
        # cross-stream frees: blocks whose free waits for a capture to end, events by stream, and the
        # number of the last event each stream has completed (events are numbered 1, 2, ... as recorded)
        self.needs_events_deferred_until_no_capture: list[Block] = []
        self.cuda_events: dict[int, deque[tuple[int, Block]]] = {}
        self._cudagraph_stream_uses: dict[int, set[int]] = {}  # ptr -> streams recorded during a capture
        self.stream_uses: dict[int, set[int]] = {}  # ptr of a live block -> other streams it was used on
        self.event_count: dict[int, int] = {}  # ptr of a pending free -> events (or deferred streams) left
        self._event_seq = 0
        self._stream_done: dict[int, int] = {}
        self._pending_free: dict[int, Block] = {}  # ptr -> block freed but waiting on events
        self._diverting = False  # events pending or a capture underway: malloc leaves its fast path
        self._oom_observers: list[Callable[[int, int, int, int], None]] = []
        # the last pool ids handed out (memviz.sim.graphs), as torch's MemPool::uid_ / uuid_ (from 1):
        # (0, n) for MemPool() and graph_pool_handle(), (n, 0) for a capture without a pool
        self.pool_uid = 0
        self.capture_uuid = 0
        self._active_blocks: dict[int, Block] = {}  # ptr -> allocated block
        self._segments: dict[int, Segment] = {}  # base ptr -> segment
        self.total_allocated_memory = 0  # bytes obtained from the driver (== reserved_bytes.all.current)
        self._max_split_size = cfg.max_split_size
        self._max_non_split_rounding_size = cfg.max_non_split_rounding_size
        self._large_segment_size = cfg.large_segment_size
        self._expandable = cfg.expandable_segments
        # roundup_power2_divisions by size.bit_length() (rules.division_table); None: 512-byte rounding only
        self._divisions = rules.division_table(cfg.roundup_power2_divisions)
        self.allowed_memory_bytes: int | None = None
        self._set_fraction = False
        self.settings_changed = False  # set_allocator_settings ran (oversize counts may then drift, as in torch)
        self._gc_active = False
        self._gc_threshold_bytes = 0
        fraction = memory_fraction if memory_fraction is not None else cfg.per_process_memory_fraction
        if fraction is not None:
            self.set_memory_fraction(fraction)
        if fast_paths:
            self.malloc = MethodType(_fastpath.malloc, self)
            self.alloc_found_block = MethodType(_fastpath.alloc_found_block, self)
            self.free = MethodType(_fastpath.free, self)
            self.free_block = MethodType(_fastpath.free_block, self)

    # ------------------------------------------------------------------ settings and simple queries

    def set_memory_fraction(self, fraction: float) -> None:
        """Limit the bytes this allocator may reserve to ``floor(fraction * total_memory)``.

        ``torch.cuda.set_per_process_memory_fraction``. A fraction of 1 removes the limit.

        Raises:
            InputTypeError: ``fraction`` is not a number. InputError: it is outside [0, 1].
        """
        fraction = check_fraction(fraction, "memory fraction")
        self._set_fraction = True
        if fraction == 1:
            self.allowed_memory_bytes = None
        else:
            self.allowed_memory_bytes = int(float(fraction) * float(self.total_memory))
        self._update_gc()

    def _update_gc(self) -> None:
        self._gc_active = (self.allowed_memory_bytes is not None
                           and self.config.garbage_collection_threshold > 0.0)
        # garbage_collect_cached_blocks' threshold in bytes: threshold * allowed_memory_maximum
        self._gc_threshold_bytes = (int(self.config.garbage_collection_threshold * float(self.allowed_memory_bytes))
                                    if self._gc_active else 0)

    def get_memory_fraction(self) -> float:
        """Return the memory fraction in force (``torch.cuda.get_per_process_memory_fraction``): the limit in
        bytes over ``total_memory``, 1.0 when none was set (``getMemoryFraction``)."""
        if not self._set_fraction:
            return 1.0
        allowed = self.allowed_memory_bytes if self.allowed_memory_bytes is not None else self.total_memory
        return allowed / self.total_memory

    def set_allocator_settings(self, settings: str) -> None:
        """Re-read the allocator options at run time (``torch.cuda.memory._set_allocator_settings``).

        As torch 2.11's ``AcceleratorAllocatorConfig::parseArgs`` does (and the H200 recordings of
        tests/data/streams show): every call resets ``max_split_size_mb``, ``roundup_power2_divisions`` and
        ``garbage_collection_threshold`` unless it names them (``"max_split_size_mb:64"`` then
        ``"roundup_power2_divisions:4"`` leaves no max_split_size); every other option keeps its value unless
        named (``expandable_segments:True``, from the environment or an earlier call, stays on through
        ``"max_split_size_mb:40"`` and ``""``). It applies to the requests after it; segments already made stay
        as they are (an expandable segment made before ``expandable_segments:False`` is then skipped by best
        fit, as torch does). ``memory_stats()["max_split_size"]`` keeps the value from construction, as
        torch's does; ``per_process_memory_fraction`` acts only at construction.

        Raises:
            AllocatorConfigError: ``settings`` is malformed; the settings in force stay.
        """
        cfg = parse_alloc_conf(settings)
        named, prev = option_names(settings), self.config
        if "expandable_segments" not in named:
            cfg.expandable_segments = prev.expandable_segments
        if "large_segment_size_mb" not in named:
            cfg.large_segment_size = prev.large_segment_size
        if "max_non_split_rounding_mb" not in named:
            cfg.max_non_split_rounding_size = prev.max_non_split_rounding_size
        if "per_process_memory_fraction" not in named:
            cfg.per_process_memory_fraction = prev.per_process_memory_fraction
        cfg.other = {**prev.other, **cfg.other}
        self.settings_changed = True
        self.config = cfg
        self._max_split_size = cfg.max_split_size
        self._max_non_split_rounding_size = cfg.max_non_split_rounding_size
        self._large_segment_size = cfg.large_segment_size
        self._expandable = cfg.expandable_segments
        self._divisions = rules.division_table(cfg.roundup_power2_divisions)
        self._update_gc()

    def attach_out_of_memory_observer(self, observer: Callable[[int, int, int, int], None]) -> None:
        """Call ``observer(device, alloc_size, device_total, device_free)`` on every OOM, before the error is
        raised (``torch._C._cuda_attach_out_of_memory_observer``). Sizes in bytes; ``device_total`` is the
        memory fraction's limit when one is set, as in torch; device is 0."""
        if not callable(observer):
            raise InputTypeError(f"an out-of-memory observer must be callable, not {type(observer).__name__}")
        self._oom_observers.append(observer)

    def memory_allocated(self) -> int:
        """Return the bytes occupied by live allocations (``allocated_bytes.all.current``)."""
        stats = self.stats
        return stats.small[ALLOCATED_BYTES] + stats.large[ALLOCATED_BYTES]

    def memory_reserved(self) -> int:
        """Return the bytes held from the driver, cached or not (``reserved_bytes.all.current``)."""
        stats = self.stats
        return stats.small[RESERVED_BYTES] + stats.large[RESERVED_BYTES]

    def max_memory_allocated(self) -> int:
        """Return the peak of ``memory_allocated()`` in bytes since the last peak reset."""
        return self.stats.agg[ALLOCATED_BYTES_PEAK]

    def max_memory_reserved(self) -> int:
        """Return the peak of ``memory_reserved()`` in bytes since the last peak reset."""
        return self.stats.agg[RESERVED_BYTES_PEAK]

    def device_free_bytes(self) -> int:
        """Return what ``cudaMemGetInfo`` would report free: total - context - reserved bytes."""
        return self.total_memory - self.context_bytes - self.total_allocated_memory

    def requested_size(self, ptr: int) -> int:
        """Return the unrounded size in bytes requested for the live allocation at ``ptr``.

        Raises:
            InvalidFreeError: ``ptr`` is not a live allocation.
        """
        block = self.live_block(ptr)
        if block is None:
            raise InvalidFreeError(f"no live allocation at address {ptr:#x}")
        return block.requested_size

    def block_size(self, ptr: int) -> int:
        """Return the rounded size in bytes of the block holding the live allocation at ``ptr``."""
        block = self.live_block(ptr)
        if block is None:
            raise InvalidFreeError(f"no live allocation at address {ptr:#x}")
        return block.size

    def reset_peak_memory_stats(self) -> None:
        """Set every stat's peak to its current value (``torch.cuda.reset_peak_memory_stats``)."""
        self.stats.reset_peak()

    def reset_accumulated_memory_stats(self) -> None:
        """Zero the allocated/freed totals and event counters (``reset_accumulated_memory_stats``)."""
        self.stats.reset_accumulated()

    def memory_stats(self) -> dict[str, int]:
        """Return the flat dict of allocator statistics ``torch.cuda.memory_stats()`` returns.

        Keys (122, sorted): ``"{stat}.{pool}.{metric}"`` with stat in ``active, active_bytes,
        allocated_bytes, allocation, inactive_split, inactive_split_bytes, requested_bytes,
        reserved_bytes, segment``, pool in ``all, large_pool, small_pool`` and metric in
        ``allocated, current, freed, peak``; ``oversize_allocations.{metric}``,
        ``oversize_segments.{metric}``; and ``max_split_size`` (-1 when unlimited),
        ``num_alloc_retries``, ``num_device_alloc``, ``num_device_free``, ``num_ooms``,
        ``num_sync_all_streams``, and from torch 2.12 (``torch_version``) ``num_oom_rejections`` (always 0:
        ``throw_on_cudamalloc_oom`` is not modelled). Byte stats are in bytes, the others are counts.
        """
        return self.stats.as_dict(oom_rejections=self.torch_version >= (2, 12))

    # ------------------------------------------------------------------ trace

    def _extend_timed(self, entry: tuple[str, int, int, int]) -> None:
        self._trace.extend(entry)
        self._trace_times.append(self._clock())

    def record_trace(self, action: str, addr: int, size: int, stream: int = 0) -> None:
        trace_extend = self._trace_extend
        if trace_extend is not None:
            trace_extend((action, addr, size, stream))

    # ------------------------------------------------------------------ sizes

    def round_size(self, size: int) -> int:
        """Return the block size in bytes for a request of ``size`` bytes (:func:`memviz.sim.rules.round_size`)."""
        return rules.round_size(size, self.config)

    def get_pool(self, size: int, stream: int = 0) -> BlockPool:
        """Return the pool for a rounded size on ``stream`` (``get_pool``): small if ``size <= 1 MiB``, else
        large; a private pool's when a capture or ``use_mem_pool`` underway takes this stream (the latest
        begun that does: torch scans ``captures_underway`` from the end, so nested ``use_mem_pool`` contexts
        allocate into the innermost pool)."""
        small = rules.is_small(size)
        for pool_id, accepts in reversed(self.captures_underway):
            if accepts(stream):
                return self.graph_pools[pool_id].pools.get(small, stream)
        if stream == 0:
            return self.small_blocks if small else self.large_blocks
        return self.own_pools.get(small, stream)

    def get_allocation_size(self, size: int) -> int:
        """Return the segment size in bytes for a rounded size (:func:`memviz.sim.rules.get_allocation_size`)."""
        return rules.get_allocation_size(size, self.config)

    # ------------------------------------------------------------------ malloc

    def malloc(self, size: int, stream: int = 0) -> int:
        """Allocate ``size`` bytes on ``stream`` and return the block's address (``DeviceCachingAllocator::malloc``).

        ``stream`` (default 0, the default stream) is the stream the tensor is made on: only blocks cached
        on the same stream serve it. First, unless a capture is underway, frees whose events completed are
        finished (``process_events``).

        ``malloc(0)`` returns 0 (a null pointer, as ``caching_allocator_alloc(0)`` does) and changes
        nothing: a 0-byte tensor never reaches the allocator.

        Raises:
            InputTypeError: ``size`` is not an int.
            InputError: ``size`` is negative (or above 2**64).
            OutOfMemoryError: no cached block fits and the driver (or the memory fraction) refuses a
                new segment, even after releasing every cached segment. Requests of 2**60 bytes or
                more fail before the allocator runs and change no stats.

        Runtime complexity: O(log n) search plus O(n) list insert for n free blocks in the pool.
        """
        if type(size) is not int or not 0 < size < ONE_EXA_BYTES:
            size = _checked_size(size)
            if size == 0:
                return 0

        p = self._params  # one AllocParams, reused: malloc never re-enters itself
        p.size = self.round_size(size)
        if stream or self._diverting:
            p.pool = self._slow_pool(p.size, stream)  # process_events, then get_pool
        else:
            p.pool = self.get_pool(p.size)
        block_found = self.get_free_block(p)
        if not block_found:
            # torch computes alloc_size up front; only the paths below read it
            p.alloc_size = self.get_allocation_size(p.size)
            if self._gc_active:
                self.garbage_collect_cached_blocks()
            block_found = (self.alloc_block(p, False)
                           or (self.release_available_cached_blocks(p) and self.alloc_block(p, False))
                           or (not self.captures_underway and self.release_cached_blocks()
                               and self.alloc_block(p, True)))
        if not block_found:
            self._raise_oom(p, size)
        split_remainder = self.should_split(p.block, p.size)
        return self.alloc_found_block(p, size, split_remainder)

    def should_split(self, block: Block, size: int) -> bool:
        """Whether ``block`` is split to serve a rounded ``size`` in bytes (:func:`memviz.sim.rules.should_split`)."""
        return rules.should_split(block.size, size, self.config, small=block.segment.pool.is_small,
                                  expandable=self._expandable)

    def get_free_block(self, p: _AllocParams) -> bool:
        """Take the best-fitting cached block for ``p`` out of its pool (``get_free_block``).

        Best fit is the smallest free block with ``size >= p.size``, lowest address first, subject
        to the oversize rules of ``max_split_size``. Sets ``p.block``; returns whether one was found.
        """
        pool = p.pool
        if self._gc_active:
            self._tick_gc_clock(pool)
        keys = pool.keys
        size = p.size
        i = bisect_left(keys, size << _SIZE_SHIFT)
        if i == len(keys):
            return False
        by_key = pool.by_key
        block = by_key[keys[i]]
        if block.segment.expandable and not self._expandable:
            # expandable_segments was turned off after this segment was made: only other blocks serve
            n = len(keys)
            while block.segment.expandable:
                i += 1
                if i == n:
                    return False
                block = by_key[keys[i]]
        elif block.segment.expandable:
            # best fit by the size a block can grow to (its size plus an unmapped successor)
            n = len(keys)
            nxt = block.next
            best = block.size + (nxt.size if nxt is not None and not nxt.mapped else 0)
            j = i + 1
            while j < n and block.segment.expandable:
                cand = by_key[keys[j]]
                nxt = cand.next
                grow = cand.size + (nxt.size if nxt is not None and not nxt.mapped else 0)
                if grow >= best:
                    break
                block, best, i = cand, grow, j
                j += 1
        bsize = block.size
        max_split = self._max_split_size
        if size < max_split:
            if bsize >= max_split:
                return False
        elif bsize >= size + self._max_non_split_rounding_size:
            return False
        p.block = block
        del by_key[keys.pop(i)]  # pool.blocks.erase(it)
        return True

    def alloc_block(self, p: _AllocParams, is_retry: bool) -> bool:
        """Get a new segment from the driver for ``p`` (``alloc_block``); sets ``p.block``.

        Fails without calling the driver when the memory fraction would be exceeded; a failed
        ``cudaMalloc`` changes no stats.
        """
        stats = self.stats
        if is_retry:
            stats.num_alloc_retries += 1
        alloc_size = p.alloc_size
        allowed = self.allowed_memory_bytes
        if allowed is not None and self.total_allocated_memory + alloc_size > allowed:
            return False
        if self._expandable:
            p.block = self.try_allocate_expandable_block(p.pool, p.size)
            if p.block is None:
                return False
            if p.pool.owner is not None:
                p.pool.owner.cudaMalloc_count += 1
            return True
        if alloc_size > self.total_memory - self.context_bytes - self.total_allocated_memory:  # device_free_bytes()
            return False
        ptr = self._address_space.malloc(alloc_size)
        if ptr is None:  # no address range left: cudaMalloc fails, nothing changed
            return False
        self.total_allocated_memory += alloc_size
        pool = p.pool
        if pool.owner is not None:
            pool.owner.cudaMalloc_count += 1
        segment = Segment(ptr, alloc_size, pool)
        block = Block(alloc_size, ptr, segment)
        segment.head = block
        self._segments[ptr] = segment
        st = pool.stat_type
        increase_stat(stats, st, SEGMENT, 1)
        increase_stat(stats, st, RESERVED_BYTES, alloc_size)
        if alloc_size >= self._max_split_size:
            increase_single(stats.agg, OVERSIZE_SEGMENTS, 1)
        stats.num_device_alloc += 1
        self.record_trace("segment_alloc", ptr, alloc_size, pool.stream)
        p.block = block
        return True

    def alloc_found_block(self, p: _AllocParams, orig_size: int, split_remainder: bool) -> int:
        """Split ``p.block`` if asked, mark it allocated and count it (``alloc_found_block``).

        The allocation takes the low end of the block; the original Block object becomes the free
        remainder above it and keeps its (stale) ``requested_size``. ``orig_size``: the request in bytes.
        Returns the address.
        """
        size = p.size
        pool = p.pool
        stat_type = pool.stat_type
        stats = self.stats
        block = p.block
        expandable = block.segment.expandable

        already_split = block.is_split()
        if split_remainder:
            remaining = block

            block = Block(size, remaining.ptr, remaining.segment)
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            else:
                block.segment.head = block
            block.next = remaining

            remaining.prev = block
            remaining.ptr += size
            remaining.size -= size
            pool.insert_into_blocks(remaining)

            if already_split and not expandable:
                # An already-split inactive block is being shrunk by size bytes.
                decrease_stat(stats, stat_type, INACTIVE_SPLIT_BYTES, block.size)
            elif not expandable:
                # A new split inactive block is being created from a previously unsplit block, size
                # remaining.size bytes.
                increase_stat(stats, stat_type, INACTIVE_SPLIT_BYTES, remaining.size)
                increase_stat(stats, stat_type, INACTIVE_SPLIT, 1)
        elif already_split and not expandable:
            # An already-split block is becoming active
            decrease_stat(stats, stat_type, INACTIVE_SPLIT_BYTES, block.size)
            decrease_stat(stats, stat_type, INACTIVE_SPLIT, 1)

        block.allocated = True
        block.requested_size = orig_size
        self.record_trace("alloc", block.ptr, orig_size, pool.stream)
        self._active_blocks[block.ptr] = block

        # active and active_bytes are not stored: they are allocation and allocated_bytes plus the frees pending
        # on events (DeviceStats.pending), so these increases count them too
        increase_stat(stats, stat_type, ALLOCATION, 1)
        increase_stat(stats, stat_type, ALLOCATED_BYTES, block.size)
        increase_stat(stats, stat_type, REQUESTED_BYTES, block.requested_size)
        if block.size >= self._max_split_size:
            increase_single(stats.agg, OVERSIZE_ALLOCATIONS, 1)
        if self._pending_free:
            stats.note_active_peak(stat_type)  # active's peak moves apart from allocation's
        return block.ptr

    # ------------------------------------------------------------------ free

    def free(self, ptr: int) -> None:
        """Free the allocation at address ``ptr`` (``DeviceCachingAllocator::free``).

        The block returns to its pool and merges with free neighbours; the segment stays cached
        until ``empty_cache()`` (or an allocation that needs the memory). ``free(0)`` does nothing.
        A block that ``record_stream`` marked as used on other streams waits instead: one event per
        such stream is recorded (``insert_events``; during a capture, deferred until it ends) and the
        block stays active ("active_pending_free") until they complete (see :meth:`synchronize`).

        Raises:
            InputTypeError: ``ptr`` is not an int (None, a float). InvalidFreeError: ``ptr`` is not a
                live allocation (unknown or already freed). Either way nothing changes.

        Runtime complexity: O(log n) plus O(n) list insert for n free blocks in the pool.
        """
        if type(ptr) is not int:
            ptr = _checked_address(ptr)
        block = self._active_blocks.pop(ptr, None)
        if block is None:
            if ptr == 0:
                return
            if ptr in self._orphaned:
                raise TorchAllocatorError(self._erased_message(self._orphaned[ptr], "free"))
            kind = "already-freed or interior" if self._owns(ptr) else "unknown"
            raise InvalidFreeError(f"free of {kind} address {ptr:#x}: not a live allocation "
                                   "(allocator state unchanged)")
        stats = self.stats
        pool = block.segment.pool
        stat_type = pool.stat_type
        decrease_stat(stats, stat_type, ALLOCATION, 1)
        decrease_stat(stats, stat_type, ALLOCATED_BYTES, block.size)

        waits_on_events = bool(self.stream_uses) and ptr in self.stream_uses  # !block->stream_uses.empty()
        # free_requested; a free that does not wait writes it with free_block's free_completed as one "free"
        # entry (the two are adjacent and equal; snapshot() writes both)
        self.record_trace("free_requested" if waits_on_events else "free", ptr, block.requested_size, pool.stream)

        if block.size >= self._max_split_size:
            decrease_single(stats.agg, OVERSIZE_ALLOCATIONS, 1)

        if waits_on_events:
            self._free_with_events(block)
        else:
            block.allocated = False
            self.free_block(block)

    def _slow_pool(self, rounded: int, stream: int) -> BlockPool:
        """``malloc``'s path off the default stream or while frees wait on events or a capture is underway:
        ``process_events`` (unless capturing), then ``get_pool``."""
        stream = _checked_stream(stream)  # before anything changes
        if not self.captures_underway and (self.cuda_events or self.needs_events_deferred_until_no_capture):
            self.process_events()
        self._update_diverting()
        return self.get_pool(rounded, stream)

    def _update_diverting(self) -> None:
        self._diverting = bool(self.captures_underway or self.cuda_events
                               or self.needs_events_deferred_until_no_capture)

    def _free_with_events(self, block: Block) -> None:
        """``free``'s branch for a block used on other streams (``free`` counted it already): it stays active
        ("active_pending_free") until one event per such stream completes.

        The block keeps ``allocated`` set while it waits (see :class:`~memviz.sim.blocks.Block`)."""
        self._pending_free[block.ptr] = block
        self.stats.change_pending(block.segment.pool.stat_type, 1, block.size)
        if self.captures_underway:
            # cudaEventQuery is illegal during capture: record the events once no capture is underway
            self.event_count[block.ptr] = len(self.stream_uses[block.ptr])
            self.needs_events_deferred_until_no_capture.append(block)
        else:
            self.insert_events(block)
        self._update_diverting()

    def record_stream(self, ptr: int, stream: int) -> None:
        """Mark the allocation at ``ptr`` as used on ``stream`` (``Tensor.record_stream`` / ``recordStream``).

        Its free will then wait until ``stream`` has done the work queued on it so far. The allocation's own
        stream is ignored, as in torch. ``record_stream(0, s)`` does nothing (an empty tensor).

        Raises:
            InvalidFreeError: ``ptr`` is not a live allocation. InputError: ``stream`` is not an int >= 0.
        """
        stream = _checked_stream(stream)
        if ptr == 0:
            return
        block = self.live_block(_checked_address(ptr))
        if block is None:
            raise InvalidFreeError(f"record_stream: no live allocation at address {ptr:#x}")
        if stream == block.segment.pool.stream:
            return
        self.stream_uses.setdefault(block.ptr, set()).add(stream)
        if self.captures_underway:
            self._cudagraph_stream_uses.setdefault(block.ptr, set()).add(stream)

    def synchronize(self, stream: int | None = None) -> None:
        """Let ``stream`` (None: every stream) finish the work queued so far (``torch.cuda.synchronize()``,
        ``Stream.synchronize()``): the events recorded on it complete.

        Like torch, this changes no stats by itself: the blocks those events held are freed by the next
        ``malloc`` (``process_events``) or ``empty_cache``.
        """
        if stream is None:
            for s in self.cuda_events:
                self._stream_done[s] = self._event_seq
        else:
            self._stream_done[_checked_stream(stream)] = self._event_seq

    def insert_events(self, block: Block) -> None:
        """Record one event per stream in ``block.stream_uses`` and clear them (``insert_events``).

        torch's stream set is a hash set, so the order of the events is unspecified; here it is by stream.
        """
        ptr = block.ptr
        streams = self.stream_uses.pop(ptr, ())
        for stream in sorted(streams):
            self._event_seq += 1
            self.event_count[ptr] = self.event_count.get(ptr, 0) + 1
            events = self.cuda_events.get(stream)
            if events is None:
                events = self.cuda_events[stream] = deque()
            events.append((self._event_seq, block))

    def insert_events_deferred_until_no_capture(self) -> None:
        """Record the events of frees made during a capture (``insert_events_deferred_until_no_capture``).

        Streams recorded during the capture are dropped (their work is part of the graph); a block left with
        no stream is freed at once.
        """
        deferred = self.needs_events_deferred_until_no_capture
        if not deferred:
            return
        self.needs_events_deferred_until_no_capture = []
        for block in deferred:
            ptr = block.ptr
            during = self._cudagraph_stream_uses.pop(ptr, ())
            self.stream_uses[ptr] = {s for s in self.stream_uses[ptr] if s not in during}
            del self.event_count[ptr]
            self.insert_events(block)
            if ptr not in self.event_count:
                self._finish_free(block)

    def process_events(self) -> None:
        """Finish the frees whose events have all completed (``process_events``), stream by stream and in
        each stream in event order, stopping at its first event still running."""
        self.insert_events_deferred_until_no_capture()
        for stream in list(self.cuda_events):
            events = self.cuda_events[stream]
            done = self._stream_done.get(stream, 0)
            while events and events[0][0] <= done:
                self._event_done(events.popleft()[1])
            if not events:
                del self.cuda_events[stream]
        self._update_diverting()

    def is_pending_free(self, ptr: int) -> bool:
        """Whether ``ptr`` was freed and waits on other streams' events."""
        return ptr in self._pending_free

    def complete_free(self, ptr: int) -> None:
        """Finish now the free of ``ptr`` that waits on events, as if every stream it waits on were done (what
        a replay of a recorded ``free_completed`` does; its events are dropped).

        Raises:
            InvalidFreeError: no free of ``ptr`` is waiting.
        """
        block = self._pending_free.get(ptr)
        if block is None:
            raise InvalidFreeError(f"complete_free: no free of {ptr:#x} waits on events")
        if block in self.needs_events_deferred_until_no_capture:
            self.needs_events_deferred_until_no_capture.remove(block)
            self.stream_uses.pop(ptr, None)
            self._cudagraph_stream_uses.pop(ptr, None)
        for stream in list(self.cuda_events):
            events = deque(e for e in self.cuda_events[stream] if e[1] is not block)
            if events:
                self.cuda_events[stream] = events
            else:
                del self.cuda_events[stream]
        del self.event_count[ptr]
        self._finish_free(block)
        self._update_diverting()

    def synchronize_and_free_events(self, owner: PrivatePool | None = None) -> None:
        """Wait for every outstanding event (of ``owner``'s blocks only, when given) and finish the frees it
        held (``synchronize_and_free_events``); counts one ``num_sync_all_streams``."""
        self.stats.num_sync_all_streams += 1
        self.insert_events_deferred_until_no_capture()
        for stream in list(self.cuda_events):
            kept: deque[tuple[int, Block]] = deque()
            for seq, block in self.cuda_events[stream]:
                if owner is not None and block.segment.pool.owner is not owner:
                    kept.append((seq, block))
                    continue
                self._event_done(block)
            if kept:
                self.cuda_events[stream] = kept
            else:
                del self.cuda_events[stream]
        self._update_diverting()

    def _event_done(self, block: Block) -> None:
        """``block->event_count--``, and ``free_block`` at 0."""
        ptr = block.ptr
        left = self.event_count[ptr] - 1
        if left:
            self.event_count[ptr] = left
        else:
            del self.event_count[ptr]
            self._finish_free(block)

    def _finish_free(self, block: Block) -> None:
        """``free_block`` for a block whose events completed: active and requested bytes drop now.

        Raises:
            TorchAllocatorError: the block's pool was deleted while the free waited (see :meth:`_erase_pool`).
        """
        owner = block.segment.pool.owner
        if owner is not None and owner.erased:
            raise TorchAllocatorError(self._erased_message(block, "pending free"))
        del self._pending_free[block.ptr]
        block.allocated = False
        pool = block.segment.pool
        self.stats.change_pending(pool.stat_type, -1, -block.size)
        self.record_trace("free_completed", block.ptr, block.requested_size, pool.stream)
        self.free_block(block)

    @staticmethod
    def _erased_message(block: Block, what: str) -> str:
        pool = block.segment.pool.owner
        return (f"undefined in torch: the {what} of the {block.size:,} B block at {block.ptr:#x} would return it to "
                f"private pool {pool.id if pool is not None else '?'}, which torch deleted while the block still lay "
                "in it (with expandable segments a pool's cudaMalloc_count counts alloc_block calls up and unmapped "
                "ranges down, and empty_cache erased the pool when it reached 0); torch's allocator would work on "
                "freed memory here, so the simulator refuses (nothing changed)")

    def _owns(self, ptr: int) -> bool:
        return any(s.ptr <= ptr < s.ptr + s.size for s in self._segments.values())

    def free_block(self, block: Block) -> None:
        """Return a freed block to its pool, merging it with free neighbours (``free_block``).

        Its ``free_completed`` trace entry is written by the caller (``free``, or ``_finish_free`` for a free
        that waited on events), before the merges as in torch."""
        requested_size = block.requested_size
        pool = block.segment.pool
        net_change_inactive_split_blocks = 0
        net_change_inactive_split_size = 0

        for merge_candidate in (block.prev, block.next):
            subsumed_size = self.try_merge_blocks(block, merge_candidate, pool)
            if subsumed_size > 0:
                net_change_inactive_split_blocks -= 1
                net_change_inactive_split_size -= subsumed_size

        pool.insert_into_blocks(block)

        if block.is_split():
            net_change_inactive_split_blocks += 1
            net_change_inactive_split_size += block.size

        stats = self.stats
        stat_type = pool.stat_type
        # inactive_split leaves expandable segments out, as torch does
        if not block.segment.expandable:
            if net_change_inactive_split_blocks > 0:
                increase_stat(stats, stat_type, INACTIVE_SPLIT, net_change_inactive_split_blocks)
            elif net_change_inactive_split_blocks < 0:
                decrease_stat(stats, stat_type, INACTIVE_SPLIT, -net_change_inactive_split_blocks)
            if net_change_inactive_split_size > 0:
                increase_stat(stats, stat_type, INACTIVE_SPLIT_BYTES, net_change_inactive_split_size)
            elif net_change_inactive_split_size < 0:
                decrease_stat(stats, stat_type, INACTIVE_SPLIT_BYTES, -net_change_inactive_split_size)
        # active and active_bytes (allocation and allocated_bytes plus pending frees) dropped with allocation and
        # allocated_bytes in free, or, for a free that waited on events, in _finish_free (DeviceStats.change_pending)
        decrease_stat(stats, stat_type, REQUESTED_BYTES, requested_size)

    def try_merge_blocks(self, dst: Block, src: Block | None, pool: BlockPool) -> int:
        """Combine previously split blocks: merge free ``src`` into its neighbour ``dst`` (``try_merge_blocks``).

        Returns the size in bytes of the subsumed block, or 0 on failure. ``dst`` survives (keeping its
        ``requested_size``); ``src`` leaves the pool.
        """
        if src is None or src.allocated or dst.mapped != src.mapped:  # a free waiting on events stays allocated
            return 0

        if dst.prev is src:  # [src dst]
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
            else:
                dst.segment.head = dst
        else:  # [dst src]
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        subsumed_size = src.size
        dst.size += subsumed_size
        if src.mapped:
            pool.erase(src)
        else:
            pool.erase_unmapped(src)
        return subsumed_size

    # ------------------------------------------------------------------ releasing cached memory

    def empty_cache(self) -> None:
        """Release every cached segment that is entirely free (``torch.cuda.empty_cache``).

        Waits for every pending cross-stream free first and counts one ``num_sync_all_streams``.
        Segments that still hold a live block stay, with their free holes (``inactive_split_bytes``);
        so do the segments of private pools that a graph or ``MemPool`` still holds. During a capture it
        releases only the pools no one holds.
        """
        self.release_cached_blocks()

    def release_cached_blocks(self, mempool_id: PoolId = DEFAULT_POOL) -> bool:
        """Release fully free segments (``release_cached_blocks``).

        For the default ``mempool_id`` (and no capture underway): wait for all events, then release the
        device's own pools, large first. Then, for each freeable private pool (use_count 0; only
        ``mempool_id``'s when one is given, after waiting for its events): release its small, then large
        blocks, and forget the pool once it holds no segment.
        """
        if mempool_id == DEFAULT_POOL and not self.captures_underway:
            self.synchronize_and_free_events()
            self.release_blocks(self.own_pools.in_order(False))
            self.release_blocks(self.own_pools.in_order(True))
        for pool_id, pp in list(self.graph_pools_freeable.items()):
            if mempool_id != DEFAULT_POOL:
                if pool_id != mempool_id:
                    continue
                self.synchronize_and_free_events(pp)
            self.release_blocks(pp.pools.in_order(True))
            self.release_blocks(pp.pools.in_order(False))
            if pp.cudaMalloc_count == 0:
                del self.graph_pools[pool_id]
                del self.graph_pools_freeable[pool_id]
                self._erase_pool(pp)
        return True

    def _erase_pool(self, pp: PrivatePool) -> None:
        """What deleting ``pp`` (``graph_pools.erase``) leaves: with expandable segments its ``cudaMalloc_count``
        counts ``alloc_block`` calls up and unmapped ranges down (``map_block`` of several pages is one call,
        ``unmap_block`` of each free range another), so it can reach 0 while blocks still lie in the pool.
        torch deletes the pool anyway; those blocks keep pointing into it, and what a free of one does is
        undefined (it inserts the block into the deleted pool). Their allocations move to ``_orphaned``, where
        :meth:`free` refuses them; a pending free of one is refused when its events complete."""
        pp.erased = True
        held = [seg for seg in self._segments.values() if seg.pool.owner is pp]
        if not held:
            return
        self._erased_pools[pp.id] = pp
        for seg in held:
            b = seg.head
            while b is not None:
                if b.allocated and self._active_blocks.get(b.ptr) is b:
                    self._orphaned[b.ptr] = self._active_blocks.pop(b.ptr)
                b = b.next

    def release_blocks(self, pools: list[BlockPool]) -> None:
        """Release the unsplit free blocks of one torch pool — ``pools``, its streams in ascending order —
        in (stream, size, address) order; then unmap free pages of expandable segments (``release_blocks``)."""
        to_unmap = []
        for pool in pools:
            by_key = pool.by_key
            keys = pool.keys
            # Smaller blocks can neither be a whole segment nor hold a whole page: skip them.
            smallest = SMALL_BUFFER if pool.is_small else min(self._large_segment_size, MIN_LARGE_ALLOC)
            for key in keys[bisect_left(keys, smallest << _SIZE_SHIFT):]:
                block = by_key[key]
                if block.segment.expandable:
                    to_unmap.append(block)
                elif block.prev is None and block.next is None:
                    self.release_block(block)
        for block in to_unmap:
            self.unmap_block(block)
            if block.prev is None and block.next is None:
                self.release_expandable_segment(block)

    def release_block(self, block: Block) -> None:
        """Give a whole free segment back to the driver (``release_block``, i.e. ``cudaFree``).

        Raises:
            TorchAllocatorError: ``block`` is part of a split segment. Only ``release_available_cached_blocks``
                passes one, after ``max_split_size`` was lowered at run time below a free block split off
                before (torch never checks ``is_split`` there): torch counts the ``cudaFree`` and records its
                ``segment_free``, then the CUDA runtime refuses a pointer that no ``cudaMalloc`` returned and
                ``C10_CUDA_CHECK`` raises; the block stays cached.
        """
        stats = self.stats
        stats.num_device_free += 1
        size = block.size
        ptr = block.ptr
        pool = block.segment.pool
        self.record_trace("segment_free", ptr, size, pool.stream)
        if block.prev is not None or block.next is not None:
            raise TorchAllocatorError(
                f"CUDA error: invalid argument (torch's release_available_cached_blocks called cudaFree on the "
                f"free {size:,} B block at {ptr:#x}, which is part of the {block.segment.size:,} B segment at "
                f"{block.segment.ptr:#x}: max_split_size was lowered at run time below the size of a block split "
                "off before, and torch releases any cached block at least max_split_size bytes large without "
                "checking that it is a whole segment; the block stays cached)")
        self._address_space.free(ptr)
        del self._segments[ptr]
        self.total_allocated_memory -= size
        if pool.owner is not None:
            pool.owner.cudaMalloc_count -= 1
        st = pool.stat_type
        decrease_stat(stats, st, SEGMENT, 1)
        decrease_stat(stats, st, RESERVED_BYTES, size)
        if size >= self._max_split_size:
            decrease_single(stats.agg, OVERSIZE_SEGMENTS, 1)
        pool.erase(block)

    def release_available_cached_blocks(self, p: _AllocParams) -> bool:
        """Release cached oversize segments to make room for ``p`` (``release_available_cached_blocks``).

        Does nothing (returns False) unless ``max_split_size`` is set. Frees the smallest single
        cached block of at least ``max(p.size, max_split_size)`` bytes, or else oversize blocks from
        the largest down until that many bytes were released.
        """
        max_split = self._max_split_size
        if max_split == SIZE_MAX:
            return False
        pool = p.pool
        keys = pool.keys
        by_key = pool.by_key
        key_size = max(p.size, max_split)
        i = bisect_left(keys, key_size << _SIZE_SHIFT)
        if i == len(keys) or by_key[keys[i]].segment.expandable:
            if i == 0:
                return False
            total_released = 0
            i -= 1
            while total_released < key_size:
                block = by_key[keys[i]]
                if block.size < max_split:
                    break
                if not block.segment.expandable:
                    total_released += block.size
                    self.release_block(block)
                if i == 0:
                    break
                i -= 1
            if total_released < key_size:
                return False
        else:
            self.release_block(by_key[keys[i]])
        return True

    def garbage_collect_cached_blocks(self) -> None:
        """Release old cached large segments once reserved memory passes the gc threshold.

        ``garbage_collect_cached_blocks``: runs only with a memory fraction and a
        ``garbage_collection_threshold``. Rounds release every unsplit, non-expandable free block
        of the large pool whose age (``get_free_block`` calls since it was freed) is at least the
        average age, until the reclaimed bytes reach ``total - threshold * allowed``.
        """
        gc_threshold = self._gc_threshold_bytes
        if self.total_allocated_memory <= gc_threshold:
            return
        target_size = self.total_allocated_memory - gc_threshold
        clock = self.large_blocks.get_free_blocks_call_count  # one clock for all streams (_tick_gc_clock)
        # the freeable blocks of the device's large pool, in pool order (stream, size, address): unsplit and
        # not expandable. Releasing one changes no other. Smaller blocks cannot be a whole large segment (see
        # release_blocks): skip them.
        smallest = min(self._large_segment_size, MIN_LARGE_ALLOC)
        candidates = []
        for pool in self.own_pools.in_order(False):
            keys = pool.keys
            candidates += [b for b in map(pool.by_key.__getitem__, keys[bisect_left(keys, smallest << _SIZE_SHIFT):])
                           if b.prev is None and b.next is None and not b.segment.expandable]
        if not candidates:
            return
        total_age = sum(clock - b.gc_count_base for b in candidates)
        gc_reclaimed = 0
        block_freed = True
        while gc_reclaimed < target_size and block_freed and candidates:
            age_threshold = total_age / len(candidates)
            block_freed = False
            kept = []
            for b in candidates:
                age = clock - b.gc_count_base
                if age >= age_threshold:
                    block_freed = True
                    gc_reclaimed += b.size
                    total_age -= age
                    self.release_block(b)
                else:
                    kept.append(b)
            candidates = kept

    def _tick_gc_clock(self, pool: BlockPool) -> None:
        """``++pool.get_free_blocks_call_count``: torch's counter belongs to the whole pool, all streams."""
        owner = pool.owner
        pools = (owner.pools if owner is not None else self.own_pools)
        for q in (pools.small if pool.is_small else pools.large).values():
            q.get_free_blocks_call_count += 1

    # ------------------------------------------------------------------ expandable segments (§9)

    def find_expandable_block(self, pool: BlockPool, size: int) -> Block | None:
        """Return the lowest free/unmapped run of at least ``size`` bytes, reserving a new
        expandable segment when none has room (``find_expandable_block``); None when the address space
        has no room for one (``cuMemAddressReserve`` fails)."""
        def allocatable(b: Block | None) -> bool:
            return b is not None and not b.allocated

        for _, c in pool.unmapped:
            if allocatable(c.prev):
                c = c.prev
            b, total = c, 0
            while total < size and allocatable(b):
                total += b.size
                b = b.next
            if total >= size:
                return c
        page = rules.page_size(pool.is_small, self.config)
        total = self.total_memory
        va_size = (total + total // 8 + page - 1) // page * page
        ptr = self._address_space.reserve(va_size)
        if ptr is None:
            return None
        segment = Segment(ptr, va_size, pool, expandable=True, page_size=page)
        self._segments[ptr] = segment
        candidate = Block(va_size, ptr, segment)
        candidate.mapped = False
        segment.head = candidate
        pool.insert_unmapped(candidate)
        return candidate

    def try_allocate_expandable_block(self, pool: BlockPool, size: int) -> Block | None:
        """Map pages so that a free block of ``size`` bytes exists (``try_allocate_expandable_block``)."""
        candidate = self.find_expandable_block(pool, size)
        if candidate is None:
            return None
        if not candidate.mapped and not self.map_block(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            # candidate is free and mapped, followed by an unmapped block
            nxt = candidate.next
            if not self.map_block(nxt, min(size - candidate.size, nxt.size)):
                return None
            candidate = nxt
        pool.erase(candidate)
        return candidate

    def map_block(self, to_map: Block, size: int) -> bool:
        """Map the pages covering ``size`` bytes at the start of unmapped ``to_map`` (``map_block``)."""
        segment = to_map.segment
        page = segment.page_size
        offset = to_map.ptr - segment.ptr
        mapped_size = -(-(offset + size) // page) * page - offset
        if mapped_size > self.device_free_bytes():
            return False  # cuMemCreate fails: no physical memory left
        pool = segment.pool
        map_ptr = to_map.ptr
        pool.erase_unmapped(to_map)
        to_map.mapped = True
        if mapped_size < to_map.size:
            remaining = Block(to_map.size - mapped_size, to_map.ptr + mapped_size, segment)
            remaining.mapped = False
            to_map.link_after(remaining)
            pool.insert_unmapped(remaining)
            to_map.size = mapped_size
        self.try_merge_blocks(to_map, to_map.prev, pool)
        self.try_merge_blocks(to_map, to_map.next, pool)
        pool.insert_into_blocks(to_map)
        self.total_allocated_memory += mapped_size
        stats = self.stats
        increase_stat(stats, pool.stat_type, RESERVED_BYTES, mapped_size)
        stats.num_device_alloc += 1
        self.record_trace("segment_map", map_ptr, mapped_size, pool.stream)
        return True

    def unmap_block(self, block: Block) -> None:
        """Unmap every page lying entirely inside free ``block`` (``unmap_block``)."""
        segment = block.segment
        page = segment.page_size
        base = segment.ptr
        begin = base + -(-(block.ptr - base) // page) * page
        end = base + (block.ptr + block.size - base) // page * page
        if begin >= end:
            return
        pool = segment.pool
        pool.erase(block)
        unmapped_size = end - begin
        before_size = begin - block.ptr
        if before_size > 0:
            before = Block(before_size, block.ptr, segment)
            block.link_before(before)
            pool.insert_into_blocks(before)
        after_size = block.size - before_size - unmapped_size
        if after_size > 0:
            after = Block(after_size, end, segment)
            block.link_after(after)
            pool.insert_into_blocks(after)
        block.ptr = begin
        block.size = unmapped_size
        block.mapped = False
        self.try_merge_blocks(block, block.prev, pool)
        self.try_merge_blocks(block, block.next, pool)
        pool.insert_unmapped(block)
        self.total_allocated_memory -= unmapped_size
        stats = self.stats
        decrease_stat(stats, pool.stat_type, RESERVED_BYTES, unmapped_size)
        if pool.owner is not None:
            if pool.owner.cudaMalloc_count <= 0:
                raise TorchAllocatorError(
                    f"INTERNAL ASSERT FAILED: block->pool->owner_PrivatePool->cudaMalloc_count > 0 (torch's "
                    f"unmap_block, unmapping {unmapped_size:,} B at {begin:#x} of private pool {pool.owner.id}): "
                    "with expandable segments the count goes up once per alloc_block, however many pages it "
                    "maps, and down once per unmapped range, so a pool's pages mapped in one call and freed in "
                    "two ranges run it out; torch stops here (inside a MemPool's deletion, the process aborts), "
                    "with this range unmapped and the pool's other free ranges still mapped")
            pool.owner.cudaMalloc_count -= 1
        stats.num_device_free += 1
        self.record_trace("segment_unmap", begin, unmapped_size, pool.stream)

    def release_expandable_segment(self, block: Block) -> None:
        """Drop an expandable segment whose pages are all unmapped (``release_expandable_segment``)."""
        segment = block.segment
        segment.pool.erase_unmapped(block)
        del self._segments[segment.ptr]
        self._address_space.unreserve(segment.ptr)

    # ------------------------------------------------------------------ OOM

    def _raise_oom(self, p: _AllocParams, orig_size: int) -> None:
        stats = self.stats
        device_free = self.device_free_bytes()
        self.record_trace("oom", device_free, p.size, p.pool.stream)
        stats.num_ooms += 1
        allocated = self.memory_allocated()
        reserved = self.memory_reserved()
        # free cached bytes of private pools: the message counts them as allocated
        private = sum(pool.by_key[k].size for pp in self.graph_pools.values() for pool in pp.pools.all()
                      for k in pool.keys)
        limit = self.allowed_memory_bytes if self._set_fraction and self.allowed_memory_bytes is not None \
            else self.total_memory
        for observer in list(self._oom_observers):
            observer(0, p.alloc_size, limit, device_free)
        message = _oom_message(p.alloc_size, self.device_name, self.total_memory, device_free, self.context_bytes,
                               self.allowed_memory_bytes, allocated, reserved, private)
        raise OutOfMemoryError(message, requested_bytes=orig_size, alloc_size_bytes=p.alloc_size,
                               allocated_bytes=allocated, reserved_bytes=reserved,
                               device_free_bytes=device_free)

    # ------------------------------------------------------------------ reading the state (public)

    def iter_segments(self) -> Iterator[Segment]:
        """Yield the live segments in address order (each a :class:`~memviz.sim.blocks.Segment`).

        Walk a segment's blocks from ``segment.head`` along ``block.next``. Read-only: changing a
        segment or block corrupts the allocator.
        """
        segments = self._segments
        for base in sorted(segments):
            yield segments[base]

    def live_block(self, ptr: int) -> Block | None:
        """Return the allocated block at address ``ptr``, or None (read-only)."""
        return self._active_blocks.get(ptr) or self._orphaned.get(ptr)

    def live_count(self) -> int:
        """Return the number of live allocations (``allocation.all.current``)."""
        return len(self._active_blocks) + len(self._orphaned)

    def pending_blocks(self) -> list[Block]:
        """Return the blocks freed but waiting on other streams' events ("active_pending_free"), read-only."""
        return list(self._pending_free.values())

    def block_pools(self) -> Iterator[BlockPool]:
        """Yield every free-block pool: the device's own, then each private pool's (read-only)."""
        yield from self.own_pools.all()
        for pp in self.graph_pools.values():
            yield from pp.pools.all()
        for pp in self._erased_pools.values():  # deleted by torch with blocks still in them (_erase_pool)
            yield from pp.pools.all()

    # ------------------------------------------------------------------ private pools (CUDA graphs, MemPool)

    def create_or_incref_pool(self, mempool_id: PoolId) -> PrivatePool:
        """Make the private pool ``mempool_id`` (use_count 1) or add one user to it (``create_or_incref_pool``)."""
        pool_id = _checked_pool_id(mempool_id)
        pp = self.graph_pools.get(pool_id)
        if pp is None:
            pp = self.graph_pools[pool_id] = PrivatePool(pool_id)
        else:
            if pp.use_count == 0:
                raise InputError(f"pool {pool_id} was released by every user; it can no longer be shared")
            pp.use_count += 1
        return pp

    def begin_allocate_to_pool(self, mempool_id: PoolId, accepts: Callable[[int], bool] | None = None) -> None:
        """Divert the allocations of the streams ``accepts`` takes (None: every stream, as
        ``use_mem_pool`` does for its thread) into private pool ``mempool_id`` (``beginAllocateToPool``,
        called by ``CUDAGraph.capture_begin`` and ``use_mem_pool``). Makes the pool or adds a user to it.

        Raises:
            InputError: allocations already go to that pool.
        """
        pool_id = _checked_pool_id(mempool_id)
        if any(pid == pool_id for pid, _ in self.captures_underway):
            raise InputError(f"beginAllocateToPool: already recording to mempool_id {pool_id}")
        self.create_or_incref_pool(pool_id)
        self.captures_underway.append((pool_id, accepts if accepts is not None else _every_stream))
        self._diverting = True

    def end_allocate_to_pool(self, mempool_id: PoolId) -> None:
        """Stop diverting allocations into ``mempool_id`` (``endAllocateToPool``).

        Raises:
            InputError: no capture or ``use_mem_pool`` is recording to it.
        """
        pool_id = _checked_pool_id(mempool_id)
        for i, (pid, _) in enumerate(self.captures_underway):
            if pid == pool_id:
                del self.captures_underway[i]
                self._update_diverting()
                return
        raise InputError(f"endAllocatePool: not currently recording to mempool_id {pool_id}")

    def release_pool(self, mempool_id: PoolId) -> None:
        """Drop one user of private pool ``mempool_id`` (``releasePool``: a graph reset or deleted, a ``MemPool``
        deleted, a ``use_mem_pool`` left). At 0 users ``empty_cache`` may release its free segments.

        Raises:
            InputError: no such pool, or it has no user left.
        """
        pool_id = _checked_pool_id(mempool_id)
        pp = self.graph_pools.get(pool_id)
        if pp is None or pp.use_count == 0:
            raise InputError(f"releasePool: pool {pool_id} is not in use")
        pp.use_count -= 1
        if pp.use_count == 0:
            self.graph_pools_freeable[pool_id] = pp

    def empty_pool_cache(self, mempool_id: PoolId) -> None:
        """``emptyCache(mempool_id)`` (what deleting a ``MemPool`` runs after ``releasePool``): wait for the
        pool's events, release its free segments if no one holds it any more."""
        self.release_cached_blocks(_checked_pool_id(mempool_id))

    def trace_length(self) -> int:
        """How many entries the recorded history holds (:meth:`trace_records`)."""
        return len(self._trace) // 4

    def trace_entries(self) -> Iterator[tuple[str, int, int, int | None]]:
        """Yield the recorded history as ``(action, addr, size, time_us)``, oldest first.

        One ``"free"`` entry stands for torch's ``free_requested`` + ``free_completed`` pair (a free that
        waited on events has the two apart); an ``"oom"`` entry's ``addr`` is the device's free bytes.
        ``time_us`` is None without a ``clock``. Empty when the allocator was made with ``record_history=False``.
        """
        for action, addr, size, _, time_us in self.trace_records():
            yield action, addr, size, time_us

    def trace_records(self, start: int = 0) -> Iterator[tuple[str, int, int, int, int | None]]:
        """Yield the recorded history as ``(action, addr, size, stream, time_us)`` (:meth:`trace_entries` with
        each entry's stream), from entry ``start`` on (default: 0, all)."""
        flat = self._trace  # action, addr, size, stream of each entry in turn
        times = self._trace_times
        for k in range(4 * start, len(flat), 4):
            yield flat[k], flat[k + 1], flat[k + 2], flat[k + 3], None if times is None else times[k // 4]

    def snapshot(self, *, record: bool = True) -> dict[str, Any]:
        """Return a dict shaped like ``torch.cuda.memory._snapshot()``.

        Keys: ``segments`` (sorted by address; one per contiguous mapped range of an expandable
        segment; each with its ``stream`` and ``segment_pool_id``), ``device_traces`` (one list of trace
        entries for the one device), ``allocator_settings`` and ``external_annotations``. As torch does, the
        trace is collected first and then a ``snapshot`` entry (size: the active bytes) is recorded, so it
        shows in the next snapshot; ``record=False`` records none (exporting a state without changing its
        history).
        """
        out = build_snapshot(self.iter_segments(), self.trace_records(), self.config, self._pending_free)
        if record:
            self.record_trace("snapshot", 0, sum(seg["active_size"] for seg in out["segments"]))
        return out

    def segments(self) -> list[dict[str, Any]]:
        """Return ``snapshot()["segments"]`` alone: no trace entries are built and none is recorded.

        What a live view reads on every redraw: ``snapshot()`` turns the whole trace into dicts, which grows
        with every event since the start.
        """
        return build_segments(self.iter_segments(), self._pending_free)

    def memory_summary(self, abbreviated: bool = False) -> str:
        """Return the ``torch.cuda.memory_summary()`` table for this allocator's stats."""
        return memory_summary(self.memory_stats(), abbreviated=abbreviated, device_name=self.device_name)

    def _check(self) -> None:
        """Verify every internal invariant (:func:`memviz.sim.invariants.check_invariants`); print the
        segment table and re-raise on failure."""
        try:
            check_invariants(self)
        except AssertionError:
            print(format_segment_table(self))
            raise


def _oom_message(alloc_size: int, device_name: str, total_memory: int, device_free: int, context_bytes: int,
                 allowed: int | None, allocated: int, reserved: int, private: int = 0) -> str:
    """Return torch 2.11's OOM text (``DeviceCachingAllocator::malloc``); all sizes in bytes. ``private``:
    free bytes cached in private pools (shown as allocated "in private pools")."""
    proc_info = ""
    if context_bytes:
        proc_info = ("Including non-PyTorch memory, this process has "
                     f"{format_size(context_bytes + reserved)} memory in use. ")
    allowed_info = f"{format_size(allowed)} allowed; " if allowed is not None else ""
    private_info = f"with {format_size(private)} allocated in private pools (e.g., CUDA Graphs), " if private else ""
    return (
        f"CUDA out of memory. Tried to allocate {format_size(alloc_size)}. {device_name} has a "
        f"total capacity of {format_size(total_memory)} of which {format_size(device_free)} is "
        f"free. {proc_info}{allowed_info}Of the allocated memory {format_size(allocated + private)} is allocated "
        f"by PyTorch, {private_info}and {format_size(reserved - allocated - private)} is reserved by PyTorch but "
        "unallocated. "
        "If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
        "for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html"
        "#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)")

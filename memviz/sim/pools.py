"""Pools by (owner, stream): the device's own pools and the private pools of CUDA graphs and ``MemPool``.

CUDACachingAllocator.cpp keeps, per device, ``large_blocks`` / ``small_blocks`` and, per private pool
(``graph_pools``: a CUDA graph's pool or a ``torch.cuda.MemPool``), a ``PrivatePool`` with its own
pair. Every ``BlockPool`` holds blocks of every stream, ordered by (stream, size, address), and every
search stops at the first block of another stream; here each (owner, stream) has its own
:class:`~memviz.sim.blocks.BlockPool` pair, which is the same search. Walks over a whole torch pool
(``release_blocks``, garbage collection) visit the streams in ascending order, as torch's ordered set does.

A pool id is torch's ``MempoolId_t``, a pair of ints: ``(0, 0)`` the device's own pools; ``(n, 0)`` a
CUDA graph's pool (``graph_pool_handle()``), ``(0, n)`` a user-created ``MemPool``.
"""

from __future__ import annotations

from .blocks import BlockPool
from .stats import LARGE_POOL, SMALL_POOL

__all__ = ["DEFAULT_POOL", "PoolId", "PrivatePool", "StreamPools"]

PoolId = tuple[int, int]
DEFAULT_POOL: PoolId = (0, 0)


class StreamPools:
    """The small and large :class:`BlockPool` of every stream that used one owner's pools.

    ``small[stream]`` / ``large[stream]``; ``owner`` is the :class:`PrivatePool` (None: the device's own).
    """

    __slots__ = ("large", "owner", "small")

    def __init__(self, owner: PrivatePool | None) -> None:
        self.owner = owner
        self.small: dict[int, BlockPool] = {}
        self.large: dict[int, BlockPool] = {}

    def get(self, small: bool, stream: int) -> BlockPool:
        """Return the small or large pool of ``stream``, making it on first use."""
        pools = self.small if small else self.large
        pool = pools.get(stream)
        if pool is None:
            clock = next(iter(pools.values())).get_free_blocks_call_count if pools else 0
            pool = pools[stream] = BlockPool(small, SMALL_POOL if small else LARGE_POOL, stream, self.owner)
            pool.get_free_blocks_call_count = clock  # torch's pool has one gc clock for all its streams
        return pool

    def in_order(self, small: bool) -> list[BlockPool]:
        """Return the small or large pools, by ascending stream (torch's (stream, size, ptr) order)."""
        pools = self.small if small else self.large
        return [pools[s] for s in sorted(pools)]

    def all(self) -> list[BlockPool]:
        """Every pool: large ones first, each kind by stream."""
        return self.in_order(False) + self.in_order(True)


class PrivatePool:
    """A CUDA graph's or a ``MemPool``'s private pool (``PrivatePool``).

    Attributes:
        id: the pool id (``MempoolId_t``).
        use_count: graphs, ``MemPool`` objects and ``use_mem_pool`` contexts holding it; at 0 the pool is
            freeable: ``empty_cache`` may then release its free segments (``graph_pools_freeable``).
        cudaMalloc_count: its segments still held from the driver; a freeable pool at 0 is deleted.
        pools: its blocks by stream (:class:`StreamPools`).
        erased: torch deleted it (``graph_pools.erase``); blocks may still point to it (see
            ``CachingAllocator._erase_pool``).
    """

    __slots__ = ("cudaMalloc_count", "erased", "id", "pools", "use_count")

    def __init__(self, pool_id: PoolId) -> None:
        self.id = pool_id
        self.use_count = 1
        self.cudaMalloc_count = 0
        self.erased = False
        self.pools = StreamPools(self)

    def __repr__(self) -> str:
        return f"PrivatePool(id={self.id}, use_count={self.use_count}, cudaMalloc_count={self.cudaMalloc_count})"

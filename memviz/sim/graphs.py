"""CUDA graphs and ``MemPool`` on a simulated allocator, named and shaped like torch's.

torch's Python objects drive four allocator calls — ``beginAllocateToPool``, ``endAllocateToPool``,
``releasePool`` and ``emptyCache(mempool_id)`` — and these wrappers make the same calls on a
:class:`~memviz.sim.CachingAllocator` (see ``CUDAGraph::capture_begin`` / ``capture_end`` / ``reset`` and
``MemPool`` in torch/csrc/cuda)::

    >>> from memviz.sim import CachingAllocator, CUDAGraph, MemPool, graph, use_mem_pool
    >>> a = CachingAllocator(80 << 30)
    >>> g = CUDAGraph(a)
    >>> with graph(a, g):                       # torch.cuda.graph(g): empty_cache, capture on a side stream
    ...     out = a.malloc(8 << 20, stream=g.capture_stream)
    >>> a.empty_cache(); a.memory_reserved() >> 20     # the graph holds its pool, the generator 2 MiB
    22
    >>> pool = MemPool(a)
    >>> with use_mem_pool(a, pool):
    ...     x = a.malloc(1 << 20)
    >>> sorted(seg["segment_pool_id"] for seg in a.segments())   # the device's own: the generator's
    [(0, 0), (0, 1), (1, 0)]

Pool ids follow torch: ``MemPool()`` and ``graph_pool_handle()`` give ``(0, n)`` from one counter, a
capture without ``pool=`` makes ``(n, 0)`` from another, each starting at 1 per allocator. Every capture
registers the default CUDA generator (:func:`default_generator`), whose two 8-byte tensors live while any
graph does (the 2 MiB segment left above, on the capture stream). That is torch 2.11's rule (the H200's
recordings show it), from pytorch#114068's ``CUDAGeneratorState::register_graph`` up to torch 2.13; torch 2.14
registers a generator lazily, at its first random op inside a capture, with its state on the default stream
(pytorch#176753): :func:`registers_generator_at_capture` tells them apart by version.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from memviz.errors import InputError

from .pools import PoolId

if TYPE_CHECKING:
    from .allocator import CachingAllocator

__all__ = ["DEFAULT_CAPTURE_STREAM", "GENERATOR_TENSOR_BYTES", "LAZY_GENERATOR_VERSION", "CUDAGeneratorState",
           "CUDAGraph", "MemPool", "default_generator", "graph", "graph_pool_handle", "registers_generator_at_capture",
           "torch_version_tuple", "use_mem_pool"]

DEFAULT_CAPTURE_STREAM = 7  # the side stream torch.cuda.graph captures on unless told (any id the program leaves free)

GENERATOR_TENSOR_BYTES = 8
"""Bytes of each of ``CUDAGeneratorState``'s ``seed_extragraph_`` and ``offset_extragraph_``
(``at::empty({1}, kLong)``)."""

LAZY_GENERATOR_VERSION = (2, 14)
"""The first torch version whose ``CUDAGraph::capture_begin`` no longer registers the default generator: from
torch 2.14 a generator registers with a graph at its first random op inside the capture and keeps its state on
the default stream (pytorch#176753, "Deprecate ``CUDAGraph.register_generator_state()``" in the 2.14 notes)."""


def torch_version_tuple(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string (``"2.11.0+cu130"`` → ``(2, 11)``).

    Raises:
        InputError: not a version torch prints.
    """
    parts = str(version).split("+")[0].split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or "x")
    except (ValueError, IndexError):
        raise InputError(f"torch_version {version!r} is not a torch version such as '2.11.0+cu130'") from None


def registers_generator_at_capture(torch_version: str | None) -> bool:
    """Whether ``capture_begin`` of this torch version registers the default CUDA generator with the graph, whose
    first registration allocates its seed and offset (:data:`GENERATOR_TENSOR_BYTES` each) on the capture stream
    in the device's own pool: up to torch 2.13 (:data:`LAZY_GENERATOR_VERSION`). None (a recording that does not
    say) is taken as such a version: torch 2.11's rule, the one this simulator was checked against.

    (Before pytorch#114068, torch 2.3 or so, every capture made its own two tensors, held by its graph: not
    modelled.)
    """
    return torch_version is None or torch_version_tuple(torch_version) < LAZY_GENERATOR_VERSION


class CUDAGeneratorState:
    """A CUDA generator's graph-safe state (``CUDAGeneratorState``, ATen/cuda/CUDAGeneratorImpl.cpp), as the
    allocator sees it: registering the first graph makes its seed and offset tensors (one int64 each) on the
    stream current then, the capture stream, before the capture's pool takes over (so in the device's own
    pool); unregistering the last graph frees them."""

    def __init__(self, allocator: CachingAllocator) -> None:
        self._allocator = allocator
        self._graphs: set[CUDAGraph] = set()
        self._tensor_addresses: tuple[int, ...] = ()

    def register_graph(self, graph: CUDAGraph, stream: int) -> None:
        """``register_graph``: the first graph registered allocates the seed and offset tensors on ``stream``."""
        if not self._graphs:
            self._tensor_addresses = tuple(self._allocator.malloc(GENERATOR_TENSOR_BYTES, stream)
                                           for _ in ("seed", "offset"))
        self._graphs.add(graph)

    def unregister_graph(self, graph: CUDAGraph) -> None:
        """``unregister_graph``: the last graph unregistered frees them. A graph not registered does nothing."""
        if graph not in self._graphs:
            return
        self._graphs.discard(graph)
        if not self._graphs:
            for address in self._tensor_addresses:
                self._allocator.free(address)
            self._tensor_addresses = ()


_default_generators: weakref.WeakKeyDictionary[CachingAllocator, CUDAGeneratorState] = weakref.WeakKeyDictionary()


def default_generator(allocator: CachingAllocator) -> CUDAGeneratorState:
    """The default CUDA generator of ``allocator``'s device (``getDefaultCUDAGenerator()``: one per device),
    made on first use."""
    state = _default_generators.get(allocator)
    if state is None:
        state = _default_generators[allocator] = CUDAGeneratorState(allocator)
    return state


def graph_pool_handle(allocator: CachingAllocator) -> PoolId:
    """Return a new pool id for graphs to share, ``(0, n)`` (``torch.cuda.graph_pool_handle()``; the same counter
    as ``MemPool()``); the pool itself is made by the first capture into it."""
    allocator.pool_uid += 1
    return (0, allocator.pool_uid)


class MemPool:
    """``torch.cuda.MemPool()``: a private pool a program allocates into with :func:`use_mem_pool`.

    Made with one user (itself). :meth:`release` is what deleting the torch object does: ``releasePool``,
    then ``emptyCache(id)``, which frees the pool's free segments once nothing else holds it.
    """

    def __init__(self, allocator: CachingAllocator) -> None:
        self._allocator = allocator
        allocator.pool_uid += 1
        self.id: PoolId = (0, allocator.pool_uid)
        allocator.create_or_incref_pool(self.id)
        self._released = False

    def use_count(self) -> int:
        """Users of the pool: this object, plus every ``use_mem_pool`` context and graph using it."""
        pp = self._allocator.graph_pools.get(self.id)
        return pp.use_count if pp is not None else 0

    def snapshot(self) -> list[dict]:
        """The pool's segments, as ``snapshot()["segments"]`` shows them (``MemPool.snapshot()``, i.e.
        ``torch.cuda.memory_snapshot(mempool_id=pool.id)``)."""
        return [seg for seg in self._allocator.segments() if tuple(seg["segment_pool_id"]) == self.id]

    def release(self) -> None:
        """Drop this object's hold (``~MemPool``: ``releasePool`` then ``emptyCache(id)``); once only.

        Raises:
            InputError: called twice.
        """
        if self._released:
            raise InputError(f"MemPool {self.id} was already released")
        self._released = True
        self._allocator.release_pool(self.id)
        self._allocator.empty_pool_cache(self.id)


@contextmanager
def use_mem_pool(allocator: CachingAllocator, pool: MemPool) -> Iterator[None]:
    """``torch.cuda.use_mem_pool(pool)``: every allocation inside goes to ``pool`` (any stream: torch routes by
    thread). On exit, ``endAllocateToPool`` and ``releasePool`` (the context's own hold)."""
    if not isinstance(pool, MemPool):
        raise InputError(f"use_mem_pool takes a memviz.sim.MemPool, not {type(pool).__name__}")
    allocator.begin_allocate_to_pool(pool.id)
    try:
        yield
    finally:
        allocator.end_allocate_to_pool(pool.id)
        allocator.release_pool(pool.id)


class CUDAGraph:
    """``torch.cuda.CUDAGraph``: what a capture does to the allocator.

    During the capture, allocations made on the capture stream go to the graph's private pool; the pool
    outlives the capture, held by the graph until :meth:`reset`. Capturing registers the graph with the
    device's default generator (:func:`default_generator`), which :meth:`delete` unregisters. Replays
    allocate nothing.
    """

    def __init__(self, allocator: CachingAllocator) -> None:
        self._allocator = allocator
        self._pool: PoolId | None = None
        self.capture_stream = DEFAULT_CAPTURE_STREAM
        self._capturing = False

    def capture_begin(self, pool: PoolId | None = None, stream: int = DEFAULT_CAPTURE_STREAM) -> None:
        """Start capturing on ``stream`` into ``pool`` (another graph's ``pool()`` or a ``graph_pool_handle``;
        None: a new pool): register the default generator (``gen->register_graph(this)``), then
        ``beginAllocateToPool``. Raises InputError if this graph was captured already."""
        if self._pool is not None:
            raise InputError("this CUDAGraph was captured already; reset() it first")
        default_generator(self._allocator).register_graph(self, stream)
        if pool is None:
            self._allocator.capture_uuid += 1
            pool_id: PoolId = (self._allocator.capture_uuid, 0)
        else:
            pool_id = pool
        self._allocator.begin_allocate_to_pool(pool_id, lambda s, capture=stream: s == capture)
        self._pool = pool_id
        self.capture_stream = stream
        self._capturing = True

    def capture_end(self) -> None:
        """End the capture (``endAllocateToPool``). Raises InputError when not capturing."""
        if not self._capturing:
            raise InputError("capture_end() without capture_begin()")
        self._allocator.end_allocate_to_pool(self._pool)
        self._capturing = False

    def pool(self) -> PoolId:
        """The id of the graph's pool, to share it with the next capture (``graph.pool()``). As torch's
        ``CUDAGraph::pool()``, refused (InputError) until the capture has ended."""
        if self._pool is None:
            raise InputError("pool() of a graph that was never captured")
        if self._capturing:
            raise InputError("Called CUDAGraph::pool() without a preceding successful capture.")
        return self._pool

    def replay(self) -> None:
        """Run the graph: the allocator sees nothing."""

    def reset(self) -> None:
        """Delete the graph's executable (``CUDAGraph::reset``, also run when the graph is deleted): release
        its hold on the pool. A graph never captured, or reset already, does nothing."""
        if self._pool is None:
            return
        if self._capturing:
            self.capture_end()
        self._allocator.release_pool(self._pool)
        self._pool = None

    def delete(self) -> None:
        """What deleting the graph does (``~CUDAGraph``): unregister it from the default generator (the last graph
        frees the generator's two tensors), then :meth:`reset`."""
        default_generator(self._allocator).unregister_graph(self)
        self.reset()


@contextmanager
def graph(allocator: CachingAllocator, cuda_graph: CUDAGraph, pool: PoolId | None = None,
          stream: int = DEFAULT_CAPTURE_STREAM) -> Iterator[CUDAGraph]:
    """``torch.cuda.graph(cuda_graph, pool=None, stream=None)``: synchronize, ``empty_cache()``, then capture on
    ``stream`` until the block ends."""
    allocator.synchronize()
    allocator.empty_cache()
    cuda_graph.capture_begin(pool, stream)
    try:
        yield cuda_graph
    finally:
        cuda_graph.capture_end()

"""The simulator as a backend: memviz.sim's allocator behind the same interface as a real GPU."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager

from memviz.backends.base import Backend, check_alloc_conf, fraction_and_cap
from memviz.devices import PRESETS, SimulatedDevice, simulated_device
from memviz.errors import InputError
from memviz.shapes import Request
from memviz.sim import CachingAllocator, CUDAGraph, MemPool, OutOfMemoryError, use_mem_pool
from memviz.sim.limits import MAX_DEVICE_BYTES
from memviz.units import format_bytes

__all__ = ["SimTensor", "SimulatedBackend"]



class SimTensor:
    """A tensor that lives in the simulator: its block is freed when the last reference goes.

    Python's reference counting and ``gc`` decide when, exactly as for a ``torch.Tensor``, so cycles,
    tracebacks and stray references keep simulated memory alive the way they keep GPU memory alive.
    """

    __slots__ = ("__weakref__", "_address", "_allocator", "dtype", "nbytes", "shape")

    def __init__(self, allocator: CachingAllocator, address: int, request: Request) -> None:
        self._allocator = allocator
        self._address = address
        self.nbytes = request.nbytes
        self.shape = request.shape
        self.dtype = request.dtype

    def data_ptr(self) -> int:
        """The block's simulated device address."""
        return self._address

    def record_stream(self, stream: int) -> None:
        """``Tensor.record_stream``: the block's free waits for the work queued on ``stream`` so far."""
        self._allocator.record_stream(self._address, stream)

    def __del__(self) -> None:
        allocator, self._allocator = self._allocator, None
        if allocator is not None:
            allocator.free(self._address)

    def __repr__(self) -> str:
        return f"SimTensor(shape={self.shape}, dtype={self.dtype}, nbytes={self.nbytes}, ptr={self._address:#x})"


class SimulatedBackend(Backend):
    """memviz.sim on a simulated device.

    Args:
        device: a preset name (``"T4"``, ``"A100-80GB"``, ...; see :data:`memviz.devices.PRESETS`),
            a size (``"24 GiB"`` or bytes) or a :class:`~memviz.devices.SimulatedDevice` (whose ``index`` says
            which GPU of the simulated node it is: ``cuda:0`` for a preset or a size). Default ``"T4"``.
        cap_bytes: cap the cache like ``set_per_process_memory_fraction(cap_bytes / total)``; None: no cap.
        alloc_conf: allocator settings in ``PYTORCH_CUDA_ALLOC_CONF`` syntax; ``""`` for the defaults.
    """

    kind = "sim"
    oom_errors = (OutOfMemoryError,)

    def __init__(
        self, device: str | int | SimulatedDevice = "T4", cap_bytes: int | None = None, alloc_conf: str = ""
    ) -> None:
        alloc_conf = check_alloc_conf(alloc_conf) or ""
        self.device = simulated_device(device)
        if self.device.total_memory_bytes > MAX_DEVICE_BYTES:
            raise InputError(f"device={device!r} has {format_bytes(self.device.total_memory_bytes)}; the simulator "
                             f"models devices of up to {format_bytes(MAX_DEVICE_BYTES)}: pick a preset "
                             f"({', '.join(PRESETS)}) or a smaller size")
        self.device_name = self.device.name
        self.total_memory_bytes = self.device.total_memory_bytes
        fraction, self._cap_bytes = fraction_and_cap(cap_bytes, self.total_memory_bytes)
        self.index = self.device.index
        self.allocator = CachingAllocator(self.total_memory_bytes, memory_fraction=fraction, alloc_conf=alloc_conf,
                                          device_name=f"GPU {self.index}")
        self._alloc_conf = alloc_conf
        self.torch_version = ".".join(map(str, self.allocator.torch_version))
        self._stream = 0  # the current stream: 0, or the one on_stream / a capture made current
        self._last_stream = 0
        self._busy_until: dict[int, float] = {}  # stream -> time.monotonic() its queued work ends
        self._capture_stream: int | None = None  # torch's one default capture stream, made on first capture
        self._capture: tuple[CUDAGraph, int] | None = None  # the graph being captured, the stream before it
        self._pools: dict[tuple[int, int], MemPool] = {}  # new_pool's pools by id

    def empty(self, request: Request) -> SimTensor:
        if self.allocator.cuda_events:
            self._settle()
        return SimTensor(self.allocator, self.allocator.malloc(request.nbytes, self._stream), request)

    def empty_cache(self) -> None:
        self.allocator.empty_cache()

    # -- streams: a stream is done with its work unless queue_work keeps it busy (as on a GPU, where an idle
    # stream's event completes at once); the allocator finishes those frees at its next malloc, as torch does

    def _settle(self) -> None:
        """Mark the events of every stream whose queued work has ended as complete."""
        now = time.monotonic()
        for stream in list(self.allocator.cuda_events):
            if self._busy_until.get(stream, 0.0) <= now:
                self.allocator.synchronize(stream)

    def default_stream(self) -> int:
        return 0

    def new_stream(self) -> int:
        self._last_stream += 1
        return self._last_stream

    def stream_id(self, stream: int) -> int:
        return stream

    @contextmanager
    def on_stream(self, stream: int) -> Iterator[None]:
        before, self._stream = self._stream, stream
        try:
            yield
        finally:
            self._stream = before

    def record_stream(self, tensor: SimTensor, stream: int) -> None:
        tensor.record_stream(stream)

    def queue_work(self, stream: int, seconds: float) -> None:
        self._busy_until[stream] = max(self._busy_until.get(stream, 0.0), time.monotonic() + seconds)

    def synchronize(self, stream: int | None = None) -> None:
        if stream is None:
            self._busy_until.clear()
        else:
            self._busy_until.pop(stream, None)
        self.allocator.synchronize(stream)

    # -- private pools and CUDA graphs (memviz.sim.graphs, shaped like torch's objects)

    def new_pool(self) -> tuple[int, int]:
        pool = MemPool(self.allocator)
        self._pools[pool.id] = pool
        return pool.id

    def pool_id(self, pool: tuple[int, int]) -> tuple[int, int]:
        return pool

    def in_pool(self, pool: tuple[int, int]) -> AbstractContextManager[None]:
        return use_mem_pool(self.allocator, self._pools[pool])

    def release_pool(self, pool: tuple[int, int]) -> None:
        self._pools.pop(pool).release()

    def begin_capture(self, pool_id: tuple[int, int] | None) -> CUDAGraph:
        """What entering ``torch.cuda.graph(g, pool=pool_id)`` does: synchronize, ``empty_cache()``, make the
        capture stream current, then ``CUDAGraph::capture_begin`` (:meth:`memviz.sim.CUDAGraph.capture_begin`:
        it registers the default CUDA generator, then ``beginAllocateToPool``)."""
        if self._capture is not None:
            raise InputError("a capture is already underway; end it first")
        if self._capture_stream is None:
            self._capture_stream = self.new_stream()
        self.allocator.synchronize()
        self._busy_until.clear()
        self.allocator.empty_cache()
        g = CUDAGraph(self.allocator)
        try:
            g.capture_begin(pool_id, self._capture_stream)
        except BaseException:
            self.delete_graph(g)  # as ~CUDAGraph after a failed capture_begin
            raise
        self._capture = (g, self._stream)
        self._stream = self._capture_stream
        return g

    def end_capture(self, graph: CUDAGraph) -> None:
        if self._capture is None or self._capture[0] is not graph:
            raise InputError("end_capture() of a graph that is not being captured")
        _, self._stream = self._capture
        self._capture = None
        graph.capture_end()

    def capture_stream(self, graph: CUDAGraph) -> int:
        return graph.capture_stream

    def graph_pool_id(self, graph: CUDAGraph) -> tuple[int, int]:
        return graph.pool()

    def replay_graph(self, graph: CUDAGraph) -> None:
        graph.replay()

    def delete_graph(self, graph: CUDAGraph) -> None:
        """``del g``: ``~CUDAGraph`` (:meth:`memviz.sim.CUDAGraph.delete`)."""
        graph.delete()

    def memory_stats(self) -> Mapping[str, int]:
        return self.allocator.memory_stats()

    def snapshot(self) -> dict:
        """``_snapshot()`` as torch gives it for a process that used only this device: its segments carry
        ``"device": index`` and ``device_traces[index]`` holds the trace (the lists before it are empty)."""
        snap = self.allocator.snapshot()
        if self.index:
            for segment in snap["segments"]:
                segment["device"] = self.index
            snap["device_traces"] = [[] for _ in range(self.index)] + snap["device_traces"]
        return snap

    def segments(self) -> list[dict]:
        segments = self.allocator.segments()
        if self.index:
            for segment in segments:
                segment["device"] = self.index
        return segments

    def reset_peak_memory_stats(self) -> None:
        self.allocator.reset_peak_memory_stats()

    def reset_accumulated_memory_stats(self) -> None:
        self.allocator.reset_accumulated_memory_stats()

    def set_cap(self, cap_bytes: int | None) -> None:
        fraction, cap_in_force = fraction_and_cap(cap_bytes, self.total_memory_bytes)
        self.allocator.set_memory_fraction(1.0 if fraction is None else fraction)
        self._cap_bytes = cap_in_force

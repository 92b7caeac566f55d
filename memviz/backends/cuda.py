"""The real GPU as a backend: PyTorch's CUDA caching allocator, read through ``torch.cuda``."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from contextlib import AbstractContextManager

import torch

from memviz.backends.base import Backend, DriverMemory, check_alloc_conf, fraction_and_cap
from memviz.errors import InputError
from memviz.shapes import Request

__all__ = ["CudaBackend"]

SLEEP_PROBE_CYCLES = 10_000_000  # one timed torch.cuda._sleep, a few ms, to learn its cycles per second


class CudaBackend(Backend):
    """PyTorch's allocator on a real CUDA device.

    Args:
        device: CUDA device index (default None: the current device, ``torch.cuda.current_device()``, as
            ``torch.cuda.memory_stats()`` reads it; in a ``torchrun`` rank after ``torch.cuda.set_device``, its own).
        cap_bytes: cap the cache with ``torch.cuda.set_per_process_memory_fraction`` so that OOM and
            fragmentation show in seconds; None leaves the process uncapped.
        alloc_conf: ``PYTORCH_CUDA_ALLOC_CONF`` to use. Before CUDA starts it is put in the environment;
            after, it is applied with ``torch.cuda.memory._set_allocator_settings`` (``memory_stats()``'s
            ``max_split_size`` then still shows the value from CUDA's start, as in PyTorch). None keeps
            whatever the process has.

    Raises:
        RuntimeError: CUDA is not available.
    """

    kind = "cuda"
    torch_version = torch.__version__
    oom_errors = (torch.cuda.OutOfMemoryError,)

    def __init__(self, device: int | None = None, cap_bytes: int | None = None, alloc_conf: str | None = None) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA is not available here; use the simulator (backend='sim')")
        alloc_conf = check_alloc_conf(alloc_conf)
        count = torch.cuda.device_count()
        if device is None:
            device = torch.cuda.current_device()
        if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < count:
            gpus = "one GPU, cuda:0" if count == 1 else f"{count} GPUs, cuda:0 to cuda:{count - 1}"
            raise InputError(f"device must be a CUDA device index from 0 to {count - 1} (this machine has {gpus}), "
                             f"not {device!r}")
        if alloc_conf is not None:
            if torch.cuda.is_initialized():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)
                    torch.cuda.memory._set_allocator_settings(alloc_conf)
            else:
                os.environ["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
        self._alloc_conf = alloc_conf if alloc_conf is not None else os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        self.device = torch.device("cuda", device)
        self.index = device
        torch.cuda.init()
        props = torch.cuda.get_device_properties(self.device)
        self.device_name = props.name
        self.total_memory_bytes = props.total_memory
        self._cap_bytes: int | None = None
        self.set_cap(cap_bytes)
        self._nvml = _nvml_handle(self.device)
        self._capture: tuple[torch.cuda.CUDAGraph, torch.cuda.graph] | None = None  # graph, its open context
        self._pools: dict[tuple[int, int], torch.cuda.MemPool] = {}  # new_pool's pools by id
        self._sleep_cycles_per_s: float | None = None  # torch.cuda._sleep's speed, measured on first use
        self._own_capture_stream: torch.cuda.Stream | None = None  # see _capture_stream_for_device

    def empty(self, request: Request) -> torch.Tensor:
        return torch.empty(request.shape, dtype=getattr(torch, request.dtype), device=self.device)

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    # -- streams, private pools and CUDA graphs: torch's own objects

    def default_stream(self) -> torch.cuda.Stream:
        return torch.cuda.default_stream(self.device)

    def new_stream(self) -> torch.cuda.Stream:
        return torch.cuda.Stream(self.device)

    def stream_id(self, stream: torch.cuda.Stream) -> int:
        return int(stream.cuda_stream)

    def on_stream(self, stream: torch.cuda.Stream) -> AbstractContextManager[None]:
        return torch.cuda.stream(stream)

    def record_stream(self, tensor: torch.Tensor, stream: torch.cuda.Stream) -> None:
        tensor.record_stream(stream)

    def queue_work(self, stream: torch.cuda.Stream, seconds: float) -> None:
        if self._sleep_cycles_per_s is None:
            self._sleep_cycles_per_s = _sleep_cycles_per_s(self.device)
        with torch.cuda.stream(stream):
            torch.cuda._sleep(int(seconds * self._sleep_cycles_per_s))

    def synchronize(self, stream: torch.cuda.Stream | None = None) -> None:
        if stream is None:
            torch.cuda.synchronize(self.device)
        else:
            stream.synchronize()

    def new_pool(self) -> tuple[int, int]:
        pool = torch.cuda.MemPool()
        self._pools[tuple(pool.id)] = pool  # the only reference, so that release_pool deletes it
        return tuple(pool.id)

    def pool_id(self, pool: tuple[int, int]) -> tuple[int, int]:
        return pool

    def in_pool(self, pool: tuple[int, int]) -> AbstractContextManager[None]:
        return torch.cuda.use_mem_pool(self._pools[pool], self.device)

    def release_pool(self, pool: tuple[int, int]) -> None:
        del self._pools[pool]  # ~MemPool: releasePool, then emptyCache of its id

    def begin_capture(self, pool_id: tuple[int, int] | None) -> torch.cuda.CUDAGraph:
        if self._capture is not None:
            raise InputError("a capture is already underway; end it first")
        with torch.cuda.device(self.device):  # the graph, and a first default capture stream, on this device
            g = torch.cuda.CUDAGraph()
            # thread_local: CUDA calls of other threads (a data loader, the kernel's own) stay legal during it
            context = torch.cuda.graph(g, pool=pool_id, stream=self._capture_stream_for_device(),
                                       capture_error_mode="thread_local")
            context.__enter__()  # its stream context makes the capture stream's device current until __exit__
        self._capture = (g, context)
        return g

    def _capture_stream_for_device(self) -> torch.cuda.Stream | None:
        """None (``torch.cuda.graph``'s one default capture stream) unless that stream lives on another device:
        torch makes it once per process, on the device current at the first capture; then a stream of this
        device's own, made once."""
        default = torch.cuda.graph.default_capture_stream
        if default is None or default.device == self.device:
            return None
        if self._own_capture_stream is None:
            self._own_capture_stream = torch.cuda.Stream(self.device)
        return self._own_capture_stream

    def end_capture(self, graph: torch.cuda.CUDAGraph) -> None:
        if self._capture is None or self._capture[0] is not graph:
            raise InputError("end_capture() of a graph that is not being captured")
        context = self._capture[1]
        self._capture = None
        with torch.cuda.device(self.device):  # the capture stream is this device's current stream
            torch.cuda._sleep(1)  # one kernel, so that the graph is not empty (replay needs a node); allocates nothing
            context.__exit__(None, None, None)

    def capture_stream(self, graph: torch.cuda.CUDAGraph) -> torch.cuda.Stream:
        """The capture stream; only while ``graph`` is being captured (the current stream then)."""
        return torch.cuda.current_stream(self.device)

    def graph_pool_id(self, graph: torch.cuda.CUDAGraph) -> tuple[int, int]:
        return tuple(graph.pool())

    def replay_graph(self, graph: torch.cuda.CUDAGraph) -> None:
        graph.replay()

    def delete_graph(self, graph: torch.cuda.CUDAGraph) -> None:
        """``reset()``: the graph lets go of its pool. ``~CUDAGraph`` (when the caller drops its last reference)
        then unregisters the default generator, whose seed and offset tensors go with the last graph."""
        graph.reset()

    def memory_stats(self) -> Mapping[str, int]:
        return torch.cuda.memory_stats(self.device)

    def snapshot(self) -> dict:
        snap = torch.cuda.memory._snapshot(self.device)
        index = self.device.index
        snap["segments"] = [s for s in snap["segments"] if s.get("device", index) == index]
        return snap

    def reset_peak_memory_stats(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def reset_accumulated_memory_stats(self) -> None:
        torch.cuda.reset_accumulated_memory_stats(self.device)

    def set_cap(self, cap_bytes: int | None) -> None:
        fraction, cap_in_force = fraction_and_cap(cap_bytes, self.total_memory_bytes)
        torch.cuda.set_per_process_memory_fraction(1.0 if fraction is None else fraction, self.device)
        self._cap_bytes = cap_in_force

    def driver_memory(self) -> DriverMemory:
        free_bytes, total_bytes = torch.cuda.mem_get_info(self.device)
        if self._nvml is None:
            return DriverMemory(total_bytes, free_bytes, total_bytes - free_bytes)
        import pynvml

        info = pynvml.nvmlDeviceGetMemoryInfo(self._nvml)
        mine, others = None, []
        try:
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(self._nvml):
                used = proc.usedGpuMemory or 0
                if proc.pid == os.getpid():
                    mine = used
                else:
                    others.append((proc.pid, used))
        except pynvml.NVMLError:  # not permitted in some containers: totals still hold
            pass
        return DriverMemory(total_bytes, free_bytes, info.used, mine, tuple(others), "NVML")


def _sleep_cycles_per_s(device: torch.device) -> float:
    """How many cycles ``torch.cuda._sleep`` spins per second on ``device``, timed with CUDA events (as
    test_cuda.py's ``get_cycles_per_ms``)."""
    with torch.cuda.device(device):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(SLEEP_PROBE_CYCLES)
        end.record()
        end.synchronize()
        return SLEEP_PROBE_CYCLES / (start.elapsed_time(end) / 1000)


def _nvml_handle(device: torch.device):
    """An NVML handle for ``device``, or None when NVML (nvidia-ml-py) is missing or fails."""
    try:
        import pynvml

        pynvml.nvmlInit()
        index = torch.cuda._get_nvml_device_index(device.index)
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # NVML is optional: the gauges then show cudaMemGetInfo alone
        return None

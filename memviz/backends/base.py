"""The interface every backend offers the lab: allocate, release, and read the allocator's numbers."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from memviz.errors import InputError, InputTypeError
from memviz.shapes import Request
from memviz.sim.limits import check_bytes, fraction_for_cap  # one copy, shared with the simulator's what-ifs
from memviz.units import format_bytes

__all__ = ["Backend", "DriverMemory", "check_alloc_conf", "fraction_and_cap", "fraction_for_cap"]


@dataclass(frozen=True)
class DriverMemory:
    """The driver's view of the device, which includes what PyTorch's cache does not.

    Attributes:
        total_bytes: device memory as the driver counts it (``cudaMemGetInfo`` total).
        free_bytes: free device memory (``cudaMemGetInfo`` free), all processes counted.
        used_bytes: NVML's used memory (every process, plus the driver's own reservation, which
            ``nvidia-smi``'s "used" leaves out: 1,197,342,720 B here vs 527 MiB there on an idle H200
            right after CUDA started), from NVML when available.
        process_used_bytes: used by this process (CUDA context + libraries + PyTorch's reserved), or None.
        other_processes: ``(pid, used_bytes)`` of the other processes on the device.
        source: where the numbers come from, e.g. ``"NVML"`` or ``"cudaMemGetInfo"``.
    """

    total_bytes: int
    free_bytes: int
    used_bytes: int
    process_used_bytes: int | None = None
    other_processes: tuple[tuple[int, int], ...] = ()
    source: str = "cudaMemGetInfo"


class Backend(ABC):
    """One device's caching allocator, real (``kind == "cuda"``) or simulated (``kind == "sim"``).

    Attributes:
        kind: ``"cuda"`` or ``"sim"``: the name ``Lab(backend=...)`` takes for it.
        index: the device index (``cuda:1`` is 1): the CUDA device's, or which GPU of the simulated node.
        device_name: e.g. ``"NVIDIA H200"``.
        total_memory_bytes: the device's total memory.
        oom_errors: exception types an allocation raises when the allocator runs out of memory.
        torch_version: the torch whose allocator rules it follows (``"2.11"``, ``torch.__version__``): which
            allocations a CUDA graph capture makes (:func:`memviz.sim.graphs.registers_generator_at_capture`).
    """

    kind: str
    index: int = 0
    torch_version: str | None = None
    device_name: str
    total_memory_bytes: int
    oom_errors: tuple[type[BaseException], ...]

    @abstractmethod
    def empty(self, request: Request) -> Any:
        """Allocate one uninitialised tensor for ``request`` on the current stream (the default stream, or
        the one :meth:`on_stream` / a capture made current); it is freed when its last reference goes."""

    @abstractmethod
    def empty_cache(self) -> None:
        """Release every cached segment that holds no live block (``torch.cuda.empty_cache()``)."""

    @abstractmethod
    def memory_stats(self) -> Mapping[str, int]:
        """``torch.cuda.memory_stats()``: the flat, sorted stat dict (``{}`` before CUDA starts)."""

    @abstractmethod
    def snapshot(self) -> dict:
        """``torch.cuda.memory._snapshot()``: at least ``segments``, each with its ``blocks``."""

    def segments(self) -> list[dict]:
        """``snapshot()["segments"]``: every segment with its blocks, in address order. Backends that can read
        them without building the rest of the snapshot (the simulator's trace) override this."""
        return self.snapshot()["segments"]

    @abstractmethod
    def reset_peak_memory_stats(self) -> None:
        """Set every ``*.peak`` stat to its current value."""

    @abstractmethod
    def reset_accumulated_memory_stats(self) -> None:
        """Zero the ``*.allocated`` / ``*.freed`` stats and the event counters (retries, OOMs, ...)."""

    _alloc_conf: str
    _cap_bytes: int | None

    @property
    def alloc_conf(self) -> str:
        """The allocator settings in force, in ``PYTORCH_CUDA_ALLOC_CONF`` syntax (``""``: defaults)."""
        return self._alloc_conf

    @property
    def cap_bytes(self) -> int | None:
        """Most bytes the cache may reserve (the per-process memory fraction), or None when uncapped."""
        return self._cap_bytes

    @abstractmethod
    def set_cap(self, cap_bytes: int | None) -> None:
        """Cap the cache at ``cap_bytes`` via ``set_per_process_memory_fraction`` (None lifts the cap)."""

    # -- streams, private pools and CUDA graphs (memviz.lab_streams drives these by name) ----------------
    # A backend without them keeps these defaults, which refuse with a clear message.

    def default_stream(self) -> Any:
        """The default stream's handle (``torch.cuda.default_stream()``)."""
        raise self._no_streams("side streams")

    def new_stream(self) -> Any:
        """Make a side stream (``torch.cuda.Stream()``); return its handle."""
        raise self._no_streams("side streams")

    def stream_id(self, stream: Any) -> int:
        """The stream's ``cudaStream_t`` value, as snapshots' ``stream`` fields show it (0: the default stream)."""
        raise self._no_streams("side streams")

    def on_stream(self, stream: Any) -> AbstractContextManager[None]:
        """A context in which :meth:`empty` allocates on ``stream`` (``with torch.cuda.stream(s):``)."""
        raise self._no_streams("side streams")

    def record_stream(self, tensor: Any, stream: Any) -> None:
        """``tensor.record_stream(stream)``: its free will wait for the work queued on ``stream`` so far."""
        raise self._no_streams("record_stream")

    def queue_work(self, stream: Any, seconds: float) -> None:
        """Keep ``stream`` busy for about ``seconds`` (a sleep kernel), so that frees waiting on it stay pending."""
        raise self._no_streams("side streams")

    def synchronize(self, stream: Any = None) -> None:
        """Wait for ``stream``'s queued work (None: every stream's; ``torch.cuda.synchronize()``)."""
        raise self._no_streams("side streams")

    def new_pool(self) -> Any:
        """Make a private pool (``torch.cuda.MemPool()``) and keep it; return its handle (its id)."""
        raise self._no_streams("private pools")

    def pool_id(self, pool: Any) -> tuple[int, int]:
        """The pool's id (``MemPool.id``), as snapshots' ``segment_pool_id`` shows it."""
        raise self._no_streams("private pools")

    def in_pool(self, pool: Any) -> AbstractContextManager[None]:
        """A context in which :meth:`empty` allocates into ``pool`` (``torch.cuda.use_mem_pool(pool)``)."""
        raise self._no_streams("private pools")

    def release_pool(self, pool: Any) -> None:
        """Delete the pool (``del`` of the ``MemPool``: ``releasePool``, then ``emptyCache`` of its id)."""
        raise self._no_streams("private pools")

    def begin_capture(self, pool_id: tuple[int, int] | None) -> Any:
        """Start capturing a CUDA graph into ``pool_id`` (None: a new pool), as entering ``torch.cuda.graph(g,
        pool=...)`` does: synchronize, ``empty_cache()``, then allocations go to the capture stream; return the
        graph's handle."""
        raise self._no_streams("CUDA graphs")

    def end_capture(self, graph: Any) -> None:
        """End the capture :meth:`begin_capture` started (leaving ``torch.cuda.graph``)."""
        raise self._no_streams("CUDA graphs")

    def capture_stream(self, graph: Any) -> Any:
        """The stream the graph was captured on (torch's one default capture stream)."""
        raise self._no_streams("CUDA graphs")

    def graph_pool_id(self, graph: Any) -> tuple[int, int]:
        """The id of the graph's private pool (``graph.pool()``)."""
        raise self._no_streams("CUDA graphs")

    def replay_graph(self, graph: Any) -> None:
        """``graph.replay()``: runs the captured work, allocates nothing."""
        raise self._no_streams("CUDA graphs")

    def delete_graph(self, graph: Any) -> None:
        """``graph.reset()`` (what deleting it does): the graph lets go of its pool."""
        raise self._no_streams("CUDA graphs")

    def _no_streams(self, what: str) -> InputError:
        return InputError(f"the {type(self).__name__} backend has no {what}; use backend='sim' or 'cuda'")

    def driver_memory(self) -> DriverMemory | None:
        """The driver's view of device memory, or None where there is no driver (the simulator)."""
        return None

    def describe(self) -> str:
        """One line saying which backend runs, on what device, under which cap and config."""
        what = "real GPU (torch.cuda)" if self.kind == "cuda" else "simulator (memviz.sim)"
        where = f"cuda:{self.index}, " if self.index else ""
        text = f"{what}: {where}{self.device_name}, {format_bytes(self.total_memory_bytes)}"
        if self.cap_bytes is not None:
            text += f", capped at {format_bytes(self.cap_bytes)}"
        text += f", PYTORCH_CUDA_ALLOC_CONF={self.alloc_conf!r}" if self.alloc_conf else ", default allocator config"
        return text

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


def check_alloc_conf(alloc_conf: object) -> str | None:
    """``alloc_conf`` as given if it is a str or None (the lab's boundary check of its type).

    Raises:
        InputTypeError: anything else (``0``, ``False``, ``[]``: once read as "no config").
    """
    if alloc_conf is None or isinstance(alloc_conf, str):
        return alloc_conf
    raise InputTypeError(f"alloc_conf must be a str in PYTORCH_CUDA_ALLOC_CONF syntax, e.g. "
                         f"'expandable_segments:True', or None for the defaults; not {type(alloc_conf).__name__} "
                         f"{alloc_conf!r}")


def fraction_and_cap(cap_bytes: int | None, total_bytes: int) -> tuple[float | None, int | None]:
    """The memory fraction to set for ``cap_bytes`` and the cap it puts in force, ``int(fraction * total)``.

    The allocator limits the cache to ``int(fraction * total_bytes)`` (``CUDACachingAllocator.cpp``:
    ``allowed_memory_maximum``), so the cap in force is that, never above ``cap_bytes``: equal to it on
    every device below 2**53 bytes (8 PiB), one step of the float below it above. ``(None, None)``: no cap.

    Raises:
        InputTypeError: a cap that is not an int of bytes. InputError: a cap below 1 byte or above the
            device's memory (the message says the most it may be).
    """
    if cap_bytes is None:
        return None, None
    cap_bytes = check_bytes(cap_bytes, "cap", low=1, example="2 << 30")
    if cap_bytes > total_bytes:
        raise InputError(f"cap={format_bytes(cap_bytes)} ({cap_bytes:,} bytes) is more than the device's "
                         f"{format_bytes(total_bytes)}: pass a cap up to {total_bytes:,} bytes, or None for no cap")
    fraction = fraction_for_cap(cap_bytes, total_bytes)
    assert fraction is not None
    return fraction, int(fraction * total_bytes)

"""The simulator as a backend: memviz.sim's allocator behind the same interface as a real GPU."""

from __future__ import annotations

from collections.abc import Mapping

from memviz.backends.base import Backend, check_alloc_conf, fraction_and_cap
from memviz.devices import PRESETS, SimulatedDevice, simulated_device
from memviz.errors import InputError
from memviz.shapes import Request
from memviz.sim import CachingAllocator, OutOfMemoryError
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
            a size (``"24 GiB"`` or bytes) or a :class:`~memviz.devices.SimulatedDevice`. Default ``"T4"``.
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
        self.allocator = CachingAllocator(self.total_memory_bytes, memory_fraction=fraction, alloc_conf=alloc_conf)
        self._alloc_conf = alloc_conf

    def empty(self, request: Request) -> SimTensor:
        return SimTensor(self.allocator, self.allocator.malloc(request.nbytes), request)

    def empty_cache(self) -> None:
        self.allocator.empty_cache()

    def memory_stats(self) -> Mapping[str, int]:
        return self.allocator.memory_stats()

    def snapshot(self) -> dict:
        return self.allocator.snapshot()

    def segments(self) -> list[dict]:
        return self.allocator.segments()

    def reset_peak_memory_stats(self) -> None:
        self.allocator.reset_peak_memory_stats()

    def reset_accumulated_memory_stats(self) -> None:
        self.allocator.reset_accumulated_memory_stats()

    def set_cap(self, cap_bytes: int | None) -> None:
        fraction, cap_in_force = fraction_and_cap(cap_bytes, self.total_memory_bytes)
        self.allocator.set_memory_fraction(1.0 if fraction is None else fraction)
        self._cap_bytes = cap_in_force

"""The real GPU as a backend: PyTorch's CUDA caching allocator, read through ``torch.cuda``."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping

import torch

from memviz.backends.base import Backend, DriverMemory, check_alloc_conf, fraction_and_cap
from memviz.errors import InputError
from memviz.shapes import Request

__all__ = ["CudaBackend"]


class CudaBackend(Backend):
    """PyTorch's allocator on a real CUDA device.

    Args:
        device: CUDA device index (default 0).
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
    oom_errors = (torch.cuda.OutOfMemoryError,)

    def __init__(self, device: int = 0, cap_bytes: int | None = None, alloc_conf: str | None = None) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA is not available here; use the simulator (backend='sim')")
        alloc_conf = check_alloc_conf(alloc_conf)
        count = torch.cuda.device_count()
        if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < count:
            raise InputError(f"device must be a CUDA device index from 0 to {count - 1} (this machine has {count}), "
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
        torch.cuda.init()
        props = torch.cuda.get_device_properties(self.device)
        self.device_name = props.name
        self.total_memory_bytes = props.total_memory
        self._cap_bytes: int | None = None
        self.set_cap(cap_bytes)
        self._nvml = _nvml_handle(self.device)

    def empty(self, request: Request) -> torch.Tensor:
        return torch.empty(request.shape, dtype=getattr(torch, request.dtype), device=self.device)

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

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


def _nvml_handle(device: torch.device):
    """An NVML handle for ``device``, or None when NVML (nvidia-ml-py) is missing or fails."""
    try:
        import pynvml

        pynvml.nvmlInit()
        index = torch.cuda._get_nvml_device_index(device.index)
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # NVML is optional: the gauges then show cudaMemGetInfo alone
        return None

"""What the predictor knows about each target GPU: compute capability and library workspaces.

This is data, one row per architecture, with where each figure comes from. The predictor never keys a
rule on a test case; it looks up the target's architecture here.

- ``cublas_workspace_bytes``: cuBLAS keeps one workspace per (handle, stream), and torch keeps one handle
  per thread: the first cuBLAS call on the main thread and the first in autograd's backward thread each
  allocate one and keep it until ``torch._C._cuda_clearCublasWorkspaces()``. Size: torch's default
  ``CUBLAS_WORKSPACE_CONFIG`` (``aten/src/ATen/cuda/CublasHandlePool.cpp``): ``:4096:8`` = 32 MiB on
  compute capability 9.0 and above, ``:4096:2:16:8`` = 8 MiB + 128 KiB below. Measured on the H200
  (torch 2.11, ``evaluation/recordings/h200_probe.json.gz``, ``blas``): the first fp32 ``mm`` on a thread keeps
  33,554,432 bytes.
- ``cublaslt_workspace_bytes``: the first ``addmm`` with a bias (cuBLASLt's bias epilogue,
  ``gemm_and_bias``) on a thread keeps a cuBLASLt workspace, ``CUBLASLT_WORKSPACE_SIZE`` = 1024 KiB by
  default. Measured on the H200: 1,048,576 bytes kept.
- ``sm_count``, ``max_threads_per_sm``: ``multiProcessorCount`` and ``maxThreadsPerMultiProcessor`` of the
  device properties (NVIDIA's specifications: T4 40/1024, L4 58/1536, A100 108/2048, H100 and H200 SXM
  132/2048); torch's reduction kernels size their global-memory scratch from them (``Reduce.cuh``).
- ``context_bytes``: the CUDA context and the libraries' modules, outside the allocator but inside
  ``total_memory`` (which already leaves out the driver's own reservation, the rest of what NVML counts).
  Measured on the H200 (torch 2.11, driver 580): ``total - free`` of ``mem_get_info`` right after CUDA
  init, less the 2 MiB then reserved, is 552,402,944 bytes (lesson 6; ``memviz/data/h200_recorded.json``).
  Other cards take the same figure (it depends on the driver and the modules loaded, not on the card's
  size); it matters only for uncapped runs: a cap bounds the allocator itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from memviz.devices import PRESETS, SimulatedDevice, simulated_device
from memviz.sim.constants import MiB

__all__ = ["ARCHS", "GpuArch", "arch_for"]



@dataclass(frozen=True)
class GpuArch:
    """One GPU architecture as the libraries see it (sizes in bytes)."""

    name: str
    capability: tuple[int, int]
    cublas_workspace_bytes: int
    cublaslt_workspace_bytes: int = 1 * MiB
    context_bytes: int = 552_402_944
    sm_count: int = 132
    max_threads_per_sm: int = 2048

    @property
    def supports_flash_attention(self) -> bool:
        """FlashAttention-2 in torch needs sm80 or newer (``check_flash_attention_hardware_support``)."""
        return self.capability >= (8, 0)

    @property
    def supports_bf16(self) -> bool:
        """Native bf16 needs sm80 or newer (``torch.cuda.is_bf16_supported`` emulates it below)."""
        return self.capability >= (8, 0)


_PRE_HOPPER_CUBLAS = 4096 * 1024 * 2 + 16 * 1024 * 8  # ":4096:2:16:8"
_HOPPER_CUBLAS = 4096 * 1024 * 8  # ":4096:8"

ARCHS: dict[str, GpuArch] = {
    "T4": GpuArch("Turing (sm75)", (7, 5), _PRE_HOPPER_CUBLAS, sm_count=40, max_threads_per_sm=1024),
    "L4": GpuArch("Ada (sm89)", (8, 9), _PRE_HOPPER_CUBLAS, sm_count=58, max_threads_per_sm=1536),
    "A100-40GB": GpuArch("Ampere (sm80)", (8, 0), _PRE_HOPPER_CUBLAS, sm_count=108),
    "A100-80GB": GpuArch("Ampere (sm80)", (8, 0), _PRE_HOPPER_CUBLAS, sm_count=108),
    "H100": GpuArch("Hopper (sm90)", (9, 0), _HOPPER_CUBLAS),
    "H200": GpuArch("Hopper (sm90)", (9, 0), _HOPPER_CUBLAS),
}
"""Architecture per preset of :data:`memviz.devices.PRESETS`; a custom size is taken as a Hopper."""


def arch_for(device: str | int | SimulatedDevice) -> tuple[SimulatedDevice, GpuArch]:
    """The simulated device and its architecture for a preset name, a size or a device."""
    dev = simulated_device(device)
    for key, preset in PRESETS.items():
        if preset == dev and key in ARCHS:
            return dev, ARCHS[key]
    return dev, ARCHS["H200"]

"""The target GPUs as the predictor sees them: architecture, and the hardware figures the rules read.

This is data, one row per preset. What the libraries do on each architecture is in
:mod:`memviz.predictor.rules`, keyed by :attr:`GpuArch.key`; a rule measured on one architecture and applied to
another says so in the prediction's notes.

- ``key``: the architecture as the rules name it, ``"sm"`` + the compute capability (``"sm90"``).
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

__all__ = ["ARCHS", "GpuArch", "arch_for"]


@dataclass(frozen=True)
class GpuArch:
    """One GPU architecture as the libraries see it.

    Attributes:
        name: ``"Hopper (sm90)"``.
        capability: the compute capability, ``(9, 0)``.
        context_bytes: bytes the CUDA context holds outside the allocator.
        sm_count / max_threads_per_sm: the device properties of those names.
    """

    name: str
    capability: tuple[int, int]
    context_bytes: int = 552_402_944
    sm_count: int = 132
    max_threads_per_sm: int = 2048

    @property
    def key(self) -> str:
        """``"sm"`` + the compute capability: how rules name an architecture (``"sm90"``)."""
        return f"sm{self.capability[0]}{self.capability[1]}"

    @property
    def supports_flash_attention(self) -> bool:
        """FlashAttention-2 in torch needs sm80 or newer (``check_flash_attention_hardware_support``)."""
        return self.capability >= (8, 0)

    @property
    def supports_bf16(self) -> bool:
        """Native bf16 needs sm80 or newer (``torch.cuda.is_bf16_supported`` emulates it below)."""
        return self.capability >= (8, 0)


ARCHS: dict[str, GpuArch] = {
    "T4": GpuArch("Turing (sm75)", (7, 5), sm_count=40, max_threads_per_sm=1024),
    "L4": GpuArch("Ada (sm89)", (8, 9), sm_count=58, max_threads_per_sm=1536),
    "A100-40GB": GpuArch("Ampere (sm80)", (8, 0), sm_count=108),
    "A100-80GB": GpuArch("Ampere (sm80)", (8, 0), sm_count=108),
    "H100": GpuArch("Hopper (sm90)", (9, 0)),
    "H200": GpuArch("Hopper (sm90)", (9, 0)),
}
"""Architecture per preset of :data:`memviz.devices.PRESETS`; a custom size is taken as a Hopper."""


def arch_for(device: str | int | SimulatedDevice) -> tuple[SimulatedDevice, GpuArch]:
    """The simulated device and its architecture for a preset name, a size or a device."""
    dev = simulated_device(device)
    for key, preset in PRESETS.items():
        if preset == dev and key in ARCHS:
            return dev, ARCHS[key]
    return dev, ARCHS["H200"]

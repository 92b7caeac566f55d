"""Simulated devices: capacity presets for common GPUs, or any size in bytes.

Capacities are the cards' nominal memory (``16 GiB`` for a T4) except the H200, whose
``total_memory`` was measured with torch 2.11 (150,109,880,320 B). A real card reports a little less
than nominal (ECC and firmware reservations), so a simulated T4 is slightly roomier than a real one.

The simulator models one node of :data:`SIM_NODE_GPUS` identical GPUs, as ``torchrun --nproc-per-node 8`` runs
on: a :class:`SimulatedDevice`'s ``index`` says which of them it is (``cuda:1``). Each simulated GPU has its own
allocator, as each CUDA device has its own ``DeviceCachingAllocator``; the index changes what the lab and its
snapshots call the device (``segments[i]["device"]``, ``device_traces[index]``, "GPU 1" in OOM messages), never
how memory behaves.
"""

from __future__ import annotations

from dataclasses import dataclass

from memviz.errors import InputError, InputTypeError
from memviz.units import GiB, format_bytes, parse_size

__all__ = ["PRESETS", "SIM_NODE_GPUS", "SimulatedDevice", "simulated_device"]

SIM_NODE_GPUS = 8
"""GPUs in the simulated node: device indices 0 to 7 (an 8-GPU node, the most one ``torchrun`` node commonly has)."""


@dataclass(frozen=True)
class SimulatedDevice:
    """A GPU for the simulator.

    Attributes:
        name: shown in gauges and OOM messages.
        total_memory_bytes: what ``torch.cuda.get_device_properties(0).total_memory`` would report.
        index: which GPU of the simulated node it is, 0 to ``SIM_NODE_GPUS - 1`` (default 0: ``cuda:0``).
    """

    name: str
    total_memory_bytes: int
    index: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.index, bool) or not isinstance(self.index, int):
            raise InputTypeError(f"a simulated GPU's index is an int from 0 to {SIM_NODE_GPUS - 1}, not "
                                 f"{type(self.index).__name__} {self.index!r}")
        if not 0 <= self.index < SIM_NODE_GPUS:
            raise InputError(f"the simulator models a node of {SIM_NODE_GPUS} GPUs: a device index from 0 to "
                             f"{SIM_NODE_GPUS - 1}, not {self.index}")

    def __str__(self) -> str:
        return f"{self.name} ({format_bytes(self.total_memory_bytes)})"


PRESETS: dict[str, SimulatedDevice] = {
    "T4": SimulatedDevice("Tesla T4 16 GB (simulated)", 16 * GiB),
    "L4": SimulatedDevice("NVIDIA L4 24 GB (simulated)", 24 * GiB),
    "A100-40GB": SimulatedDevice("NVIDIA A100 40 GB (simulated)", 40 * GiB),
    "A100-80GB": SimulatedDevice("NVIDIA A100 80 GB (simulated)", 80 * GiB),
    "H100": SimulatedDevice("NVIDIA H100 80 GB (simulated)", 80 * GiB),
    "H200": SimulatedDevice("NVIDIA H200 (simulated)", 150_109_880_320),
}
"""Preset simulated devices by short name (case-insensitive in :func:`simulated_device`)."""


def simulated_device(device: str | int | SimulatedDevice = "T4") -> SimulatedDevice:
    """A :class:`SimulatedDevice` from a preset name (``"A100-80GB"``), a size (``"12 GiB"``, bytes) or itself.

    Raises:
        ValueError: an unknown preset name (the known ones are listed) or a bad size.
    """
    if isinstance(device, SimulatedDevice):
        return device
    if isinstance(device, str):
        for key, preset in PRESETS.items():
            if key.lower() == device.strip().lower():
                return preset
        if not device.strip()[:1].isdigit():
            raise ValueError(f"unknown simulated device {device!r}; presets: {', '.join(PRESETS)}, or a size")
    total = parse_size(device)
    return SimulatedDevice(f"Simulated GPU {format_bytes(total)}", total)

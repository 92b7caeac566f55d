"""One interface over the real GPU (``torch.cuda``) and the simulator (``memviz.sim``).

:func:`select_backend` picks the real GPU when CUDA is available and the simulator otherwise, and the
backend's :meth:`~memviz.backends.base.Backend.describe` always says which one runs.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from typing import NamedTuple

from memviz.backends.base import Backend, DriverMemory, check_alloc_conf, fraction_for_cap
from memviz.backends.simulated import SimTensor, SimulatedBackend
from memviz.devices import SIM_NODE_GPUS, SimulatedDevice, simulated_device
from memviz.errors import InputError, InputTypeError
from memviz.units import parse_size

__all__ = ["Backend", "DriverMemory", "GpuInfo", "SimTensor", "SimulatedBackend", "cuda_available", "cuda_devices",
           "device_index", "fraction_for_cap", "select_backend"]  # fmt: skip

KINDS = ("auto", "cuda", "sim")


_NVIDIA_DEVICE_NODES = ("/dev/nvidiactl", "/dev/dxg")  # Linux driver; WSL2's GPU paravirtualization


def cuda_available() -> bool:
    """True when torch is installed and sees a CUDA device.

    Without an NVIDIA device node and with torch not yet imported, the answer is False without importing
    torch (which takes seconds), so the simulator starts fast on laptops, Binder and CI.
    """
    if "torch" not in sys.modules and not any(os.path.exists(node) for node in _NVIDIA_DEVICE_NODES):
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


class GpuInfo(NamedTuple):
    """One CUDA device of this machine: its ``index``, ``name`` and ``total_memory_bytes``."""

    index: int
    name: str
    total_memory_bytes: int


def cuda_devices() -> list[GpuInfo]:
    """This machine's CUDA devices, in index order (``[]`` without CUDA); what the dashboard's GPU picker offers."""
    if not cuda_available():
        return []
    import torch

    return [GpuInfo(i, p.name, p.total_memory)
            for i, p in ((i, torch.cuda.get_device_properties(i)) for i in range(torch.cuda.device_count()))]


_CUDA_INDEX = re.compile(r"cuda(?::(\d+))?", re.IGNORECASE)


def names_an_index(device: object) -> bool:
    """Whether ``device`` is given as a device index (an int, ``"cuda:N"``, ``"cuda"``, a ``torch.device``) rather
    than as a simulated GPU (a preset name, a size string, a :class:`~memviz.devices.SimulatedDevice`)."""
    if isinstance(device, int):
        return True
    if isinstance(device, str):
        return device.strip().lower().startswith("cuda")
    return type(device).__name__ == "device" and type(device).__module__.startswith("torch")


def device_index(device: object) -> int | None:
    """The device index ``device`` names, as torch reads it: ``1``, ``"cuda:1"`` and ``torch.device("cuda", 1)`` name
    1; ``"cuda"`` and ``torch.device("cuda")`` the current device (None).

    Raises:
        InputTypeError: a bool, or something that is no device index (see :func:`names_an_index`).
        InputError: a negative index, or a string such as ``"cuda:x"`` or ``"cuda:-1"``; also a ``torch.device``
            of another type (``"cpu"``).
    """
    if isinstance(device, bool) or not names_an_index(device):
        raise InputTypeError(f"a device index is an int such as 1, 'cuda:1' or torch.device('cuda', 1), not "
                             f"{device!r}")
    if isinstance(device, int):
        index = device
    elif isinstance(device, str):
        match = _CUDA_INDEX.fullmatch(device.strip())
        if match is None:
            raise InputError(f"device {device!r} is not a CUDA device: write 'cuda:N' with N an index such as 1, "
                             "or 'cuda' for the current device")
        index = None if match.group(1) is None else int(match.group(1))
    else:  # a torch.device
        if device.type != "cuda":
            raise InputError(f"device {device!r} is not a CUDA device: memviz watches the CUDA caching allocator")
        index = device.index
    if index is not None and index < 0:
        raise InputError(f"a device index is 0 or more (cuda:0 is the first GPU), not {index}")
    return index


def select_backend(
    backend: str = "auto",
    device: str | int | SimulatedDevice | None = None,
    cap: int | str | None = None,
    alloc_conf: str | None = None,
) -> Backend:
    """Make the backend a lab runs on.

    Args:
        backend: ``"auto"`` (the real GPU if CUDA is available, else the simulator), ``"cuda"`` or ``"sim"``.
        device: a device index (``1``, ``"cuda:1"``, ``torch.device("cuda", 1)``; ``"cuda"``: the current device),
            or for ``"sim"`` a simulated GPU: a preset name (``"A100-80GB"``), a size (``"24 GiB"``) or a
            :class:`~memviz.devices.SimulatedDevice`. On a GPU the index is the CUDA device's (default: the
            current device, ``torch.cuda.current_device()``). On the simulator it is which GPU of the simulated
            8-GPU node the lab is (:data:`~memviz.devices.SIM_NODE_GPUS`: it names the device in snapshots and
            messages, and changes nothing else); the GPU itself mirrors the real one of that index (else GPU 0)
            when there is one, and is a T4 (16 GiB) when there is none.
        cap: cap the cache at this many bytes (``"2 GiB"`` or an int), like
            ``torch.cuda.set_per_process_memory_fraction``; None: no cap.
        alloc_conf: allocator settings in ``PYTORCH_CUDA_ALLOC_CONF`` syntax. None: the simulator uses the
            defaults and the GPU keeps what the process has.

    Raises:
        InputError (a ``ValueError``): an unknown backend, device or size, a device index this machine (or the
            simulated node) does not have, ``"cuda:x"``, a cap above the device, an ``alloc_conf`` that is not
            a str or None; RuntimeError: ``"cuda"`` without CUDA.
    """
    if not isinstance(backend, str) or backend not in KINDS:
        raise InputError(f"backend must be one of {', '.join(map(repr, KINDS))}, not {backend!r}")
    alloc_conf = check_alloc_conf(alloc_conf)
    cap_bytes = None if cap is None else parse_size(cap)
    by_index = device is not None and names_an_index(device)
    index = device_index(device) if by_index else None
    use_cuda = backend == "cuda" or (backend == "auto" and cuda_available())
    if use_cuda:
        from memviz.backends.cuda import CudaBackend

        if device is not None and not by_index:
            raise InputTypeError(f"a CUDA device is an index such as 0 or 'cuda:1', not {device!r}")
        return CudaBackend(index, cap_bytes, alloc_conf)
    if index is not None and index >= SIM_NODE_GPUS:
        raise InputError(f"device={device!r}: an int is a device index: the simulator models a node of "
                         f"{SIM_NODE_GPUS} GPUs, cuda:0 to cuda:{SIM_NODE_GPUS - 1}"
                         + (f"; for a simulated GPU of {index:,} bytes pass a size with a unit, e.g. device='16 GiB'"
                            if index >= 1 << 20 else ""))
    gpu = simulated_device(_mirror_of_real_gpu(index or 0) or "T4") if device is None or by_index else device
    if index is not None:
        gpu = dataclasses.replace(simulated_device(gpu), index=index)
    return SimulatedBackend(gpu, cap_bytes, alloc_conf or "")


def _mirror_of_real_gpu(index: int = 0) -> SimulatedDevice | None:
    """A simulated twin of CUDA device ``index`` (same name and capacity; device 0 when there is no such index),
    or None without CUDA."""
    if not cuda_available():
        return None
    import torch

    props = torch.cuda.get_device_properties(index if index < torch.cuda.device_count() else 0)
    return SimulatedDevice(f"{props.name} (simulated)", props.total_memory)

"""One interface over the real GPU (``torch.cuda``) and the simulator (``memviz.sim``).

:func:`select_backend` picks the real GPU when CUDA is available and the simulator otherwise, and the
backend's :meth:`~memviz.backends.base.Backend.describe` always says which one runs.
"""

from __future__ import annotations

import os
import sys

from memviz.backends.base import Backend, DriverMemory, check_alloc_conf, fraction_for_cap
from memviz.backends.simulated import SimTensor, SimulatedBackend
from memviz.devices import SimulatedDevice
from memviz.errors import InputError, InputTypeError
from memviz.units import parse_size

__all__ = ["Backend", "DriverMemory", "SimTensor", "SimulatedBackend", "cuda_available", "fraction_for_cap",
           "select_backend"]  # fmt: skip

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


def select_backend(
    backend: str = "auto",
    device: str | int | SimulatedDevice | None = None,
    cap: int | str | None = None,
    alloc_conf: str | None = None,
) -> Backend:
    """Make the backend a lab runs on.

    Args:
        backend: ``"auto"`` (the real GPU if CUDA is available, else the simulator), ``"cuda"`` or ``"sim"``.
        device: for ``"cuda"`` the device index (default 0); for ``"sim"`` a preset name (``"A100-80GB"``),
            a size (``"24 GiB"``) or a :class:`~memviz.devices.SimulatedDevice`. By default the simulator
            mirrors the real GPU when there is one, and is a T4 (16 GiB) when there is none.
        cap: cap the cache at this many bytes (``"2 GiB"`` or an int), like
            ``torch.cuda.set_per_process_memory_fraction``; None: no cap.
        alloc_conf: allocator settings in ``PYTORCH_CUDA_ALLOC_CONF`` syntax. None: the simulator uses the
            defaults and the GPU keeps what the process has.

    Raises:
        InputError (a ``ValueError``): an unknown backend, device or size, a cap above the device, an
            ``alloc_conf`` that is not a str or None; RuntimeError: ``"cuda"`` without CUDA.
    """
    if not isinstance(backend, str) or backend not in KINDS:
        raise InputError(f"backend must be one of {', '.join(map(repr, KINDS))}, not {backend!r}")
    alloc_conf = check_alloc_conf(alloc_conf)
    cap_bytes = None if cap is None else parse_size(cap)
    use_cuda = backend == "cuda" or (backend == "auto" and cuda_available())
    if use_cuda:
        from memviz.backends.cuda import CudaBackend

        if device is not None and (isinstance(device, bool) or not isinstance(device, int)):
            raise InputTypeError(f"a CUDA device is an index such as 0, not {device!r}")
        return CudaBackend(device or 0, cap_bytes, alloc_conf)
    if device is None:
        device = _mirror_of_real_gpu() or "T4"
    return SimulatedBackend(device, cap_bytes, alloc_conf or "")


def _mirror_of_real_gpu() -> SimulatedDevice | None:
    """A simulated twin of CUDA device 0 (same name and capacity), or None without CUDA."""
    if not cuda_available():
        return None
    import torch

    props = torch.cuda.get_device_properties(0)
    return SimulatedDevice(f"{props.name} (simulated)", props.total_memory)

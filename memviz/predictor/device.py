"""The seam between tracing and simulating: what a rule may do to the simulated device while an op runs.

Rules (:mod:`memviz.predictor.rules`) see a :class:`DeviceMemory`, never the tracing session behind it: they
allocate and free the library buffers a kernel asks for, account an op's outputs, keep a per-thread workspace,
and note what they could not model. :class:`memviz.predictor.session.Session` implements it.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from .gpus import GpuArch

__all__ = ["Allocation", "DeviceMemory"]


class Allocation(NamedTuple):
    """A live allocation of the prediction: the simulated ``ptr`` and the index of its event in the log."""

    ptr: int
    index: int


class DeviceMemory(Protocol):
    """The simulated device as a rule sees it (sizes in bytes; ``op`` names the aten op asking)."""

    @property
    def arch(self) -> GpuArch:
        """The target architecture."""
        ...

    def malloc(self, nbytes: int, op: str, category: str) -> Allocation:
        """Allocate ``nbytes`` as the kernel does; ``torch.OutOfMemoryError`` if it does not fit, as on the GPU."""
        ...

    def try_malloc(self, nbytes: int, op: str, category: str) -> Allocation | None:
        """Allocate, or None when it does not fit (the caller survives, as cuDNN tries its next plan); the failed
        attempt has still released the cache, as it does on the GPU."""
        ...

    def free(self, allocation: Allocation, op: str) -> None:
        """Free an allocation this rule made."""
        ...

    def keep(self, kind: str, nbytes: int, op: str) -> None:
        """Allocate ``nbytes`` once per (``kind``, thread) and keep it for the process (a library handle's
        workspace): the main thread and autograd's backward thread each get their own."""
        ...

    def track(self, tensor: torch.Tensor, op: str) -> None:
        """Account the storage of an op's output (once; a resized storage is reallocated)."""
        ...

    def note(self, text: str) -> None:
        """Say in the prediction's notes what could not be modelled."""
        ...

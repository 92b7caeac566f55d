"""Exceptions raised by :mod:`memviz.sim`.

- :class:`OutOfMemoryError`: the allocator could not satisfy a request (torch.OutOfMemoryError).
- :class:`AllocatorConfigError`: a malformed or unknown ``PYTORCH_CUDA_ALLOC_CONF`` option.
- :class:`InvalidFreeError`: ``free()`` of an address that is not a live allocation.
"""

from __future__ import annotations


class OutOfMemoryError(RuntimeError):
    """The allocator could not satisfy a request; ``str()`` is torch 2.11's message.

    Attributes (all in bytes; ``None`` where the OOM happened before the allocator ran):
        requested_bytes: the caller's request, unrounded.
        alloc_size_bytes: the segment size the allocator tried to obtain ("Tried to allocate …").
        allocated_bytes: ``allocated_bytes.all.current`` at the failure.
        reserved_bytes: ``reserved_bytes.all.current`` at the failure.
        device_free_bytes: what ``cudaMemGetInfo`` would report as free.
    """

    def __init__(self, message: str, *, requested_bytes: int, alloc_size_bytes: int | None = None,
                 allocated_bytes: int | None = None, reserved_bytes: int | None = None,
                 device_free_bytes: int | None = None) -> None:
        super().__init__(message)
        self.requested_bytes = requested_bytes
        self.alloc_size_bytes = alloc_size_bytes
        self.allocated_bytes = allocated_bytes
        self.reserved_bytes = reserved_bytes
        self.device_free_bytes = device_free_bytes


class AllocatorConfigError(ValueError):
    """A ``PYTORCH_CUDA_ALLOC_CONF`` string that torch would reject; the message names the option."""


class InvalidFreeError(ValueError):
    """``free()`` of an address that is not currently allocated; the allocator state is unchanged."""

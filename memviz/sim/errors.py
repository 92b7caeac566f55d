"""Exceptions raised by :mod:`memviz.sim`.

- :class:`OutOfMemoryError`: the allocator could not satisfy a request (torch.OutOfMemoryError).
- :class:`AllocatorConfigError`: a malformed or unknown ``PYTORCH_CUDA_ALLOC_CONF`` option.
- :class:`InvalidFreeError`: ``free()`` of an address that is not a live allocation.
"""

from __future__ import annotations

from collections.abc import Callable


class OutOfMemoryError(RuntimeError):
    """The allocator could not satisfy a request; ``str()`` is torch 2.11's message.

    The message may be given as a zero-argument callable: it is then built the first time it is
    read (``str()``, ``repr()``, ``args``), so an OOM that is caught and dropped, as a replay does
    thousands of times, costs no formatting.

    Attributes (all in bytes; ``None`` where the OOM happened before the allocator ran):
        requested_bytes: the caller's request, unrounded.
        alloc_size_bytes: the segment size the allocator tried to obtain ("Tried to allocate …").
        allocated_bytes: ``allocated_bytes.all.current`` at the failure.
        reserved_bytes: ``reserved_bytes.all.current`` at the failure.
        device_free_bytes: what ``cudaMemGetInfo`` would report as free.
    """

    def __init__(self, message: str | Callable[[], str], *, requested_bytes: int,
                 alloc_size_bytes: int | None = None, allocated_bytes: int | None = None,
                 reserved_bytes: int | None = None, device_free_bytes: int | None = None) -> None:
        if callable(message):
            super().__init__()
            self._format: Callable[[], str] | None = message
        else:
            super().__init__(message)
            self._format = None
        self.requested_bytes = requested_bytes
        self.alloc_size_bytes = alloc_size_bytes
        self.allocated_bytes = allocated_bytes
        self.reserved_bytes = reserved_bytes
        self.device_free_bytes = device_free_bytes

    def _formatted(self) -> None:
        if self._format is not None:
            _BASE_ARGS.__set__(self, (self._format(),))
            self._format = None

    @property  # type: ignore[override]
    def args(self) -> tuple:
        self._formatted()
        return _BASE_ARGS.__get__(self)

    @args.setter
    def args(self, value: tuple) -> None:
        self._format = None
        _BASE_ARGS.__set__(self, value)

    def __str__(self) -> str:
        self._formatted()
        return super().__str__()

    def __repr__(self) -> str:
        self._formatted()
        return super().__repr__()


_BASE_ARGS = BaseException.__dict__["args"]  # the C-level args slot that str() / repr() read


class AllocatorConfigError(ValueError):
    """A ``PYTORCH_CUDA_ALLOC_CONF`` string that torch would reject; the message names the option."""


class InvalidFreeError(ValueError):
    """``free()`` of an address that is not currently allocated; the allocator state is unchanged."""

"""Every exception memviz raises on purpose, in one hierarchy.

- :class:`MemvizError`: the base; ``except MemvizError`` catches what memviz raises by design, and
  nothing else, so a real bug (an ``AttributeError``, a ``KeyError`` deep inside) still shows its
  traceback.
- :class:`InputError` (a ``ValueError``): bad input. The message names the input, the rule it broke and
  what to do instead; nothing changed. Its subclasses say which input:

  - :class:`InputTypeError` (also a ``TypeError``): a value of the wrong type.
  - :class:`AllocatorConfigError`: a ``PYTORCH_CUDA_ALLOC_CONF`` string that torch would reject.
  - :class:`InvalidFreeError`: ``free()`` of an address that is not a live allocation.
  - :class:`SnapshotError`: a snapshot that cannot be loaded or does not have ``_snapshot()``'s shape.
  - :class:`SizeError`: a size that is not a positive whole number of bytes, or has an unknown unit.
- :class:`DataDependentError` (a ``RuntimeError``): a program being predicted needs a tensor's values, which a
  prediction does not compute.
- :class:`OutOfMemoryError` (a ``RuntimeError``, like ``torch.OutOfMemoryError``): the simulated
  allocator could not serve a request. Not a bug and not bad input: the lesson.
- :class:`TorchAllocatorError` (a ``RuntimeError``): torch's own allocator fails at this point of the program
  (a CUDA call it makes errs, an internal assertion of it fails, or it would go on with memory it freed); the
  simulator stops where torch does, and the message says why.
"""

from __future__ import annotations

__all__ = [
    "AllocatorConfigError",
    "DataDependentError",
    "InputError",
    "InputTypeError",
    "InvalidFreeError",
    "MemvizError",
    "OutOfMemoryError",
    "SizeError",
    "SnapshotError",
    "TorchAllocatorError",
]


class MemvizError(Exception):
    """Base of every exception memviz raises on purpose."""


class InputError(MemvizError, ValueError):
    """Bad input: the message names the input, the rule and what to do; the call changed nothing."""


class InputTypeError(InputError, TypeError):
    """An input of the wrong type (``malloc("1 GiB")``, ``free(None)``, ``cap_bytes="2 GiB"``)."""


class AllocatorConfigError(InputError):
    """A ``PYTORCH_CUDA_ALLOC_CONF`` string that torch would reject; the message names the option."""


class InvalidFreeError(InputError):
    """``free()`` of an address that is not currently allocated; the allocator state is unchanged."""


class SnapshotError(InputError):
    """A snapshot could not be loaded, or does not have the shape ``torch.cuda.memory._snapshot()`` gives.

    The message names what is wrong and where, e.g.
    ``segments[3].blocks[2]: 'size' must be an int >= 0, got 'abc'``, or, for a pickle that tries to
    run code, the global it asked for (``refusing to load global 'posix.system'``).
    """


class SizeError(InputError):
    """A size that is not a positive whole number of bytes, or has an unknown unit."""


class DataDependentError(MemvizError, RuntimeError):
    """A program being predicted needs a tensor's values (``.item()``, ``nonzero``, a branch on a tensor), which a
    prediction does not compute.

    Attributes: ``op`` (the aten op or Tensor method), ``line`` (the program's ``file:line (function)``).
    """

    def __init__(self, op: str, line: str) -> None:
        self.op = op
        self.line = line
        super().__init__(
            f"memviz.predict: {op} needs the tensor's values, which a prediction does not compute "
            f"(at {line}). Memory does not depend on them: skip that code while predicting, e.g. "
            "`if not memviz.predicting(): print(loss.item())`, or pass the value in as a Python number.")


class OutOfMemoryError(MemvizError, RuntimeError):
    """The simulated allocator could not satisfy a request; ``str()`` is torch 2.11's message.

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


class TorchAllocatorError(MemvizError, RuntimeError):
    """torch's own ``CUDACachingAllocator`` fails at this point of the program, and so does the simulator.

    The message starts with what torch raises (``CUDA error: invalid argument`` for a ``cudaFree`` the CUDA
    runtime refuses, ``INTERNAL ASSERT FAILED`` for one of torch's assertions), then says what led there. The
    simulator's state is the one torch is left in at that point (what torch changed before the failing call
    stays changed), so it can be read and the program may go on, as it can after torch's exception.
    """

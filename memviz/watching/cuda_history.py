"""On a real GPU: the allocator's memory history while a watch runs, and its out-of-memory observer.

:class:`CudaHistory` turns ``torch.cuda.memory._record_memory_history`` on for the watch (every alloc and free,
with the Python stack of each allocation, in a ring of ``max_entries`` events: a long run keeps its last
``max_entries``) and off after it, unless the program was recording already, in which case it leaves the
recording as it found it.

The OOM observer: ``torch._C._cuda_attach_out_of_memory_observer`` calls a Python function on every CUDA OOM,
after the allocator has recorded the ``oom`` trace event and released its lock, before the error is raised
(``CUDACachingAllocator.cpp``, ``malloc``). An observer cannot be detached, so this module attaches one
function once per process and forwards each OOM to the listeners registered now (:func:`add_oom_listener`).
An exception raised by an observer would replace the ``OutOfMemoryError`` with a plain ``RuntimeError``, so
every listener's exception is swallowed here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

__all__ = ["CudaHistory", "add_oom_listener", "remove_oom_listener"]

DEFAULT_MAX_ENTRIES = 100_000
"""Events the history keeps (PyTorch's own example value): enough for tens of training steps of a large model;
each event with its Python stack takes a few KB of host memory."""

OOMListener = Callable[[int, int, int, int], None]
"""``(device, alloc_size_bytes, device_limit_bytes, device_free_bytes)``, as torch calls the observer."""

_listeners: list[OOMListener] = []
_attached = False


def _observer(device: int, alloc_bytes: int, limit_bytes: int, free_bytes: int) -> None:
    for listener in list(_listeners):
        with contextlib.suppress(Exception):  # never replace the program's OutOfMemoryError
            listener(device, alloc_bytes, limit_bytes, free_bytes)


def add_oom_listener(listener: OOMListener) -> None:
    """Call ``listener`` on every CUDA OOM of this process until :func:`remove_oom_listener`."""
    global _attached
    if not _attached:
        import torch

        torch._C._cuda_attach_out_of_memory_observer(_observer)
        _attached = True
    _listeners.append(listener)


def remove_oom_listener(listener: OOMListener) -> None:
    with contextlib.suppress(ValueError):
        _listeners.remove(listener)


class CudaHistory:
    """The memory history of one device while a watch runs.

    Args:
        device: CUDA device index.
        max_entries: events kept, oldest dropped first (default :data:`DEFAULT_MAX_ENTRIES`).

    Attributes: ``recording`` (this object turned recording on and will turn it off), ``was_recording`` (the
    program had it on already: left as it was).
    """

    def __init__(self, device: int, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be an int >= 1, not {max_entries!r}")
        self.device = device
        self.max_entries = max_entries
        self.recording = False
        self.was_recording = False

    def start(self) -> None:
        import torch

        enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
        self.was_recording = bool(enabled()) if enabled is not None else False
        if self.was_recording:
            return
        record: Any = torch.cuda.memory._record_memory_history
        kwargs = {"context": "alloc", "stacks": "python", "max_entries": self.max_entries, "device": self.device}
        try:  # a fresh ring: nothing of an earlier recording that was turned off
            record("all", clear_history=True, **kwargs)
        except TypeError:  # a torch without clear_history
            record("all", **kwargs)
        self.recording = True

    def snapshot(self) -> dict:
        """``torch.cuda.memory._snapshot()`` of the device: its segments and the recorded events."""
        import torch

        return torch.cuda.memory._snapshot(self.device)

    def stop(self) -> None:
        if self.recording:
            import torch

            torch.cuda.memory._record_memory_history(None, device=self.device)
            self.recording = False

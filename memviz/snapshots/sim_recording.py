"""Record a program's device memory without a GPU: its CPU tensors, as they come and go, through the simulator.

Where a ``torchrun`` job has no GPU (CI, a laptop), each rank can run the same program on CPU (``gloo``) and
:class:`SimRecording` stands in for ``torch.cuda.memory._record_memory_history``: every tensor storage an aten op
makes on the CPU while it records is one ``malloc`` of the storage's bytes in a :class:`memviz.sim.CachingAllocator`
(the device the rank would have), and the storage's death (a weak reference on it, as :mod:`memviz.predict`
does) is its ``free``. :meth:`SimRecording.dump_snapshot` then writes what ``_dump_snapshot`` writes: a
``_snapshot()`` pickle with the segments, the blocks and the trace (``time_us``: the wall clock, so the ranks'
traces line up), on device ``index``.

What it shows: the sizes, order and lifetimes of the storages the program's aten ops make (parameters,
activations, gradients, optimizer state, DDP's buckets and their rebuild, temporaries of decomposed ops), placed
by the simulated caching allocator's own rules, on one stream. Storages resized in place (``UntypedStorage.resize_``,
which FSDP2 uses for its unsharded parameters and no aten op sees) are followed by wrapping ``resize_`` while
recording, as torch's own ``FSDPMemTracker`` does; a ``DTensor`` (FSDP2's parameters, gradients and optimizer
state) counts by its local tensor.

What it does not show, and a GPU run does: memory a CUDA kernel or library takes for itself (cuBLAS and cuDNN
workspaces), CUDA-only kernels and code paths (fused kernels, another autograd formula or optimizer implementation
picked for CUDA), side streams (``record_stream``, FSDP2's and NCCL's streams: one stream here), temporaries made
inside a tensor subclass's own dispatch (below the recording; FSDP2 makes its collectives' buffers outside it),
NCCL's buffers and the CUDA context (outside the caching allocator anyway). And it counts what a GPU run keeps on
the host if the program makes it on the CPU explicitly (the CPU run cannot tell such tensors apart): make those
before :meth:`SimRecording.start` where you can (the example builds FSDP2's ``DeviceMesh``, whose rank tensor stays
on the host, first). The snapshot says so: its ``"memviz_simulated"`` entry
(:data:`~memviz.snapshots.ranks.SIMULATED_KEY`) names the simulated device, what was left out and what may be
counted extra, and :func:`~memviz.snapshots.ranks.simulated_note` reads it back.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
import time
import weakref
from collections.abc import Iterator
from typing import IO, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

from memviz.devices import SimulatedDevice, simulated_device
from memviz.errors import InputError, OutOfMemoryError
from memviz.sim import CachingAllocator

from .export import dump_snapshot
from .load import validate_snapshot
from .ranks import SIMULATED_KEY, simulated_note

__all__ = ["COUNTED_EXTRA", "LEFT_OUT", "SIMULATED_KEY", "SimRecording", "simulated_note"]

LEFT_OUT = ("cuBLAS/cuDNN workspaces", "CUDA-only kernels and code paths", "side streams (one stream here)",
            "NCCL buffers and the CUDA context")
"""What a simulated recording cannot show (see the module docstring)."""

COUNTED_EXTRA = ("tensors the program makes on the CPU explicitly, which a GPU run keeps on the host",)
"""What a simulated recording may count that a GPU run would not."""


class _Capture(TorchDispatchMode):
    """Sees every aten op below autograd and hands each CPU output's storage to :meth:`SimRecording._track`, with the
    storages of the op's inputs (an output sharing one is a view or an in-place result, not a new storage)."""

    def __init__(self, recording: SimRecording) -> None:
        super().__init__()
        self.recording = recording

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No ``torch._dynamo.disable`` around :meth:`__torch_dispatch__` (torch >= 2.9 wraps it by default, and its
        first call imports dynamo: 2-4 s of each rank's start); nothing is compiled while recording."""
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        rec = self.recording
        rec._free_dead()
        out = func(*args, **(kwargs or {}))
        inputs = None
        for t in _dense_cpu_tensors(out):
            storage = t.untyped_storage()
            if id(storage) not in rec._live:
                if inputs is None:
                    inputs = {id(a.untyped_storage()) for a in _dense_cpu_tensors((args, kwargs))}
                if id(storage) in inputs:  # a view or in-place result of a tensor made before the recording
                    continue
            rec._track(storage, func)
        return out


def _dense_cpu_tensors(tree: Any) -> Iterator[torch.Tensor]:
    """The dense CPU tensors in ``tree``, a wrapper subclass (a ``DTensor``: FSDP2's parameters) by the tensors it
    wraps: the wrapper's own storage is not memory (the mode sees the op on the wrapper; the op on its local tensor
    runs below the mode)."""
    for t in tree_leaves(tree):
        if not isinstance(t, torch.Tensor):
            continue
        if is_traceable_wrapper_subclass(t):
            attrs, _ = t.__tensor_flatten__()
            yield from _dense_cpu_tensors([getattr(t, a) for a in attrs])
        elif t.device.type == "cpu" and t.layout == torch.strided:
            yield t


class SimRecording:
    """Record, on CPU, the device memory a program would use on a GPU (see the module docstring).

    Args:
        device: the simulated GPU: a preset (``"H200"``, ``"A100-80GB"``, ...), a size (``"24 GiB"``) or a
            :class:`~memviz.devices.SimulatedDevice` (default ``"H200"``).
        index: the device index the snapshot names (``cuda:index``: a rank's local rank; default 0).
        alloc_conf: allocator settings in ``PYTORCH_CUDA_ALLOC_CONF`` syntax (default ``""``).
        note: plain data kept in the snapshot's ``memviz_simulated`` entry (e.g. ``{"rank": 1}``).

    Use :meth:`start` / :meth:`stop` (or ``with``) around the code to record, as ``_record_memory_history`` is;
    one recording per process and thread at a time. An allocation the simulated device cannot serve raises
    ``torch.OutOfMemoryError`` in the program, at the op, with the simulator's message (as on the GPU).

    Raises:
        InputError: an unknown device, an index outside the simulated node, a bad ``alloc_conf``.
    """

    def __init__(self, device: str | int | SimulatedDevice = "H200", *, index: int = 0, alloc_conf: str = "",
                 note: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.device = dataclasses.replace(simulated_device(device), index=index)
        self.allocator = CachingAllocator(self.device.total_memory_bytes, alloc_conf=alloc_conf,
                                          device_name=f"GPU {index}", clock=_now_us)  # fmt: skip
        self.note = dict(note or {})
        self._live: dict[int, tuple[weakref.ref, int, int]] = {}  # id(storage) -> (weak ref, address, bytes)
        self._dead: collections.deque[int] = collections.deque()  # ids of storages gone since the last op
        self._mode: _Capture | None = None
        self._resize_: Any = None  # torch's UntypedStorage.resize_, put back by stop()
        self.ops = collections.Counter()  # aten op -> storages it made (what the recording saw)
        self._lock = threading.RLock()  # resize_ may come from another thread (the mode itself sees only this one)

    # -- recording ------------------------------------------------------------------------------------------------

    def start(self) -> SimRecording:
        """Start recording (``torch.cuda.memory._record_memory_history()``)."""
        if self._mode is not None:
            raise InputError("this SimRecording is already recording")
        self._mode = _Capture(self)
        self._mode.__enter__()
        resize = self._resize_ = torch.UntypedStorage.resize_
        recording = self

        def resize_(storage: torch.UntypedStorage, size: int) -> torch.UntypedStorage:
            result = resize(storage, size)
            if recording._mode is not None and storage.device.type == "cpu":
                recording._free_dead()
                recording._track(storage, "UntypedStorage.resize_")
            return result

        torch.UntypedStorage.resize_ = resize_  # as torch's FSDPMemTracker does: no aten op sees resize_
        return self

    def stop(self) -> None:
        """Stop recording (``_record_memory_history(enabled=None)``); storages that die later are not followed."""
        if self._mode is not None:
            mode, self._mode = self._mode, None
            torch.UntypedStorage.resize_ = self._resize_
            mode.__exit__(None, None, None)
        self._free_dead()

    def __enter__(self) -> SimRecording:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _track(self, storage: torch.UntypedStorage, op: object) -> None:
        """A storage an op returned or ``resize_`` changed: a new one is a ``malloc`` of its bytes; one whose size
        changed (``resize_``, an ``out=`` tensor grown) gives its block back and gets one of the new size, as the
        CUDA caching allocator does for a CUDA storage (FSDP2 frees each unsharded parameter with ``resize_(0)``
        after use and gets it back with ``resize_(n)``). Storages of 0 bytes hold no block, as on the GPU."""
        with self._lock:
            self._track_locked(storage, op)

    def _track_locked(self, storage: torch.UntypedStorage, op: object) -> None:
        key, nbytes = id(storage), storage.nbytes()
        entry = self._live.get(key)
        if entry is not None:
            if entry[0]() is storage and entry[2] == nbytes:
                return
            del self._live[key]
            self.allocator.free(entry[1])  # resized; or dead, and its id already reused, before _free_dead ran
            if entry[0]() is not storage:
                entry = None
        if not nbytes:
            return
        try:
            address = self.allocator.malloc(nbytes)
        except OutOfMemoryError as error:
            raise torch.OutOfMemoryError(f"{error} (simulated {self.device.name}, memviz.snapshots.SimRecording)") \
                from None
        ref = entry[0] if entry is not None else weakref.ref(storage, lambda _, key=key: self._dead.append(key))
        self._live[key] = (ref, address, nbytes)
        self.ops[str(op)] += 1

    def _free_dead(self) -> None:
        """Free the storages that died since the last op (weak reference callbacks only queue: one may run inside
        the allocator, or on another thread)."""
        with self._lock:
            while self._dead:
                key = self._dead.popleft()
                entry = self._live.get(key)
                if entry is not None and entry[0]() is None:  # not a newer storage that took the dead one's id
                    del self._live[key]
                    self.allocator.free(entry[1])

    # -- reading --------------------------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """``torch.cuda.memory._snapshot()`` of the simulated device now, with its ``memviz_simulated`` note."""
        self._free_dead()
        with self._lock:
            snap = self.allocator.snapshot()
        index = self.device.index
        for segment in snap["segments"]:
            segment["device"] = index
        snap["device_traces"] = [[] for _ in range(index)] + snap["device_traces"]
        snap[SIMULATED_KEY] = {
            "device": self.device.name, "total_memory_bytes": self.device.total_memory_bytes, "index": index,
            "source": "CPU tensor storages made by aten ops, replayed through memviz.sim's caching allocator",
            "left_out": list(LEFT_OUT), "counted_extra": list(COUNTED_EXTRA), "torch": str(torch.__version__),
            **self.note,
        }  # fmt: skip
        return validate_snapshot(snap, name="SimRecording.snapshot()")

    def dump_snapshot(self, path: str | os.PathLike[str] | IO[bytes]) -> None:
        """Write :meth:`snapshot` as ``torch.cuda.memory._dump_snapshot(path)`` does (a plain-data pickle)."""
        dump_snapshot(self.snapshot(), path)


def _now_us() -> int:
    """Wall-clock microseconds since the epoch: the ``time_us`` of torch's trace entries, comparable across ranks."""
    return time.time_ns() // 1000

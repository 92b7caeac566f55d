"""The state of one prediction: the simulated allocator, the log, the live storages, where the program is.

A :class:`Session` is what the tracer's modes and hooks update while the program runs, and the
:class:`memviz.predictor.device.DeviceMemory` the rules see. :meth:`Session.result` turns it into the
immutable :class:`memviz.predictor.result.Prediction`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from memviz.errors import OutOfMemoryError
from memviz.sim import CachingAllocator, fraction_for_cap

from .device import Allocation
from .events import AllocatorCall
from .gpus import GpuArch
from .result import OutOfMemory, Prediction
from .rules import book_for
from .rules.autograd import current_node
from .streams import Streams
from .values import Values

__all__ = ["Session", "wrapped"]

_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})


def wrapped(t: torch.Tensor) -> list[torch.Tensor] | None:
    """The tensors a wrapper subclass (a DTensor) holds, or None for a tensor that holds its own storage."""
    flatten = getattr(type(t), "__tensor_flatten__", None)
    if flatten is None:
        return None
    names = flatten(t)[0]
    return [x for x in (getattr(t, n) for n in names) if isinstance(x, torch.Tensor)]

TORCH_DIR = os.path.dirname(torch.__file__)
OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
"""The predictor's own code: frames here are never the program's (memviz.examples' programs are)."""

Progress = Callable[[int, "int | None", str], None]


class Session:
    """One prediction's state; implements :class:`memviz.predictor.device.DeviceMemory` for the rules.

    Args:
        device: the simulated device (:class:`memviz.devices.SimulatedDevice`).
        arch: its architecture.
        cap_bytes: the allocator's limit, or None (the device less the CUDA context).
        alloc_conf: a ``PYTORCH_CUDA_ALLOC_CONF`` string.
        on_progress: called as ``on_progress(calls_so_far, None, phase)`` every 1024 allocations.
    """

    def __init__(self, device: Any, arch: GpuArch, cap_bytes: int | None, alloc_conf: str,
                 on_progress: Progress | None = None) -> None:
        self.device = device
        self.arch = arch
        self.cap_bytes = cap_bytes
        self.alloc_conf = alloc_conf or ""
        total = device.total_memory_bytes
        context = min(arch.context_bytes, total // 4)
        self.allocator_args = (total, fraction_for_cap(cap_bytes, total), self.alloc_conf, context)
        self.allocator = self.new_allocator()
        self.calls: list[tuple] = []  # AllocatorCall's fields, category None: set by `categories` at the end
        self.categories: dict[int, str] = {}  # alloc index -> category, where known
        self.live: dict[int, tuple[Allocation, int]] = {}  # storage id -> (allocation, bytes)
        self._refs: dict[int, tuple[weakref.ref, int]] = {}
        self.producers: dict[int, int] = {}  # storage id -> sequence number of the backward node that made it
        self.gpu_depth = 0
        self.default_cuda = False  # the program called torch.set_default_device("cuda")
        self.phase = "setup"
        self.phase_marks: list[tuple[int, str]] = [(0, "setup")]
        self.module_stack: list[str] = []  # the modules whose forward is running, outermost first
        self.module_stack_ids: list[int] = []
        self.module_names: dict[int, str] = {}
        self.modules: dict[int, torch.nn.Module] = {}
        self.kept: set[tuple[str, str, int]] = set()  # (kind, thread, stream) of the workspaces kept for the process
        self.oom: OutOfMemory | None = None
        self.notes: dict[str, None] = {}  # what this prediction could not model, in the order met
        self.rules = book_for(arch, self.note)
        self.closed = False
        self.on_progress = on_progress
        self.emulation: Any = None  # memviz.predictor.autocast.CudaEmulation, while the tracer is installed
        self.redirect: Any = None  # memviz.predictor.redirect.Redirect, while the tracer is installed
        self.values = Values(self.is_device, self.note, self.user_line)
        self.streams = Streams(self.allocator, self.note)
        self.rank: int | None = None  # this prediction's rank, when it plays one of a distributed job
        self.world_size: int | None = None

    def new_allocator(self) -> CachingAllocator:
        """A fresh allocator like this session's (capacity, cap, config, context)."""
        total, fraction, conf, context = self.allocator_args
        return CachingAllocator(total, fraction, conf, context_bytes=context, device_name="GPU 0")

    # ---- what is on the device

    def is_device(self, t: torch.Tensor) -> bool:
        """Whether ``t`` stands for a device tensor: a meta tensor whose storage the session accounts, or a tensor
        subclass wrapping one (a DTensor's local shard)."""
        if type(t) in _PLAIN:
            return t.is_meta and id(t.untyped_storage()) in self.live
        inner = wrapped(t)
        if inner is not None:
            return any(self.is_device(x) for x in inner)
        return t.is_meta and id(t.untyped_storage()) in self.live

    def any_device(self, args: tuple, kwargs: dict) -> bool:
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor):
                if type(a) not in _PLAIN:
                    if self.is_device(a):
                        return True
                elif a.is_meta and id(a.untyped_storage()) in self.live:
                    return True
            elif isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor) and self.is_device(a[0]):
                return True
        return False

    @contextlib.contextmanager
    def on_device(self) -> Iterator[None]:
        """The block's ops run on the device: their new storages are allocations."""
        self.gpu_depth += 1
        try:
            yield
        finally:
            self.gpu_depth -= 1

    @contextlib.contextmanager
    def on_host(self) -> Iterator[None]:
        """The block's ops run on the host (inside device work): nothing it makes is an allocation."""
        depth, self.gpu_depth = self.gpu_depth, 0
        try:
            yield
        finally:
            self.gpu_depth = depth

    def note(self, text: str) -> None:
        """Record something this prediction does not model (shown in ``Prediction.notes``)."""
        self.notes.setdefault(text, None)

    # ---- where the program is

    def set_phase(self, phase: str) -> None:
        if phase != self.phase:
            self.phase = phase
            self.phase_marks.append((len(self.calls), phase))

    def user_line(self) -> str:
        """The innermost frame of the program's own code, as ``file:line (function)`` ("" if none)."""
        f = sys._getframe(2)
        while f is not None:
            name = f.f_code.co_filename
            if not (name.startswith(TORCH_DIR) or name.startswith(OWN_DIR) or name.startswith("<frozen")):
                return f"{name}:{f.f_lineno} ({f.f_code.co_name})"
            f = f.f_back
        return ""

    def where(self) -> str:
        """The module whose forward runs, or in backward the autograd node."""
        if self.phase == "backward":
            node = torch._C._current_autograd_node()
            if node is not None:
                return node.name()
        return self.module_stack[-1] if self.module_stack else ""

    # ---- allocator calls (DeviceMemory)

    def _call(self, action: str, nbytes: int, ptr: int, alloc_index: int, op: str, module: str, line: str,
              stream: int = 0) -> None:
        a = self.allocator
        self.calls.append((action, nbytes, ptr, alloc_index, op, module, line, self.phase, None,
                           a.memory_allocated(), a.memory_reserved(), stream))

    def malloc(self, nbytes: int, op: str, category: str | None = None) -> Allocation:
        """Allocate in the simulator on the current stream and log it; raise ``torch.OutOfMemoryError`` as CUDA
        would."""
        stream = self.streams.current
        try:
            ptr = self.allocator.malloc(nbytes, stream)
        except OutOfMemoryError as e:
            if self.oom is None:
                self.oom = OutOfMemory(nbytes, str(e), op, self.where(), self.user_line(), self.phase,
                                       len(self.calls))
            raise torch.OutOfMemoryError(str(e)) from None
        index = len(self.calls)
        self._call("alloc", nbytes, ptr, index, op, self.where(), self.user_line(), stream)
        if category is not None:
            self.categories[index] = category
        if self.on_progress is not None and not index & 1023:
            self.on_progress(index, None, self.phase)
        return Allocation(ptr, index)

    def try_malloc(self, nbytes: int, op: str, category: str | None = None) -> Allocation | None:
        """:meth:`malloc`, or None when it does not fit (the attempt has still released the cache, as on the GPU)."""
        stream = self.streams.current
        try:
            ptr = self.allocator.malloc(nbytes, stream)
        except OutOfMemoryError:
            return None
        index = len(self.calls)
        self._call("alloc", nbytes, ptr, index, op, self.where(), self.user_line(), stream)
        if category is not None:
            self.categories[index] = category
        return Allocation(ptr, index)

    def free(self, allocation: Allocation, op: str = "") -> None:
        self.allocator.free(allocation.ptr)
        alloc = self.calls[allocation.index]
        self._call("free", alloc[1], allocation.ptr, allocation.index, op, "", "", alloc[11])

    def keep(self, kind: str, nbytes: int, op: str) -> None:
        """A library's workspace, once per (kind, thread, stream): the main thread and autograd's backward thread each
        have their own handle, and cuBLAS keeps a workspace per (handle, stream) (``CublasHandlePool.cpp``), made in
        that stream's pool."""
        key = (kind, "backward" if torch._C._current_graph_task_id() != -1 else "main", self.streams.current)
        if key not in self.kept and nbytes:
            self.malloc(nbytes, op, "workspaces")
            self.kept.add(key)

    def track(self, t: torch.Tensor, op: str) -> None:
        st = t.untyped_storage()
        key = id(st)
        entry = self.live.get(key)
        nbytes = st.nbytes()
        if entry is not None:
            if entry[1] == nbytes:
                return
            if entry[0] is not None:
                self.free(entry[0], op)  # resized: CUDA reallocates
            self.live[key] = (self.malloc(nbytes, op) if nbytes else None, nbytes)
            return
        self.live[key] = (self.malloc(nbytes, op) if nbytes else None, nbytes)
        ref = weakref.ref(st, self._storage_died)
        self._refs[id(ref)] = (ref, key)

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()`` in the program: logged, so that a replay of the log agrees."""
        self.allocator.empty_cache()
        self.categories[len(self.calls)] = "temporaries"
        self._call("empty_cache", 0, 0, len(self.calls), "empty_cache", self.where(), self.user_line())

    def resize(self, storage: torch.UntypedStorage, nbytes: int, op: str) -> None:
        """A device storage resized in place (``UntypedStorage.resize_``, FSDP2's way of freeing and re-allocating
        unsharded parameters): its allocation freed, and a new one of ``nbytes`` made on the current stream."""
        key = id(storage)
        entry = self.live.get(key)
        if entry is None:
            return
        if entry[0] is not None:
            self.free(entry[0], op)
        self.live[key] = (self.malloc(nbytes, op) if nbytes else None, nbytes)

    def data_ptr(self, storage: torch.UntypedStorage) -> int | None:
        """The simulated address of a device storage (0 when it holds no bytes), or None for any other storage."""
        entry = self.live.get(id(storage))
        if entry is None:
            return None
        return entry[0].ptr if entry[0] is not None else 0

    # ---- lifetimes

    def mark_producer(self, out: Any) -> None:
        """Remember which backward node made these outputs (:mod:`memviz.predictor.rules.autograd`)."""
        node = current_node()
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.is_meta:
                self.producers[id(t.untyped_storage())] = node

    def producer_of(self, t: torch.Tensor) -> int:
        """The sequence number of the backward node that made ``t``'s storage, or -1."""
        return self.producers.get(id(t.untyped_storage()), -1)

    def _storage_died(self, ref: weakref.ref) -> None:
        _, key = self._refs.pop(id(ref))
        self.producers.pop(key, None)
        entry = self.live.pop(key, None)
        if entry is not None and entry[0] is not None and not self.closed:
            self.free(entry[0])

    def forget(self, *tensors: torch.Tensor) -> None:
        """These outputs stay on the host on a GPU (e.g. flash attention's RNG seed): no device memory."""
        for t in tensors:
            entry = self.live.pop(id(t.untyped_storage()), None)
            if entry is not None and entry[0] is not None:
                self.free(entry[0])

    def tag(self, t: Any, category: str) -> None:
        """``t``'s storage is of ``category`` (the first tag wins); a DTensor's, its local shard's."""
        if isinstance(t, torch.Tensor) and type(t) not in _PLAIN:
            for inner in wrapped(t) or ():
                self.tag(inner, category)
            return
        if isinstance(t, torch.Tensor) and t.is_meta:
            entry = self.live.get(id(t.untyped_storage()))
            if entry is not None and entry[0] is not None:
                self.categories.setdefault(entry[0].index, category)

    # ---- CUDA's decisions

    def choose_sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, dropout_p: float,
                    enable_gqa: bool) -> str:
        return self.rules.choices["SDPA backend choice"](self.arch, q, k, v, mask, dropout_p, enable_gqa)

    # ---- the result

    def result(self, trace_seconds: float) -> Prediction:
        """The immutable prediction: the log with every call's category, the peaks, the notes."""
        self.closed = True
        categories = self.categories
        calls: list[AllocatorCall] = []
        for index, c in enumerate(self.calls):
            if c[0] == "free":
                category = calls[c[3]].category
            else:
                category = categories.get(index) or ("activations" if c[7] in ("forward", "setup") else "temporaries")
            calls.append(AllocatorCall(*c[:8], category, *c[9:]))
        return Prediction(calls=tuple(calls), phases=tuple(self.phase_marks), allocator=self.allocator,
                          new_allocator=self.new_allocator, device=self.device, arch=self.arch,
                          cap_bytes=self.cap_bytes, alloc_conf=self.alloc_conf, oom=self.oom,
                          notes=(*self.notes, *self.values.notes()), trace_seconds=trace_seconds,
                          world_size=self.world_size, rank=self.rank)

"""The lab: named tensors a learner allocates and frees, on a real GPU or the simulator.

>>> lab = Lab(backend="sim", device="T4", cap="2 GiB")
>>> lab.allocate("512 MiB", name="big").ok
True
>>> lab.allocate((100, 100), "float32", count=5000, name="small").detail.split(":")[0]
'5000 × small'
>>> lab.free_all().ok and lab.gc().ok and lab.empty_cache().reserved_bytes
0

Every action returns and records an :class:`~memviz.events.Event` with ``memory_stats()`` before and
after. An out-of-memory error is an event, not an exception: the lab keeps the message and the state,
and no traceback, frame or partial tensor stays behind to pin memory. Bad input (sizes, units, dtypes,
shapes, names, counts, configs) raises an :class:`~memviz.errors.InputError` (a ``ValueError``; a value of
the wrong type an :class:`~memviz.errors.InputTypeError`, also a ``TypeError``), ``KeyError`` for an
unknown name, and changes nothing.
"""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from memviz.backends import Backend, select_backend
from memviz.devices import SimulatedDevice
from memviz.errors import InputError, InputTypeError
from memviz.events import Event, OOMRecord
from memviz.fragmentation import Fragmentation, fragmentation
from memviz.lab_streams import DEFAULT_STREAM, StreamActions
from memviz.oom import OOMExplanation, explain_oom
from memviz.shapes import Request, read_size, size_request, tensor_request
from memviz.sim.replay import (
    BEGIN_POOL,
    EMPTY_CACHE,
    END_POOL,
    FREE,
    FREE_COMPLETED,
    FREE_REQUESTED,
    MALLOC,
    RELEASE_POOL,
    Op,
)
from memviz.units import format_bytes

__all__ = ["Lab", "LabTensor"]

MAX_COUNT = 1_000_000  # tensors in one allocate() call


@dataclass(frozen=True)
class LabTensor:
    """A tensor the lab holds: ``tensor`` is the ``torch.Tensor`` (or simulated tensor) itself; ``stream`` the
    name of the stream it was made on, ``pool`` the private pool it lives in (None: the device's own)."""

    name: str
    group: str | None
    request: Request
    tensor: Any
    op_key: int
    stream: str = DEFAULT_STREAM
    pool: str | None = None


@contextmanager
def _collector_paused(n: int) -> Iterator[None]:
    """Pause Python's cyclic garbage collector while the lab makes or drops ``n`` >= 1000 tensors.

    Each tensor is half a dozen tracked objects (the tensor, its block, entries, ops); at a million, the
    collector's passes over them take a third of the time and can find nothing: everything made here is
    reachable, and dropping references frees by reference counting. Collection resumes afterwards (a
    collector that was off stays off).
    """
    if n < 1000 or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class _FreeLog:
    """Logs ``Op("free", key)`` in ``ops`` when a tensor's memory really goes (its last reference dies); for a
    tensor ``record_stream`` made wait on another stream, ``Op("free_requested", key)``, and keeps it ``pending``
    until the lab sees the block freed (:meth:`Lab._finished_waits`).

    One weak reference a tensor and one callback for all: 0.9 µs a tensor to watch and release where
    ``weakref.finalize`` takes 1.4 µs, which shows at the lab's million tensors.
    """

    __slots__ = ("_gone", "ops", "pending", "waits", "watched")

    def __init__(self, ops: list[Op]) -> None:
        self.ops = ops
        self.watched: dict[int, tuple[weakref.ref, int]] = {}  # id(weak reference) -> (it, the op key)
        # op key -> (address, pool name) of a live tensor whose free will wait (record_stream), then of one freed
        # whose block waits on the stream's work
        self.waits: dict[int, tuple[int, str | None]] = {}
        self.pending: dict[int, tuple[int, str | None]] = {}
        self._gone = self._log  # one bound method, shared by every weak reference

    def watch(self, tensor: Any, key: int) -> None:
        ref = weakref.ref(tensor, self._gone)
        self.watched[id(ref)] = (ref, key)

    def _log(self, ref: weakref.ref) -> None:
        _, key = self.watched.pop(id(ref))
        wait = self.waits.pop(key, None) if self.waits else None
        if wait is None:
            self.ops.append(Op(FREE, key))
        else:
            self.ops.append(Op(FREE_REQUESTED, key))
            self.pending[key] = wait


class Lab(StreamActions):
    """Named tensors on one backend, and a log of every action; side streams, private pools and CUDA graphs
    by name too (:mod:`memviz.lab_streams`).

    Args:
        backend: ``"auto"`` (real GPU when CUDA is available, else the simulator), ``"cuda"``, ``"sim"``,
            or a :class:`~memviz.backends.Backend`.
        device: a device index (``1``, ``"cuda:1"``, ``torch.device("cuda", 1)``), or on the simulator a
            simulated GPU (preset name such as ``"A100-80GB"``, or a size such as ``"24 GiB"``). On a GPU the
            index picks the CUDA device (default: the current one); on the simulator, which GPU of a simulated
            8-GPU node the lab is, which names the device in snapshots and messages and changes nothing else
            (see :func:`memviz.backends.select_backend`). An index the machine lacks (``7`` on one GPU), ``-1``
            or ``"cuda:x"`` raises :class:`~memviz.errors.InputError`.
        cap: cap the allocator's cache (``"2 GiB"`` or bytes) with the per-process memory fraction, so
            that OOM and fragmentation show in seconds; None: no cap.
        alloc_conf: allocator settings, ``PYTORCH_CUDA_ALLOC_CONF`` syntax.
    """

    def __init__(
        self,
        backend: str | Backend = "auto",
        device: str | int | SimulatedDevice | Any | None = None,
        cap: int | str | None = None,
        alloc_conf: str | None = None,
    ) -> None:
        if isinstance(backend, Backend):
            if device is not None or cap is not None or alloc_conf is not None:
                raise ValueError("pass device, cap and alloc_conf to the backend, not to Lab, with a Backend")
            self.backend = backend
        else:
            self.backend = select_backend(backend, device, cap, alloc_conf)
        self._tensors: dict[str, LabTensor] = {}
        self._groups: dict[str, dict[str, None]] = {}  # group -> its members' names, in order (a dict: O(1) removal)
        self.events: list[Event] = []
        self.ops: list[Op] = []
        """Allocator ops in order, for what-if replays (:func:`memviz.sim.replay`), as torch's allocator saw them:
        ``Op("malloc", key, nbytes, stream)`` (key None for a request that ran out of memory), ``Op("free", key)``
        when the memory really goes (the last reference dies), ``Op("empty_cache")``; a free that
        ``record_stream`` made wait as ``Op("free_requested", key)``, then ``Op("free_completed", key)`` before the
        allocation that found its stream done (an ``empty_cache`` completes it itself); private pools and
        captures as the allocator calls they make (:mod:`memviz.lab_streams`). Replayed under the lab's own
        config, they give the lab's own numbers (:func:`memviz.oom.explain_oom` checks)."""
        self._free_log = _FreeLog(self.ops)
        self._next_key = 0
        self._auto_names = 0
        self._t0 = time.perf_counter()
        self._last_stats: Mapping[str, int] = dict(self.backend.memory_stats())
        self._init_streams()

    # -- reading ---------------------------------------------------------------------------------

    def describe(self) -> str:
        """Which backend runs, on which device, under which cap and config."""
        return self.backend.describe()

    def stats(self) -> Mapping[str, int]:
        """``memory_stats()`` now (one read; on a GPU it costs about 170 µs)."""
        return self.backend.memory_stats()

    def snapshot(self) -> dict:
        """``torch.cuda.memory._snapshot()`` now (segments and blocks)."""
        return self.backend.snapshot()

    def segments(self) -> list[dict]:
        """``snapshot()["segments"]`` now: the segments and their blocks (cheaper than a whole snapshot)."""
        return self.backend.segments()

    def readout(self) -> str:
        """One line: allocated, reserved, and the segments by pool, e.g. for a print after each step."""
        s = self.backend.memory_stats()
        return (
            f"allocated {format_bytes(s.get('allocated_bytes.all.current', 0))} · "
            f"reserved {format_bytes(s.get('reserved_bytes.all.current', 0))} · "
            f"segments {s.get('segment.all.current', 0)} "
            f"({s.get('segment.small_pool.current', 0)} small, {s.get('segment.large_pool.current', 0)} large)"
        )

    def segment_table(self, limit: int = 12) -> str:
        """The segment map as text, at most ``limit`` layouts (an int >= 1; see :func:`memviz.layout.segment_table`)."""
        from memviz.layout import segment_table

        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            error = InputError if isinstance(limit, int) and not isinstance(limit, bool) else InputTypeError
            raise error(f"segment_table(limit) is how many segment layouts to show: an int >= 1 such as 12, not "
                        f"{type(limit).__name__} {limit!r}")
        return segment_table(self.backend.segments(), limit)

    def fragmentation(self) -> Fragmentation:
        """Fragmentation metrics of the cache now."""
        return fragmentation(self.backend.segments(), self.backend.alloc_conf)

    def __getitem__(self, name: str) -> Any:
        """The tensor called ``name`` (a ``torch.Tensor`` on a GPU)."""
        return self._entry(name).tensor

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._tensors

    def __len__(self) -> int:
        return len(self._tensors)

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    @property
    def tensors(self) -> Mapping[str, LabTensor]:
        """The tensors the lab holds, by name (read-only view)."""
        return dict(self._tensors)

    @property
    def groups(self) -> Mapping[str, tuple[str, ...]]:
        """Names of the tensors of each group made by ``allocate(..., count=n)``."""
        return {g: tuple(names) for g, names in self._groups.items()}

    # -- actions -----------------------------------------------------------------------------------

    def allocate(
        self, size: int | str | tuple | list, dtype: object = None, *, count: int = 1, name: str | None = None,
        stream: str | None = None, pool: str | None = None,
    ) -> Event:
        """Allocate ``count`` tensors, each of ``size`` bytes or of shape ``size`` and ``dtype``.

        Args:
            size: bytes (``40_000``, ``"512 MiB"``, ``"1.5GB"``, ``"1,000"``: commas separate thousands), or
                a shape such as ``(2048, 4096, 4096)``, ``"(2048, 4096)"`` or ``"100x100"`` with ``dtype``
                (default float32). A string is read by :func:`memviz.shapes.read_size`, as in the dashboard.
            dtype: only with a shape: ``"float32"``, ``"bfloat16"``, ``torch.float16``, ...
            count: how many tensors (1 to 1,000,000). They are named ``name[0]``, ``name[1]``, ... and
                form the group ``name``.
            name: the tensor's name (or the group's); default ``t0``, ``t1``, ...
            stream: the name of the stream to allocate on (``with torch.cuda.stream(s):``): ``"default"``
                or one of :meth:`new_stream`; None: the default stream (during a capture, the capture stream).
            pool: the name of a private pool of :meth:`new_pool` to allocate into (``with
                torch.cuda.use_mem_pool(p):``); None: the device's own pools.

        Returns:
            The event; ``event.ok`` is False if memory ran out, and the tensors made before the failure
            stay allocated.

        Raises:
            ValueError: a bad size, unit, shape, dtype, count or name, an unknown stream or pool, a released
                pool; nothing is allocated.
        """
        request = self._request(size, dtype)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
            raise ValueError(f"count must be an int from 1 to {MAX_COUNT:,}, not {count!r}")
        names, group = self._new_names(name, count)
        where, stream_name, pool_name = self._placement(stream, pool)
        stream_id = self._streams[stream_name].id if self._streams else 0
        into = None if pool_name is None or self._capturing is not None else self._pool_key(pool_name)
        before = self._read_before()
        made: list[Any] = []
        oom_message = None
        finished: dict[int, list[int]] = {}  # request k of the call -> the waiting frees its malloc finished
        waits = self._free_log.pending
        with _collector_paused(count):
            with where:
                try:
                    for k in range(count):
                        made.append(self.backend.empty(request))
                        if waits and (done := self._finished_waits()):
                            finished[k] = done
                except self.backend.oom_errors as error:
                    oom_message = str(error)  # keep text only: the exception's traceback would pin frames
                    if waits and (done := self._finished_waits()):
                        finished[len(made)] = done
            if into is not None:  # use_mem_pool: beginAllocateToPool (a user more), then endAllocateToPool, releasePool
                self.ops.append(Op(BEGIN_POOL, into))
            for k, (tensor_name, tensor) in enumerate(zip(names, made, strict=False)):
                self.ops.extend(Op(FREE_COMPLETED, key) for key in finished.get(k, ()))
                self._keep(tensor_name, group, request, tensor, stream_name, pool_name, stream_id)
        if group is not None and made:
            self._groups[group] = dict.fromkeys(names[: len(made)])
        n = len(made)
        what = f"{count} × {group}" if group else names[0]
        detail = f"{what}: {request.arithmetic}"
        if count > 1:
            detail += f" each, {format_bytes(request.nbytes * count)} in all"
        if stream_name != DEFAULT_STREAM:
            detail += f" on stream {stream_name}"
        if pool_name is not None:
            detail += f" in pool {pool_name}"
        oom = None
        if oom_message is not None:
            self.ops.extend(Op(FREE_COMPLETED, key) for key in finished.get(n, ()))
            self.ops.append(Op(MALLOC, None, request.nbytes, stream_id))
            oom = OOMRecord(oom_message, request, n, self.fragmentation(), len(self.ops) - 1)
            detail += f" — out of memory after {n} of {count}" if count > 1 else " — out of memory"
        if into is not None:
            self.ops += [Op(END_POOL, into), Op(RELEASE_POOL, into)]
        del made
        return self._record("allocate", oom is None, tuple(names[:n]), request.nbytes * n, detail, before, oom)

    def free(self, *names: str | list[str] | tuple[str, ...]) -> Event:
        """Drop the lab's reference to tensors by name, or to whole groups by group name.

        Names come as arguments or in lists: ``free("a", "b")`` and ``free(["a", "b"])`` are the same.
        The memory goes back to the cache only when nothing else references the tensor (a variable of
        yours, a cycle, a traceback): the event's ``delta("allocated_bytes.all.current")`` shows it.

        Raises:
            KeyError: an unknown name; InputTypeError: a name that is not a str. Nothing is freed.
        """
        names = tuple(n for arg in names for n in (arg if isinstance(arg, list | tuple) else (arg,)))
        if not names:
            raise ValueError("free() needs at least one tensor or group name (or use free_all())")
        for name in names:
            if not isinstance(name, str):
                raise InputTypeError(f"free() takes tensor or group names (str), not {type(name).__name__} "
                                     f"{name!r}: e.g. lab.free('big') or lab.free(['a', 'b'])")
        targets: list[str] = []
        for name in names:
            if name in self._groups:
                targets.extend(self._groups[name])
            elif name in self._tensors:
                targets.append(name)
            else:
                raise KeyError(self._unknown(name))
        return self._drop(list(dict.fromkeys(targets)), "free " + ", ".join(names))

    def free_all(self) -> Event:
        """Drop the lab's references to every tensor it holds."""
        return self._drop(list(self._tensors), "free all")

    def gc(self) -> Event:
        """Run ``gc.collect()``: tensors kept alive only by reference cycles are freed."""
        before = self._read_before()
        found = gc.collect()
        return self._record("gc", True, (), 0, f"gc.collect() found {found} unreachable objects", before)

    def empty_cache(self) -> Event:
        """``torch.cuda.empty_cache()``: release every cached segment that holds no live tensor, on every stream,
        after waiting for pending frees; a private pool's segments only once nothing holds the pool.

        Raises:
            InputError: during a capture (:meth:`begin_capture`).
        """
        self._not_capturing("empty_cache()")
        before = self._read_before()
        self.backend.empty_cache()
        self.ops.append(Op(EMPTY_CACHE))
        self._free_log.pending.clear()  # it waited for every stream: the replay's empty_cache does too
        return self._record("empty_cache", True, (), 0, "empty_cache()", before)

    def reset_peak(self) -> Event:
        """``torch.cuda.reset_peak_memory_stats()``: every ``*.peak`` becomes its current value."""
        before = self._read_before()
        self.backend.reset_peak_memory_stats()
        return self._record("reset_peak", True, (), 0, "reset_peak_memory_stats()", before)

    def reset_stats(self) -> Event:
        """``reset_peak_memory_stats()`` and ``reset_accumulated_memory_stats()``."""
        before = self._read_before()
        self.backend.reset_peak_memory_stats()
        self.backend.reset_accumulated_memory_stats()
        return self._record("reset_stats", True, (), 0, "reset peak and accumulated stats", before)

    def observe(self, label: str = "outside the lab") -> Event | None:
        """Record an ``"observe"`` event if memory changed since the last event (plain notebook code).

        Returns the event, or None when nothing changed. The dashboard calls this after every cell.
        """
        if not isinstance(label, str):
            raise InputTypeError(f"observe(label) takes a str, not {type(label).__name__} {label!r}")
        now = dict(self.backend.memory_stats())
        if now == self._last_stats:
            return None
        return self._record("observe", True, (), 0, label, self._last_stats, stats_after=now)

    # -- what-if -----------------------------------------------------------------------------------

    def explain_oom(self, event: Event | None = None, configs: tuple[str, ...] | None = None) -> OOMExplanation:
        """Explain an OOM event (default: the last one): see :func:`memviz.oom.explain_oom`."""
        if event is None:
            ooms = [e for e in self.events if e.oom is not None]
            if not ooms:
                raise ValueError("no allocation has run out of memory in this lab yet")
            event = ooms[-1]
        if event.oom is None:
            raise ValueError(f"event #{event.index} ({event.action}) is not an OOM")
        backend = self.backend
        return explain_oom(event, self.ops, total_memory_bytes=backend.total_memory_bytes, cap_bytes=backend.cap_bytes,
                           alloc_conf=backend.alloc_conf, configs=configs)

    def _finished_waits(self) -> list[int]:
        """The op keys of waiting frees (``free_requested``) whose blocks the allocator freed since the last look
        (``process_events`` at the start of a malloc): read from the blocks' states when the count of waiting
        blocks says one may have gone."""
        pending = self._free_log.pending
        stats = self.backend.memory_stats()
        waiting = stats.get("active.all.current", 0) - stats.get("allocation.all.current", 0)
        if waiting == len(pending):
            return []
        still = {b["address"] for seg in self.backend.segments() for b in seg["blocks"]
                 if b["state"] == "active_pending_free"}
        done = [key for key, (address, _) in pending.items() if address not in still]
        for key in done:
            del pending[key]
        return done

    # -- internals -----------------------------------------------------------------------------------

    def _request(self, size: Any, dtype: object) -> Request:
        if isinstance(size, str):
            size = read_size(size)  # the dashboard's size box reads the same way
        if isinstance(size, tuple | list):
            return tensor_request(size, "float32" if dtype is None else dtype)
        if dtype is not None:
            raise ValueError(
                f"dtype {dtype!r} goes with a shape: allocate((n, m), {dtype!r}); a size such as "
                f"{size!r} is bytes and takes no dtype"
            )
        return size_request(size)

    def _new_names(self, name: str | None, count: int) -> tuple[list[str], str | None]:
        if name is None:
            while f"t{self._auto_names}" in self._tensors or f"t{self._auto_names}" in self._groups:
                self._auto_names += 1
            name = f"t{self._auto_names}"
            self._auto_names += 1
        if not isinstance(name, str) or not name.strip() or "[" in name or "," in name:
            raise ValueError(f"a name must be a non-empty string without '[' or ',', not {name!r}")
        if name in self._tensors or name in self._groups:
            raise ValueError(f"{name!r} is already in the lab; free it first or pick another name")
        if count == 1:
            return [name], None
        return [f"{name}[{i}]" for i in range(count)], name

    def _keep(self, name: str, group: str | None, request: Request, tensor: Any, stream: str = DEFAULT_STREAM,
              pool: str | None = None, stream_id: int = 0) -> None:
        key = self._next_key
        self._next_key += 1
        self.ops.append(Op(MALLOC, key, request.nbytes, stream_id))
        self._free_log.watch(tensor, key)
        self._tensors[name] = LabTensor(name, group, request, tensor, key, stream, pool)

    def _drop(self, names: list[str], label: str) -> Event:
        before = self._read_before()
        nbytes = 0
        with _collector_paused(len(names)):
            for name in names:
                entry = self._tensors.pop(name)
                nbytes += entry.request.nbytes
                if entry.group is not None:
                    members = self._groups[entry.group]
                    del members[name]
                    if not members:
                        del self._groups[entry.group]
                del entry
        return self._record("free", True, tuple(names), nbytes, f"{label} ({len(names)} tensors)", before)

    def _entry(self, name: str) -> LabTensor:
        if not isinstance(name, str):
            raise InputTypeError(f"a tensor's name is a str, not {type(name).__name__} {name!r}: e.g. lab['big']")
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(self._unknown(name)) from None

    def _unknown(self, name: object) -> str:
        known = list(self._groups) + [n for n in self._tensors if self._tensors[n].group is None]
        shown = ", ".join(map(repr, known[:10])) + (" ..." if len(known) > 10 else "")
        return f"no tensor or group named {name!r} in the lab; it holds: {shown or 'nothing'}"

    def _read_before(self) -> Mapping[str, int]:
        """Stats before an action; memory changed by plain code since the last event is logged first."""
        self.observe()
        return self._last_stats

    def _record(
        self,
        action: str,
        ok: bool,
        names: tuple[str, ...],
        nbytes: int,
        detail: str,
        before: Mapping[str, int],
        oom: OOMRecord | None = None,
        stats_after: Mapping[str, int] | None = None,
    ) -> Event:
        after = dict(self.backend.memory_stats()) if stats_after is None else stats_after
        event = Event(
            len(self.events), time.perf_counter() - self._t0, action, ok, names, nbytes, detail, before, after, oom
        )
        self.events.append(event)
        self._last_stats = after
        return event

    def __repr__(self) -> str:
        return f"<Lab on {self.describe()}; {len(self._tensors)} tensors, {len(self.events)} events>"

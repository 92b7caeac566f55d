"""The lab's side streams, private pools and CUDA graphs, by name: the part of :class:`~memviz.lab.Lab` that
goes beyond one stream and the device's own pools.

>>> from memviz.lab import Lab
>>> lab = Lab(backend="sim", device="H200")
>>> lab.new_stream("side").ok and lab.allocate("30 MiB", name="x", stream="side").ok
True
>>> lab.free("x").ok and lab.allocate("30 MiB", name="y").reserved_bytes >> 20  # not served by side's cache
60
>>> sorted({lab.place_of(seg) for seg in lab.segments()})
['default stream', 'stream side']

What each call does is torch's, on a GPU through torch's own objects (``torch.cuda.Stream``,
``Tensor.record_stream``, ``torch.cuda.MemPool`` / ``use_mem_pool``, ``torch.cuda.graph``), in the simulator
through :mod:`memviz.sim.graphs`. A stream finishes its queued work on its own, as on a GPU: only
:meth:`StreamActions.queue_work` keeps one busy, so a free that ``record_stream`` made wait stays pending
until that work ends or :meth:`~StreamActions.synchronize`.

Bad input (a stream, pool or graph name the lab does not know, one it knows already, a pool that was
released, a second capture at once, a synchronize or ``empty_cache`` inside a capture) raises an
:class:`~memviz.errors.InputError` and changes nothing.

The lab's op log (``lab.ops``, for what-if replays) records what each call does to the allocator, so that a
replay through :mod:`memviz.sim` reproduces it: each allocation's stream; a ``MemPool`` as
``begin_allocate_to_pool`` + ``end_allocate_to_pool`` (made, one user), an allocation into it between a
``begin_allocate_to_pool`` and an ``end_allocate_to_pool`` + ``release_pool`` (``use_mem_pool``), its deletion as
``release_pool`` + ``empty_cache`` of its id; a capture as ``empty_cache`` (``torch.cuda.graph``), the default
generator's two 8-byte tensors on the capture stream when the lab's torch registers it there and no live graph has
(:func:`memviz.sim.graphs.registers_generator_at_capture`), ``begin_allocate_to_pool`` of its pool, and
``end_allocate_to_pool`` at its end; a graph's deletion as the generator's frees (the last graph) and
``release_pool``; a free that ``record_stream`` made wait as ``free_requested``, and ``free_completed`` where the
allocator finished it. Graphs or streams used outside the lab are not in it: :func:`memviz.oom.explain_oom`
checks the replay against the lab's own numbers and says when they differ.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memviz.errors import InputError, InputTypeError
from memviz.sim.graphs import GENERATOR_TENSOR_BYTES, registers_generator_at_capture
from memviz.sim.replay import BEGIN_POOL, EMPTY_CACHE, END_POOL, FREE, MALLOC, RELEASE_POOL, Op

if TYPE_CHECKING:
    from memviz.events import Event

__all__ = ["DEFAULT_POOL", "DEFAULT_STREAM", "LabGraph", "LabPool", "LabStream", "StreamActions"]

DEFAULT_STREAM = "default"
DEFAULT_POOL = (0, 0)  # the device's own pools' id in snapshots (segment_pool_id)
CAPTURE_STREAM = "capture"  # torch.cuda.graph's one default capture stream, shared by every capture
MAX_WORK_SECONDS = 600.0
_NEW_GRAPH_POOL_KEY = 1 << 40  # op-log key of a new graph pool while its first capture runs: (2**40 + n, 0)


@dataclass
class LabStream:
    """A stream the lab knows: ``id`` is its ``cudaStream_t`` value, as snapshots show it."""

    name: str
    handle: Any
    id: int


@dataclass
class LabPool:
    """A private pool: a ``MemPool`` the lab made (``kind == "pool"``) or a CUDA graph's (``"graph pool"``).

    ``holders``: the names of what holds it now (the ``MemPool`` itself while not released, the graphs captured
    into it until deleted); with none, ``empty_cache()`` may release its free segments.
    """

    name: str
    kind: str
    id: tuple[int, int] | None  # None: a new graph pool while its first capture runs (torch says it at the end)
    holders: dict[str, None] = field(default_factory=dict)

    @property
    def held(self) -> bool:
        return bool(self.holders)


@dataclass
class LabGraph:
    """A CUDA graph the lab captured: its private pool's name, and whether it still exists."""

    name: str
    handle: Any  # None once deleted
    pool: str
    alive: bool = True


class StreamActions:
    """Streams, pools and graphs by name; mixed into :class:`~memviz.lab.Lab` (which provides ``backend``,
    ``_read_before``, ``_record``, ``_entry`` and ``_tensors``)."""

    backend: Any
    _tensors: dict
    ops: list[Op]
    _next_key: int
    _free_log: Any

    def _init_streams(self) -> None:
        self._streams: dict[str, LabStream] = {}  # filled on first use: a backend without streams never asks
        self._pools: dict[str, LabPool] = {}
        self._graphs: dict[str, LabGraph] = {}
        self._capturing: LabGraph | None = None
        self._pool_handles: dict[str, Any] = {}  # a MemPool's backend handle, while it is not released
        self._begin_op: int | None = None  # where the op log began the capture of a new graph pool
        self._generator_keys: tuple[int, int] | None = None  # op keys of the default generator's tensors, if live

    # -- reading ---------------------------------------------------------------------------------

    @property
    def streams(self) -> Mapping[str, int]:
        """Stream name -> ``cudaStream_t`` value: ``"default"`` (0), those of :meth:`new_stream`, and
        ``"capture"`` once a graph was captured."""
        self._known_streams()
        return {name: s.id for name, s in self._streams.items()}

    @property
    def pools(self) -> Mapping[str, LabPool]:
        """Private pools by name: ``MemPool`` s of :meth:`new_pool` and graphs' pools (named after the first graph
        captured into them)."""
        return dict(self._pools)

    @property
    def graphs(self) -> Mapping[str, LabGraph]:
        """The CUDA graphs captured in this lab, by name (deleted ones too, ``alive`` False)."""
        return dict(self._graphs)

    @property
    def capturing(self) -> str | None:
        """The name of the graph being captured now, or None."""
        return self._capturing.name if self._capturing is not None else None

    def place_of(self, segment: Mapping) -> str:
        """Where a segment of ``segments()`` belongs, for a reader: ``"default stream"``, ``"stream side"``,
        ``"pool p"``, ``"graph pool g1 · stream capture"``, with ``" (released)"`` for a pool nothing holds."""
        stream = segment.get("stream", 0)
        names = {s.id: name for name, s in self._streams.items()}
        stream_name = names.get(stream, f"{stream:#x}") if stream else DEFAULT_STREAM
        pool_id = tuple(segment.get("segment_pool_id", DEFAULT_POOL))
        if pool_id == DEFAULT_POOL:
            return "default stream" if stream_name == DEFAULT_STREAM else f"stream {stream_name}"
        pool = self._pool_by_id(pool_id)
        text = f"{pool.kind} {pool.name}" if pool is not None else f"pool {pool_id}"
        if pool is not None and not pool.held:
            text += " (released)"
        return text if stream_name == DEFAULT_STREAM else f"{text} · stream {stream_name}"

    def pool_is_held(self, pool_id: tuple[int, int] | list[int]) -> bool:
        """Whether ``empty_cache()`` must leave the pool's segments alone: a ``MemPool`` not yet released or a
        graph not yet deleted holds it. The device's own pools ``(0, 0)`` are not held; a private pool this
        lab did not make counts as held (its holders are unknown)."""
        pool_id = tuple(pool_id)
        if pool_id == DEFAULT_POOL:
            return False
        pool = self._pool_by_id(pool_id)
        return pool is None or pool.held

    # -- streams -----------------------------------------------------------------------------------

    def new_stream(self, name: str) -> Event:
        """Make a side stream called ``name`` (``torch.cuda.Stream()``)."""
        self._check_new_name(name, self._known_streams(), "stream")
        before = self._read_before()
        handle = self.backend.new_stream()
        self._streams[name] = LabStream(name, handle, self.backend.stream_id(handle))
        return self._record("new_stream", True, (), 0, f"new stream {name!r}", before)

    def record_stream(self, name: str | list[str] | tuple[str, ...], stream: str) -> Event:
        """``tensor.record_stream(stream)`` for the tensor (or every tensor of the group) ``name``: freeing it
        will wait until the work queued on ``stream`` so far is done.

        Raises:
            KeyError: an unknown tensor or group. InputError: an unknown stream. Nothing changes.
        """
        target = self._stream(stream)
        names = list(self._groups[name]) if isinstance(name, str) and name in self._groups else [name]
        entries = [self._entry(n) for n in names]
        before = self._read_before()
        for entry in entries:
            self.backend.record_stream(entry.tensor, target.handle)
            if target.name != entry.stream:  # torch ignores a use on the tensor's own stream
                self._free_log.waits[entry.op_key] = (_address(entry.tensor), entry.pool)
        what = name if len(names) == 1 else f"{len(names)} × {name}"
        return self._record("record_stream", True, tuple(names), 0, f"{what}.record_stream({stream})", before)

    def queue_work(self, stream: str, seconds: float = 30.0) -> Event:
        """Queue work that keeps ``stream`` busy for about ``seconds`` (default 30; a sleep kernel on a GPU):
        until then, frees that wait on ``stream`` stay pending. Ends early with :meth:`synchronize`."""
        target = self._stream(stream)
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise InputTypeError(f"queue_work(seconds) is a number of seconds such as 30, not {seconds!r}")
        if not 0 < seconds <= MAX_WORK_SECONDS:
            raise InputError(f"queue_work(seconds) must be above 0 and at most {MAX_WORK_SECONDS:g}, not {seconds!r}")
        self._not_capturing("queue_work()")
        before = self._read_before()
        self.backend.queue_work(target.handle, float(seconds))
        return self._record("queue_work", True, (), 0, f"{stream} busy for {seconds:g} s", before)

    def synchronize(self, stream: str | None = None) -> Event:
        """Wait for ``stream``'s queued work (None: every stream's, ``torch.cuda.synchronize()``). Frees that
        waited on it are finished by the next allocation or ``empty_cache()``, as in torch."""
        target = None if stream is None else self._stream(stream)
        self._not_capturing("synchronize()")
        before = self._read_before()
        self.backend.synchronize(None if target is None else target.handle)
        what = "torch.cuda.synchronize()" if stream is None else f"{stream}.synchronize()"
        return self._record("synchronize", True, (), 0, what, before)

    # -- private pools (MemPool) ---------------------------------------------------------------------------

    def new_pool(self, name: str) -> Event:
        """Make a private pool called ``name`` (``torch.cuda.MemPool()``); ``allocate(..., pool=name)`` uses it."""
        self._check_new_name(name, {**self._graphs, **self._pools}, "graph or pool")
        self._known_streams()
        before = self._read_before()
        handle = self.backend.new_pool()
        self._pools[name] = LabPool(name, "pool", self.backend.pool_id(handle), {name: None})
        self._pool_handles[name] = handle
        key = self._pool_key(name)
        self.ops += [Op(BEGIN_POOL, key), Op(END_POOL, key)]  # MemPool(): the pool, with one user (itself)
        return self._record("new_pool", True, (), 0, f"new pool {name!r} {self._pools[name].id}", before)

    def release_pool(self, name: str) -> Event:
        """Delete the ``MemPool`` called ``name`` (``del pool``): ``releasePool``, then ``emptyCache`` of its id.
        Its segments with no live tensor go back to the driver now (unless a graph captured into it still holds
        it); the others stay until their tensors are freed and ``empty_cache()`` runs.

        Raises:
            InputError: an unknown pool, a graph's pool, or one released already. Nothing changes.
        """
        pool = self._pool(name)
        if pool.kind != "pool" or name not in self._pool_handles:
            what = "a graph's pool: delete_graph() its graphs" if pool.kind != "pool" else "released already"
            raise InputError(f"pool {name!r} is {what}")
        self._not_capturing("release_pool()")
        before = self._read_before()
        self.backend.release_pool(self._pool_handles.pop(name))
        del pool.holders[name]
        key = self._pool_key(name)
        self.ops += [Op(RELEASE_POOL, key), Op(EMPTY_CACHE, key)]
        pending = self._free_log.pending  # emptyCache(id) waited for the pool's own frees; the replay's does too
        for op_key in [k for k, (_, in_pool) in pending.items() if in_pool == name]:
            del pending[op_key]
        return self._record("release_pool", True, (), 0, f"del pool {name!r}", before)

    # -- CUDA graphs -----------------------------------------------------------------------------------

    def begin_capture(self, name: str, pool: str | None = None) -> Event:
        """Start capturing the CUDA graph ``name`` (entering ``torch.cuda.graph(g, pool=...)``): synchronize,
        ``empty_cache()``, then every allocation goes to the capture stream and the graph's private pool until
        :meth:`end_capture`. ``pool``: None for a new pool, or the name of a graph (share its pool, as
        ``pool=g1.pool()`` does) or of a ``MemPool``. :meth:`capture` is the same as a ``with`` block.

        Raises:
            InputError: a capture underway, a graph name in use, an unknown or released pool. Nothing changes.
        """
        if self._capturing is not None:
            raise InputError(f"graph {self._capturing.name!r} is being captured; end_capture() it first")
        self._check_new_name(name, {**self._graphs, **self._pools}, "graph or pool")
        self._known_streams()
        shared = None if pool is None else self._shareable_pool(pool)
        before = self._read_before()
        handle = self.backend.begin_capture(None if shared is None else shared.id)
        try:
            if CAPTURE_STREAM not in self._streams:
                stream = self.backend.capture_stream(handle)
                self._streams[CAPTURE_STREAM] = LabStream(CAPTURE_STREAM, stream, self.backend.stream_id(stream))
        except BaseException:  # never leave a capture open behind an error
            self.backend.end_capture(handle)
            raise
        if shared is None:  # torch names a new graph pool only once the capture has ended (end_capture)
            shared = self._pools[name] = LabPool(name, "graph pool", None)
        self._log_capture_begin(shared)
        shared.holders[name] = None
        self._capturing = self._graphs[name] = LabGraph(name, handle, shared.name)
        where = "a new pool" if pool is None else f"{shared.kind} {shared.name}'s pool {shared.id}"
        return self._record("capture", True, (), 0, f"capture {name!r} into {where}", before)

    def end_capture(self) -> Event:
        """End the capture :meth:`begin_capture` started (leaving the ``torch.cuda.graph`` block)."""
        graph = self._capturing
        if graph is None:
            raise InputError("end_capture() without begin_capture(): no graph is being captured")
        before = self._read_before()
        self._capturing = None
        self.backend.end_capture(graph.handle)
        pool = self._pools[graph.pool]
        if pool.id is None:
            pool.id = self.backend.graph_pool_id(graph.handle)
            if self._begin_op is not None:  # the capture began its pool under a key of the lab's: now torch's id
                self.ops[self._begin_op] = Op(BEGIN_POOL, pool.id)
        self._begin_op = None
        self.ops.append(Op(END_POOL, pool.id))
        return self._record("end_capture", True, (), 0, f"capture of {graph.name!r} ends (pool {pool.id})", before)

    @contextmanager
    def capture(self, name: str, pool: str | None = None) -> Iterator[LabGraph]:
        """``with lab.capture("g1"):`` — :meth:`begin_capture` on entry, :meth:`end_capture` on exit (also when
        the block raises)."""
        self.begin_capture(name, pool)
        try:
            yield self._graphs[name]
        finally:
            self.end_capture()

    def replay(self, name: str) -> Event:
        """``graph.replay()``: runs the captured work and allocates nothing."""
        graph = self._graph(name)
        before = self._read_before()
        self.backend.replay_graph(graph.handle)
        return self._record("replay", True, (), 0, f"{name}.replay()", before)

    def delete_graph(self, name: str) -> Event:
        """Delete the graph ``name`` (``del g``: ``~CUDAGraph`` unregisters it from the default generator, whose two
        8-byte tensors go with the last graph, then ``reset()``): it lets go of its pool. Tensors allocated
        during its capture stay until freed; once nothing holds the pool, ``empty_cache()`` may release its
        segments that hold no live tensor."""
        graph = self._graph(name)
        self._not_capturing("delete_graph()")
        before = self._read_before()
        self.backend.delete_graph(graph.handle)
        graph.handle = None  # the last reference: on a GPU, ~CUDAGraph unregisters the generator only now
        graph.alive = False
        del self._pools[graph.pool].holders[name]
        if self._generator_keys is not None and not any(g.alive for g in self._graphs.values()):
            self.ops += [Op(FREE, key) for key in self._generator_keys]  # the last graph: its tensors go
            self._generator_keys = None
        self.ops.append(Op(RELEASE_POOL, self._pool_key(graph.pool)))
        return self._record("delete_graph", True, (), 0, f"del {name}", before)

    def let_go(self) -> list[Event]:
        """End a capture underway, delete every live graph and release every live ``MemPool``: what the
        dashboard's "new lab" does to the old lab on a GPU, where the next lab shares the device. Returns the
        events, in order."""
        events = [self.end_capture()] if self._capturing is not None else []
        events += [self.delete_graph(name) for name, graph in self._graphs.items() if graph.alive]
        events += [self.release_pool(name) for name in list(self._pool_handles)]
        return events

    # -- internals -----------------------------------------------------------------------------------

    def _pool_key(self, name: str) -> tuple[int, int]:
        """The key of pool ``name`` in the op log: its id (a new graph pool's is ``(2**40 + n, 0)`` until its first
        capture ends and torch gives it one)."""
        pool = self._pools[name]
        return pool.id if pool.id is not None else (_NEW_GRAPH_POOL_KEY + len(self._pools), 0)

    def _log_capture_begin(self, pool: LabPool) -> None:
        """The allocator calls entering ``torch.cuda.graph`` made (see the module docstring)."""
        self.ops.append(Op(EMPTY_CACHE))
        self._free_log.pending.clear()  # it synchronized and waited for every stream, as the replay's does
        if self._generator_keys is None and registers_generator_at_capture(self.backend.torch_version):
            self._generator_keys = (self._next_key, self._next_key + 1)
            self._next_key += 2
            stream = self._streams[CAPTURE_STREAM].id
            self.ops += [Op(MALLOC, key, GENERATOR_TENSOR_BYTES, stream) for key in self._generator_keys]
        if pool.id is None:
            self._begin_op = len(self.ops)
        self.ops.append(Op(BEGIN_POOL, self._pool_key(pool.name)))

    def _pool_by_id(self, pool_id: tuple[int, int]) -> LabPool | None:
        """The lab's pool of that id; during the first capture into a new graph pool (whose id torch gives only
        at the end), an id the lab does not know is that pool's."""
        pool = next((p for p in self._pools.values() if p.id == pool_id), None)
        if pool is None and self._capturing is not None and self._pools[self._capturing.pool].id is None:
            pool = self._pools[self._capturing.pool]
        return pool

    def _known_streams(self) -> dict[str, LabStream]:
        if not self._streams:
            handle = self.backend.default_stream()  # a backend without streams refuses here
            self._streams[DEFAULT_STREAM] = LabStream(DEFAULT_STREAM, handle, self.backend.stream_id(handle))
        return self._streams

    def _stream(self, name: object) -> LabStream:
        if not isinstance(name, str):
            raise InputTypeError(f"a stream is named by a str such as 'side' or 'default', not {name!r}")
        streams = self._known_streams()
        if name not in streams:
            raise InputError(f"no stream named {name!r} in the lab; it has {', '.join(map(repr, streams))} "
                             f"(make one with new_stream({name!r}))")
        return streams[name]

    def _pool(self, name: object) -> LabPool:
        if not isinstance(name, str):
            raise InputTypeError(f"a pool is named by a str such as 'p' (or a graph's name), not {name!r}")
        if name not in self._pools:
            known = ", ".join(map(repr, self._pools)) or "none"
            raise InputError(f"no pool named {name!r} in the lab (pools: {known}); make one with new_pool({name!r})")
        return self._pools[name]

    def _shareable_pool(self, name: object) -> LabPool:
        """The pool a capture may go into: a graph's (by the graph's name) or a ``MemPool``, still held."""
        if isinstance(name, str) and name in self._graphs:
            pool = self._pools[self._graphs[name].pool]
        else:
            pool = self._pool(name)
        if not pool.held:
            raise InputError(f"{pool.kind} {pool.name!r} is held by nothing any more (its graphs deleted, or the "
                             "pool released): it cannot be shared; capture into a new pool (pool=None)")
        return pool

    def _allocating_into(self, pool: str) -> LabPool:
        entry = self._pool(pool)
        if entry.kind != "pool":
            raise InputError(f"{pool!r} is a graph's pool: allocate into it inside lab.capture(..., pool={pool!r})")
        if pool not in self._pool_handles:
            raise InputError(f"pool {pool!r} was released: allocate into a live pool or make a new one")
        return entry

    def _graph(self, name: object) -> LabGraph:
        if not isinstance(name, str):
            raise InputTypeError(f"a graph is named by a str such as 'g1', not {name!r}")
        graph = self._graphs.get(name)
        if graph is None:
            known = ", ".join(repr(n) for n, g in self._graphs.items() if g.alive) or "none"
            raise InputError(f"no graph named {name!r} in the lab (live graphs: {known})")
        if not graph.alive:
            raise InputError(f"graph {name!r} was deleted already")
        if graph is self._capturing:
            raise InputError(f"graph {name!r} is being captured; end_capture() first")
        return graph

    def _not_capturing(self, what: str) -> None:
        if self._capturing is not None:
            raise InputError(f"{what} is not allowed while graph {self._capturing.name!r} is being captured "
                             "(CUDA forbids synchronizing during a capture); end_capture() first")

    @staticmethod
    def _check_new_name(name: object, taken: Mapping[str, Any], what: str) -> None:
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise InputError(f"a {what} name is a non-empty str without surrounding spaces, not {name!r}")
        if name in taken or (what == "stream" and name in (DEFAULT_STREAM, CAPTURE_STREAM)):
            raise InputError(f"there is a {what} named {name!r} already; pick another name")

    def _placement(self, stream: str | None, pool: str | None) -> tuple[AbstractContextManager, str, str | None]:
        """Check where an allocation goes; return the context to allocate in, the stream's name and the pool's."""
        if stream is None and pool is None and self._capturing is None:
            return nullcontext(), DEFAULT_STREAM, None
        if self._capturing is not None:
            if stream not in (None, CAPTURE_STREAM) or pool is not None:
                raise InputError(f"during the capture of {self._capturing.name!r} allocations go to the capture "
                                 "stream and the graph's pool: leave stream and pool out")
            return nullcontext(), CAPTURE_STREAM, self._capturing.pool
        target = self._stream(DEFAULT_STREAM if stream is None else stream)
        into = None if pool is None else self._allocating_into(pool)
        contexts = []
        if target.name != DEFAULT_STREAM:
            contexts.append(self.backend.on_stream(target.handle))
        if into is not None:
            contexts.append(self.backend.in_pool(self._pool_handles[into.name]))
        return _nested(contexts), target.name, None if into is None else into.name


def _address(tensor: Any) -> int:
    """A lab tensor's device address (``data_ptr()``: a ``torch.Tensor``'s or a simulated one's)."""
    return tensor.data_ptr()


@contextmanager
def _nested(contexts: list[AbstractContextManager]) -> Iterator[None]:
    if not contexts:
        yield
        return
    with contexts[0], _nested(contexts[1:]):
        yield

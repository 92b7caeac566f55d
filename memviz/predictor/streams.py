"""CUDA streams and events as a prediction sees them: each stream its own identity, its allocations its own pool.

The caching allocator keeps a cached block for the stream it was allocated on (``get_pool`` by stream): a block
freed on a side stream serves no request on the default stream, which makes a new segment. So a prediction needs
to know, at each allocation, which stream is current. ``torch.cuda.Stream()``, ``current_stream()``,
``default_stream()``, the ``torch.cuda.stream(s)`` context (and ``with s:``), ``set_stream`` are answered here
with :class:`SimStream` objects; each allocation goes to :meth:`memviz.sim.CachingAllocator.malloc` with the current
stream's id (:attr:`Streams.current`), as the real allocator receives ``cudaStream_t``.

Ordering between streams (``wait_stream``, ``wait_event``, ``Event.record``) changes nothing the allocator sees:
it decides from the order of requests and frees. ``Tensor.record_stream(s)`` does: the block's free then waits for
an event on ``s`` (:meth:`memviz.sim.CachingAllocator.record_stream`). When that event completes depends on the
GPU's timing, which a prediction does not have: it is taken to complete when the program next waits for the
stream on the host (``torch.cuda.synchronize()``, ``Stream.synchronize()``, ``Event.synchronize()``) — the most
memory such a free can hold, the GPU lagging the host, said in the notes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["SimEvent", "SimStream", "Streams"]

CUDA_DEVICE_TYPE = 1
"""``c10::DeviceType::CUDA``."""

DEFAULT_STREAM_ID = 0
"""The default stream's ``cudaStream_t`` (0, as snapshots show it)."""

RECORD_STREAM_NOTE = ("record_stream: a block used on another stream is freed when the program next synchronizes "
                      "with that stream (the GPU's timing is not predicted; the real free may come sooner)")


class SimStream(torch.Stream):
    """A CUDA stream of the simulated GPU: a ``torch.Stream`` of device type CUDA whose ``stream_id`` (and
    ``cuda_stream``) is the simulator's stream id, so ``Tensor.record_stream`` accepts it and streams compare and hash
    by id (FSDP2 keys dicts by stream). Its methods touch no CUDA runtime. The program makes them through
    :attr:`Streams.Stream` (what ``torch.cuda.Stream`` is during a prediction).
    """

    _streams: Streams
    cuda_stream: int

    @staticmethod
    def make(cls: type, streams: Streams, stream_id: int) -> SimStream:
        stream = torch.Stream.__new__(cls, stream_id=stream_id, device_index=0, device_type=CUDA_DEVICE_TYPE)
        stream._streams = streams
        stream.cuda_stream = stream_id
        return stream

    def wait_stream(self, stream: Any) -> None:
        """Ordering only: no allocator effect."""

    def wait_event(self, event: Any) -> None:
        """Ordering only: no allocator effect."""

    def record_event(self, event: SimEvent | None = None) -> SimEvent:
        event = event if event is not None else self._streams.Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        self._streams.synchronize(self.cuda_stream)

    def is_capturing(self) -> bool:
        return False

    def __enter__(self) -> SimStream:
        self._streams.push(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._streams.pop()

    def __repr__(self) -> str:
        return f"<simulated CUDA stream {self.cuda_stream}>"


class SimEvent:
    """A CUDA event: remembers the stream it was recorded on (synchronizing it synchronizes that stream). The
    program makes them through :attr:`Streams.Event` (what ``torch.cuda.Event`` is during a prediction)."""

    _streams: Streams
    stream: SimStream | None = None

    def record(self, stream: SimStream | None = None) -> SimEvent:
        self.stream = stream if stream is not None else self._streams.current_stream()
        return self

    def wait(self, stream: SimStream | None = None) -> None:
        """Ordering only: no allocator effect."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        if self.stream is not None:
            self._streams.synchronize(self.stream.cuda_stream)

    def elapsed_time(self, end: Any) -> float:
        return 0.0


class Streams:
    """The streams of one prediction and which is current; ``allocator`` is the session's simulated allocator.

    Ids are 0 for the default stream, then 1, 2, ... in the order the program makes streams.
    """

    def __init__(self, allocator: Any, note: Any) -> None:
        self.allocator = allocator
        self._note = note
        self._next_id = DEFAULT_STREAM_ID
        self.made: list[SimStream] = []
        streams = self

        class Stream(SimStream):
            """``torch.cuda.Stream(device=None, priority=0)``: a new stream of the simulated GPU."""

            def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Stream:
                stream = SimStream.make(cls, streams, streams._take_id())
                streams.made.append(stream)
                return stream

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                pass

        class Event(SimEvent):
            """``torch.cuda.Event(...)``: an event of the simulated GPU."""

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                self._streams = streams
                self.stream = None

        self.Stream = Stream
        self.Event = Event
        self.default = SimStream.make(Stream, self, self._take_id())
        self._stack: list[SimStream] = [self.default]

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    @property
    def current(self) -> int:
        """The current stream's id: what an allocation now is made on."""
        return self._stack[-1].cuda_stream

    def current_stream(self, device: Any = None) -> SimStream:
        return self._stack[-1]

    def push(self, stream: Any) -> None:
        self._stack.append(stream if isinstance(stream, SimStream) else self._stack[-1])

    def pop(self) -> None:
        if len(self._stack) > 1:
            self._stack.pop()

    def set_stream(self, stream: Any) -> None:
        """``torch.cuda.set_stream(s)``: ``s`` becomes current (a ``stream()`` context restores the one before it)."""
        if isinstance(stream, SimStream):
            self._stack[-1] = stream

    @contextlib.contextmanager
    def context(self, stream: Any) -> Iterator[Any]:
        """``torch.cuda.stream(s)``: ``s`` is current in the block (None: no change)."""
        self.push(stream if stream is not None else self._stack[-1])
        try:
            yield stream
        finally:
            self.pop()

    def synchronize(self, stream_id: int | None = None) -> None:
        """The host waits for ``stream_id`` (None: the device): events recorded on it so far complete."""
        self.allocator.synchronize(stream_id)

    def record_stream(self, ptr: int, stream: Any) -> None:
        """``Tensor.record_stream(stream)`` of the allocation at ``ptr``."""
        if not isinstance(stream, SimStream) or not ptr:
            return
        block = self.allocator.live_block(ptr)
        if block is not None and block.segment.pool.stream != stream.cuda_stream:
            self._note(RECORD_STREAM_NOTE)
        self.allocator.record_stream(ptr, stream.cuda_stream)

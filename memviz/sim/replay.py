"""Replay a sequence of allocator ops: the one loop behind every what-if, benchmark and golden check.

An :class:`Op` is one call a program makes on the allocator: ``malloc`` (with the key the program
uses to free it later), ``free`` (of a key), ``empty_cache`` (of every pool, or of one private pool), or
``probe`` (a ``malloc`` that is freed at once: a recorded OOM request retried, to see whether it would
fit); the private-pool calls torch's graphs and ``MemPool`` make: ``begin_allocate_to_pool``,
``end_allocate_to_pool``, ``release_pool``; and ``set_allocator_settings`` (``_set_allocator_settings``).
:func:`replay` runs ops through any :class:`~memviz.sim.CachingAllocator` and maps keys to the addresses it
hands out, so a trace recorded on one allocator (real or simulated) replays on another whatever addresses
either uses.

This is the stable, public way to drive the simulator with a workload (``memviz.oom``,
``memviz.snapshots.whatif``, the predictor, ``benchmarks/bench_sim.py`` and the golden tests use it)::

    >>> from memviz.sim import CachingAllocator, Op, replay
    >>> ops = [Op("malloc", 0, 6 << 20), Op("malloc", 1, 6 << 20), Op("free", 0), Op("empty_cache")]
    >>> a = CachingAllocator(16 << 30)
    >>> outcome = replay(ops, a)
    >>> outcome.ooms, a.memory_reserved() >> 20
    (0, 20)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from memviz.errors import InputError, OutOfMemoryError, TorchAllocatorError

if TYPE_CHECKING:
    from .allocator import CachingAllocator

__all__ = ["BEGIN_POOL", "EMPTY_CACHE", "END_POOL", "FREE", "FREE_COMPLETED", "FREE_REQUESTED", "MALLOC", "OP_KINDS",
           "PROBE", "RELEASE_POOL", "REPLAY_WAIT_STREAM", "SET_SETTINGS", "Op", "ReplayOutcome", "replay"]

MALLOC, FREE, EMPTY_CACHE, PROBE = "malloc", "free", "empty_cache", "probe"
FREE_REQUESTED, FREE_COMPLETED = "free_requested", "free_completed"
BEGIN_POOL, END_POOL, RELEASE_POOL = "begin_allocate_to_pool", "end_allocate_to_pool", "release_pool"
SET_SETTINGS = "set_allocator_settings"
OP_KINDS = (MALLOC, FREE, EMPTY_CACHE, PROBE, FREE_REQUESTED, FREE_COMPLETED, BEGIN_POOL, END_POOL, RELEASE_POOL,
            SET_SETTINGS)
#: op kinds that are the allocator method of the same name, called with the op's ``key``
KEYED_CALLS = frozenset((BEGIN_POOL, END_POOL, RELEASE_POOL, SET_SETTINGS))
#: the stream a replayed ``free_requested`` is recorded on: the recording says that the free waited on
#: another stream's work, not on which
REPLAY_WAIT_STREAM = 1 << 62


class Op(NamedTuple):
    """One allocator call of a workload.

    Attributes:
        kind: ``"malloc"``, ``"free"``, ``"empty_cache"``, ``"probe"`` (:data:`OP_KINDS`), or a free that
            waited on other streams' events: ``"free_requested"`` (the tensor dies; its block stays active
            until) ``"free_completed"`` of the same key; or a private-pool call (key: the pool id):
            ``"begin_allocate_to_pool"`` (every malloc after it goes to that pool, which it makes or adds a
            user to), ``"end_allocate_to_pool"``, ``"release_pool"`` (drops one user); or
            ``"set_allocator_settings"`` (key: the settings string, as ``_set_allocator_settings`` takes it).
        key: names the allocation: a ``malloc``'s key is what a later ``free`` gives (None: the
            allocation is never freed by the workload, e.g. a request that ran out of memory). For
            ``empty_cache``: None (every pool, ``torch.cuda.empty_cache()``) or a private pool's id
            (``emptyCache(mempool_id)``, what deleting a ``MemPool`` runs); for the pool calls, the pool id.
        size_bytes: the request of a ``malloc`` or ``probe``, unrounded (0 for the other kinds).
        stream: the stream a ``malloc`` or ``probe`` runs on (default 0, the default stream; a recorded
            trace entry's ``stream``).

    A tuple, so ``kind, key, size, stream = op`` works and a list of ops costs no more than tuples.
    """

    kind: str
    key: int | tuple[int, int] | str | None = None
    size_bytes: int = 0
    stream: int = 0


@dataclass
class ReplayOutcome:
    """What :func:`replay` saw.

    Attributes:
        steps: ops replayed.
        ooms: ``malloc`` / ``probe`` ops that raised :class:`~memviz.sim.OutOfMemoryError`.
        oom_steps: their positions in the op sequence.
        last_ok: whether the last ``malloc`` / ``probe`` succeeded (True when there was none).
        live: key → address of the allocations still live at the end.
        failure: where torch's own allocator fails (:class:`~memviz.errors.TorchAllocatorError`'s message: a CUDA
            error, an internal assertion, undefined behaviour), the replay stopped there; None: it ran to the end.
        failure_step: the position of the op that failed (not counted in ``steps``), or None.
    """

    steps: int = 0
    ooms: int = 0
    oom_steps: list[int] = field(default_factory=list)
    last_ok: bool = True
    live: dict[int, int] = field(default_factory=dict)
    failure: str | None = None
    failure_step: int | None = None


def replay(ops: Iterable[Op], allocator: CachingAllocator,
           on_step: Callable[[int, Op, OutOfMemoryError | None], None] | None = None) -> ReplayOutcome:
    """Run ``ops`` through ``allocator`` in order and return what happened.

    A ``free`` of a key that is not live (never allocated, its ``malloc`` ran out of memory, or
    already freed) is skipped: the recorded program freed memory this allocator never gave it. An op where
    torch's own allocator fails (:class:`~memviz.errors.TorchAllocatorError`) ends the replay there, with
    ``failure`` set; ``on_step`` is not called for it.

    Args:
        ops: the workload, as :class:`Op` tuples (any iterable; it is read once).
        allocator: a :class:`~memviz.sim.CachingAllocator`; its state before the replay is kept.
        on_step: called after every op as ``on_step(step, op, oom)``: ``oom`` is the
            :class:`~memviz.sim.OutOfMemoryError` of a ``malloc`` or ``probe`` that ran out of memory
            (without its traceback, which would keep the replay's frame alive), else None (default:
            None). Read the allocator's state from there; an exception it raises stops the replay.

    Raises:
        InputError: an op of an unknown kind, or a pool call the allocator refuses (a pool not in use, one
            already allocated to); AllocatorConfigError: settings it refuses; the ops before it have run.

    Runtime complexity: one allocator call per op, plus O(1) bookkeeping.
    """
    out = ReplayOutcome()
    oom_steps = out.oom_steps
    waiting: dict[int, int] = {}  # key -> address of a free_requested still to complete
    step = -1
    try:
        step = _run(ops, allocator, on_step, out, waiting)
    except _Failed as failed:
        out.failure, out.failure_step, step = failed.message, failed.step, failed.step - 1
        out.last_ok = False
    out.steps = step + 1
    out.ooms = len(oom_steps)
    return out


class _Failed(Exception):
    """torch's allocator failed at op ``step``."""

    def __init__(self, step: int, message: str) -> None:
        super().__init__(message)
        self.step, self.message = step, message


def _run(ops: Iterable[Op], allocator: CachingAllocator,
         on_step: Callable[[int, Op, OutOfMemoryError | None], None] | None, out: ReplayOutcome,
         waiting: dict[int, int]) -> int:
    """:func:`replay`'s loop (one ``try`` around it: free while nothing raises); returns the last step run."""
    live = out.live
    oom_steps = out.oom_steps
    malloc, free, empty_cache = allocator.malloc, allocator.free, allocator.empty_cache
    last_ok = True
    oom: OutOfMemoryError | None = None
    step = -1
    try:
        for step, op in enumerate(ops):
            kind, key, size, stream = op
            if kind == "malloc":  # the kinds as literals, not the module constants: no global lookup per op
                try:
                    address = malloc(size, stream)
                except OutOfMemoryError as error:
                    oom, last_ok = error.with_traceback(None), False  # no traceback: it would pin this frame
                    oom_steps.append(step)
                else:
                    oom, last_ok = None, True
                    if key is not None:
                        live[key] = address
            elif kind == "free":
                oom = None
                address = live.pop(key, None)
                if address is not None:
                    free(address)
            elif kind == "empty_cache":
                oom = None
                if key is None:
                    empty_cache()
                else:
                    allocator.empty_pool_cache(key)
            elif kind == "free_requested":
                oom = None
                address = live.pop(key, None)
                if address is not None:
                    allocator.record_stream(address, REPLAY_WAIT_STREAM)
                    free(address)
                    waiting[key] = address
            elif kind == "free_completed":
                oom = None
                address = waiting.pop(key, None)
                if address is not None and allocator.is_pending_free(address):
                    allocator.complete_free(address)
            elif kind == "probe":
                try:
                    free(malloc(size, stream))
                except OutOfMemoryError as error:
                    oom, last_ok = error.with_traceback(None), False  # no traceback: it would pin this frame
                    oom_steps.append(step)
                else:
                    oom, last_ok = None, True
            elif kind in KEYED_CALLS:
                oom = None
                getattr(allocator, kind)(key)
            else:
                raise InputError(f"ops[{step}]: kind {kind!r} is not an op kind; use one of {', '.join(OP_KINDS)}")
            if on_step is not None:
                on_step(step, op, oom)
    except TorchAllocatorError as error:
        raise _Failed(step, str(error)) from None
    out.last_ok = last_ok
    return step


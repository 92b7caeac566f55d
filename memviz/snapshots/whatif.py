"""What if: replay a recorded job's allocations through :mod:`memviz.sim` under other allocator configs.

The recorded ``device_traces`` fix the program's requests: every ``alloc`` (unrounded size) and every
``free_completed``, in order. Replaying them through :class:`memviz.sim.CachingAllocator` with another
``PYTORCH_CUDA_ALLOC_CONF`` (or another device size or memory cap) shows what that allocator would
have reserved, whether it would have run out of memory, and how fragmented it would have left the
cache. Blocks that were live when recording started (a model's parameters, see
:class:`~memviz.snapshots.SnapshotHistory`) are allocated first, in address order.

:func:`check_fidelity` replays under the recorded config and compares with the recording, event by
event (reserved and allocated bytes) and at sampled events (the segments' sizes and block layouts):
the what-if numbers are only as good as that match. Where it fails, the recording cannot be replayed exactly,
and :func:`what_if` says why (:mod:`memviz.snapshots.verdict`: e.g. a private pool no snapshot names) instead
of replaying it under other configs.

The device is the recording's own unless one is given: its memory as the recording bounds it
(:mod:`memviz.snapshots.device`), or, where nothing bounds it, a device with no limit of its own whose address
space holds every expandable segment the replay makes. All sizes are bytes.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from memviz.errors import InputError, InputTypeError, SnapshotError
from memviz.sim import CachingAllocator, Op, OutOfMemoryError, fraction_for_cap, parse_alloc_conf
from memviz.sim import replay as replay_ops
from memviz.sim.constants import MiB
from memviz.sim.limits import MAX_DEVICE_BYTES, check_bytes, check_fraction
from memviz.sim.replay import PROBE
from memviz.tables import format_table

from .device import DeviceEstimate
from .history import TRACE_ACTION_CODES, SnapshotHistory
from .history_ops import compile_requests
from .progress import progress_bar
from .verdict import Verdict, verdict

__all__ = [
    "TABLE_HEADERS",
    "FidelityReport",
    "ReplayResult",
    "WhatIfReport",
    "check_fidelity",
    "check_replayable",
    "named_configs",
    "recorded_cells",
    "recorded_peaks",
    "replay",
    "what_if",
]

_REQUEST_CODES = tuple(TRACE_ACTION_CODES.index(a) for a in ("alloc", "free_completed", "oom"))

TABLE_HEADERS = ("config", "peak\nreserved", "peak\nallocated", "OOMs", "first\nOOM", "cudaMalloc", "cudaFree",
                 "retries", "frag@peak")  # fmt: skip
"""The columns of a what-if table, one row per replay (:meth:`ReplayResult.cells`); a header's lines split at
``\\n`` (two short lines keep the plain-text table within 100 columns). ``cudaMalloc`` counts segment
allocations (page maps under ``expandable_segments``), ``retries`` the mallocs that freed the whole cache and
tried again, ``frag@peak`` is ``(reserved - allocated) / reserved`` when reserved peaked."""


def _as_history(source: Any, progress: bool | None) -> SnapshotHistory:
    return source if isinstance(source, SnapshotHistory) else SnapshotHistory(source, progress=progress)


def check_replayable(history: SnapshotHistory) -> SnapshotHistory:
    """Return ``history`` if it has events to replay.

    Raises:
        SnapshotError: the snapshot has no ``device_traces`` (it was dumped without recording history).
    """
    if not history.events:
        raise SnapshotError("the snapshot has no device_traces to replay; record it with "
                            "torch.cuda.memory._record_memory_history() before running the job")
    return history


def recorded_peaks(history: SnapshotHistory) -> tuple[int, int]:
    """The recording's own peak reserved and peak allocated bytes (its state before the first event if none)."""
    tl = history.timeline
    return (max(tl.reserved_bytes, default=tl.initial["reserved_bytes"]),
            max(tl.allocated_bytes, default=tl.initial["allocated_bytes"]))  # fmt: skip


def _check_device(history: SnapshotHistory, device_total_bytes: int | None, cap_bytes: int | None,
                  memory_fraction: float | None) -> None:
    """Refuse a device size, cap or fraction :func:`replay` would refuse, before anything is replayed."""
    total = history.recorded_device.total_bytes if device_total_bytes is None else check_bytes(
        device_total_bytes, "device_total_bytes", low=1, high=MAX_DEVICE_BYTES,
        why="the simulator models devices of up to 16 TiB")
    _fraction(total, cap_bytes, memory_fraction)


def _fraction(device_total_bytes: int, cap_bytes: int | None, memory_fraction: float | None) -> float | None:
    """The memory fraction of a what-if device: from ``cap_bytes`` (exact, see :func:`fraction_for_cap`) or given."""
    if cap_bytes is not None and memory_fraction is not None:
        raise InputError("give cap_bytes or memory_fraction, not both")
    if cap_bytes is not None:
        cap_bytes = check_bytes(cap_bytes, "cap_bytes", low=1, high=device_total_bytes,
                                why="a cap lies between 1 byte and the device's size (device_total_bytes)")
        return fraction_for_cap(cap_bytes, device_total_bytes)
    return None if memory_fraction is None else check_fraction(memory_fraction, "memory_fraction")


@dataclass
class ReplayResult:
    """What one allocator config does with the recorded requests.

    Attributes (bytes unless stated):
        name: the label of this config in a :class:`WhatIfReport`.
        alloc_conf: the ``PYTORCH_CUDA_ALLOC_CONF`` string replayed.
        device_total_bytes: the simulated device's capacity.
        allowed_bytes: the memory-fraction cap the simulator enforced, or None.
        peak_reserved_bytes / peak_allocated_bytes: ``max_memory_reserved()`` / ``max_memory_allocated()``.
        final_reserved_bytes / final_allocated_bytes: at the end of the replay.
        num_ooms: allocations the simulator could not serve (recorded ``alloc``\\ s, and recorded
            ``oom`` requests retried).
        oom_event_indices: the trace indices of those events (the first is where the job would have died).
        recorded_ooms_avoided: indices of recorded ``oom`` events whose request this config served.
        num_device_alloc / num_device_free: cudaMalloc (or page map) / cudaFree (or unmap) calls.
        num_alloc_retries: mallocs that had to free the whole cache and retry.
        fragmentation: cached but unallocated share of reserved memory at the end,
            ``(reserved - allocated) / reserved`` (0.0 when nothing is reserved).
        fragmentation_at_peak: the same share at the moment of peak reserved.
        largest_free_block_bytes: the largest cached free block at the end.
        reserved_bytes / allocated_bytes: per-event totals (``array('q')``, aligned with the trace), or
            None if the replay ran with ``timeline=False``.
        seconds: wall time of the replay.
        allocator: the simulator after the replay (export it with
            :func:`~memviz.snapshots.dump_snapshot`).
        device: the recording's device as inferred (:class:`~memviz.snapshots.device.DeviceEstimate`) when no
            ``device_total_bytes`` was given, else None.
        verdict: whether the recording can be replayed exactly, when a fidelity check of it ran before (under
            its recorded device and no cap), else None (:func:`check_fidelity` tells).
        failure: where torch's own allocator would fail under this config (a CUDA error, an internal assertion, a
            pool it deleted with blocks in it: :class:`~memviz.errors.TorchAllocatorError`'s message), the replay
            stopped there and the numbers are those up to it; None: it ran to the end.
        failure_event: the trace index of the request that failed so (-1: one before the first event), or None.
    """

    name: str
    alloc_conf: str
    device_total_bytes: int
    allowed_bytes: int | None
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    final_reserved_bytes: int
    final_allocated_bytes: int
    num_ooms: int
    oom_event_indices: list[int]
    recorded_ooms_avoided: list[int]
    num_device_alloc: int
    num_device_free: int
    num_alloc_retries: int
    fragmentation: float
    fragmentation_at_peak: float
    largest_free_block_bytes: int
    reserved_bytes: array | None
    allocated_bytes: array | None
    seconds: float
    allocator: Any = field(repr=False)
    device: DeviceEstimate | None = None
    verdict: Verdict | None = None
    failure: str | None = None
    failure_event: int | None = None

    def summary(self) -> dict[str, Any]:
        """Return the scalar results as a flat dict (bytes; for tables and widgets)."""
        return {
            "name": self.name, "alloc_conf": self.alloc_conf,
            "peak_reserved_bytes": self.peak_reserved_bytes, "peak_allocated_bytes": self.peak_allocated_bytes,
            "final_reserved_bytes": self.final_reserved_bytes,
            "final_allocated_bytes": self.final_allocated_bytes, "num_ooms": self.num_ooms,
            "first_oom_event": self.oom_event_indices[0] if self.oom_event_indices else None,
            "recorded_ooms_avoided": len(self.recorded_ooms_avoided),
            "num_device_alloc": self.num_device_alloc, "num_device_free": self.num_device_free,
            "num_alloc_retries": self.num_alloc_retries, "fragmentation": self.fragmentation,
            "fragmentation_at_peak": self.fragmentation_at_peak,
            "largest_free_block_bytes": self.largest_free_block_bytes, "failure": self.failure,
            "failure_event": self.failure_event,
        }

    @property
    def label(self) -> str:
        """The row label in a table: the name, followed by the config when the name is not the config itself."""
        conf = self.alloc_conf or "default"
        return self.name if self.name == conf else f"{self.name}: {conf}"

    def cells(self) -> list[str]:
        """This replay's row of a what-if table, one string per :data:`TABLE_HEADERS` column (MiB, counts,
        percent)."""
        first = f"{self.oom_event_indices[0]:,}" if self.oom_event_indices else "-"
        if self.failure is not None:  # torch's allocator fails before (or instead of) an OOM
            first = f"torch error {self.failure_event:,}"
        return [self.label, f"{self.peak_reserved_bytes / MiB:.0f} MiB", f"{self.peak_allocated_bytes / MiB:.0f} MiB",
                str(self.num_ooms), first, str(self.num_device_alloc), str(self.num_device_free),
                str(self.num_alloc_retries), f"{100 * self.fragmentation_at_peak:.1f}%"]  # fmt: skip


def recorded_cells(peak_reserved_bytes: int, peak_allocated_bytes: int) -> list[str]:
    """The row of a what-if table that shows the recording's own peaks (bytes); the replay-only columns empty."""
    cells = ["(recorded)", f"{peak_reserved_bytes / MiB:.0f} MiB", f"{peak_allocated_bytes / MiB:.0f} MiB"]
    return cells + [""] * (len(TABLE_HEADERS) - len(cells))


def replay(
    source: Any,
    alloc_conf: str = "",
    *,
    name: str | None = None,
    device_total_bytes: int | None = None,
    cap_bytes: int | None = None,
    memory_fraction: float | None = None,
    context_bytes: int = 0,
    timeline: bool = True,
    record_history: bool = False,
    progress: bool | None = None,
    _probe: Any = None,
) -> ReplayResult:
    """Replay the recorded requests through ``CachingAllocator(…, alloc_conf)`` and measure the result.

    Args:
        source: a :class:`SnapshotHistory`, or anything :func:`load_snapshot` takes.
        alloc_conf: the ``PYTORCH_CUDA_ALLOC_CONF`` to try (default: "", torch's defaults).
        name: label for reports (default: ``alloc_conf`` or ``"default"``).
        device_total_bytes: simulated device capacity in bytes, at most 16 TiB (default: the recording's,
            ``source.recorded_device``: inferred from its expandable segments, else a device with no limit of its
            own and room for every expandable segment the replay makes).
        cap_bytes: cap the process at this many bytes, as ``set_per_process_memory_fraction(cap/total)``
            does (default: None).
        memory_fraction: or give the fraction itself (default: None, no cap).
        context_bytes: bytes held outside the cache on the device (default: 0; with no ``device_total_bytes``,
            what the recording's OOM shows, ``source.recorded_device.context_bytes``).
        timeline: keep per-event reserved/allocated arrays (default: True).
        record_history: let the simulator keep its own trace, for export (default: False, faster).
        progress: ``tqdm.auto`` bar; None shows one from 50,000 requests (default: None).

    Raises:
        InputTypeError / InputError: a size, cap, fraction or config of the wrong type or out of range (the
            message names it); AllocatorConfigError: ``alloc_conf`` is not one torch accepts.

    Runtime complexity: O(n) simulator calls for n recorded events (:func:`memviz.sim.replay`).
    """
    history = _as_history(source, progress)
    recorded = history.recorded_device if device_total_bytes is None else None
    total = recorded.total_bytes if recorded is not None else check_bytes(
        device_total_bytes, "device_total_bytes", low=1, high=MAX_DEVICE_BYTES,
        why="the simulator models devices of up to 16 TiB")
    fraction = _fraction(total, cap_bytes, memory_fraction)
    if not isinstance(alloc_conf, str):
        raise InputTypeError(f"alloc_conf must be a PYTORCH_CUDA_ALLOC_CONF string, not {type(alloc_conf).__name__}")
    if recorded is not None and not context_bytes:
        context_bytes = recorded.context_bytes
    sim = CachingAllocator(total, fraction, alloc_conf, context_bytes=context_bytes,
                           record_history=record_history)
    ops, where = compile_requests(history, sim.allowed_memory_bytes)
    n_events = len(history.events)
    reserved = array("q", bytes(8 * n_events)) if timeline else None
    allocated = array("q", bytes(8 * n_events)) if timeline else None
    avoided: list[int] = []
    mem_reserved, mem_allocated = sim.memory_reserved, sim.memory_allocated
    bar = progress_bar(len(ops), progress, f"replaying {name or alloc_conf or 'default'}")
    step = 4096
    peak = -1
    frag_at_peak = 0.0
    last_event = 0  # the next event whose timeline entry is still to fill
    prev_r = prev_a = 0  # the totals after the previous request

    def on_step(j: int, op: Op, oom: OutOfMemoryError | None) -> None:
        nonlocal peak, frag_at_peak, last_event, prev_r, prev_a
        if bar is not None and j % step == 0 and j:
            bar.update(step)
        if oom is None and op[0] == PROBE:
            avoided.append(where[j])
        r = sim.total_allocated_memory  # reserved_bytes.all.current
        if r > peak:
            peak = r
            frag_at_peak = (r - mem_allocated()) / r if r else 0.0
        i = where[j]
        if i < 0:
            return
        if reserved is not None and allocated is not None:
            for k in range(last_event, i):  # events between requests change nothing in the simulator
                reserved[k] = prev_r
                allocated[k] = prev_a
            prev_r = reserved[i] = r
            prev_a = allocated[i] = mem_allocated()
            last_event = i + 1
        if _probe is not None:
            _probe(i, sim)

    start = time.perf_counter()
    outcome = replay_ops(ops, sim, on_step)
    seconds = time.perf_counter() - start
    ooms = [where[j] for j in outcome.oom_steps]
    if bar is not None:
        bar.update(len(ops) - bar.n)
        bar.close()
    if timeline and reserved is not None and allocated is not None:
        r, a = mem_reserved(), mem_allocated()
        for k in range(last_event, n_events):
            reserved[k] = r
            allocated[k] = a
    stats = sim.memory_stats()
    final_r, final_a = stats["reserved_bytes.all.current"], stats["allocated_bytes.all.current"]
    largest_free = 0
    for seg in sim.segments():
        for b in seg["blocks"]:
            if b["state"] == "inactive" and b["size"] > largest_free:
                largest_free = b["size"]
    return ReplayResult(
        name=name or alloc_conf or "default",
        alloc_conf=alloc_conf,
        device_total_bytes=total,
        allowed_bytes=sim.allowed_memory_bytes,
        peak_reserved_bytes=stats["reserved_bytes.all.peak"],
        peak_allocated_bytes=stats["allocated_bytes.all.peak"],
        final_reserved_bytes=final_r,
        final_allocated_bytes=final_a,
        num_ooms=len(ooms),
        oom_event_indices=ooms,
        recorded_ooms_avoided=avoided,
        num_device_alloc=stats["num_device_alloc"],
        num_device_free=stats["num_device_free"],
        num_alloc_retries=stats["num_alloc_retries"],
        fragmentation=(final_r - final_a) / final_r if final_r else 0.0,
        fragmentation_at_peak=frag_at_peak,
        largest_free_block_bytes=largest_free,
        reserved_bytes=reserved,
        allocated_bytes=allocated,
        seconds=seconds,
        allocator=sim,
        device=recorded,
        verdict=_cached_verdict(history),
        failure=outcome.failure,
        failure_event=None if outcome.failure_step is None else where[outcome.failure_step],
    )


def _cached_verdict(history: SnapshotHistory) -> Verdict | None:
    """The verdict of a fidelity check already run on ``history`` under its recorded device and no cap."""
    report = history.verdicts.get((None, None, None))
    return None if report is None else report.verdict


# --------------------------------------------------------------------------------------------------
# Fidelity


def _signature(segments: Iterable[Mapping[str, Any]]) -> list[tuple]:
    """Segments without addresses: sorted (type, size, expandable, ((block size, state), …))."""
    return sorted(
        (s["segment_type"], s["total_size"], bool(s.get("is_expandable")),
         tuple((b["size"], b["state"]) for b in s["blocks"]))
        for s in segments
    )


@dataclass
class FidelityReport:
    """How well replaying under the recorded config reproduces the recording.

    Attributes:
        alloc_conf: the recorded config, as a ``PYTORCH_CUDA_ALLOC_CONF`` string.
        events_compared: events at which reserved and allocated bytes were compared: every request
            (``alloc``, ``free_completed``, ``oom``), right after it.
        reserved_matches / allocated_matches: how many of those agreed exactly.
        first_reserved_mismatch / first_allocated_mismatch: the first event index that disagreed, or None.
        states_compared / states_matching: sampled events at which the segments (sizes, block sizes
            and states; addresses differ by design) were compared, and how many matched.
        first_state_mismatch: the first sampled event whose segments differed, or None.
        final_state_matches: whether the segments after the whole replay are the recording's final ones
            (what follows the last request, such as an ``empty_cache()``, shows only there).
        recorded_peak_reserved_bytes / replayed_peak_reserved_bytes: the two peaks.
        result: the replay itself.
        verdict: whether the recording can be replayed exactly, and if not the reason and the remedy
            (:class:`~memviz.snapshots.verdict.Verdict`).
        notes: what the replay assumed that the recording does not say (the device's size, the torch version's
            capture rule).
        caveats: what the recording leaves open that a what-if under another config depends on, though the
            replay under the recorded config reproduces it (segments whose pool no snapshot names, releases that
            may have been an allocation's retries under a cap); :meth:`describe` ends with them.
    """

    alloc_conf: str
    events_compared: int
    reserved_matches: int
    allocated_matches: int
    first_reserved_mismatch: int | None
    first_allocated_mismatch: int | None
    states_compared: int
    states_matching: int
    first_state_mismatch: int | None
    final_state_matches: bool
    recorded_peak_reserved_bytes: int
    replayed_peak_reserved_bytes: int
    result: ReplayResult = field(repr=False)
    verdict: Verdict = field(default_factory=lambda: Verdict(True))
    notes: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)

    @property
    def replayable(self) -> bool:
        """Whether the recording can be replayed exactly (:attr:`exact`): what-ifs of it can be trusted."""
        return self.verdict.replayable

    @property
    def reason(self) -> str | None:
        """Why it cannot be replayed exactly (None when it can)."""
        return self.verdict.reason

    @property
    def remedy(self) -> str | None:
        """What would make it replayable (None when it is)."""
        return self.verdict.remedy

    @property
    def exact(self) -> bool:
        """True when every compared event, every sampled state and the final state matched."""
        return (self.reserved_matches == self.allocated_matches == self.events_compared
                and self.states_matching == self.states_compared and self.final_state_matches)

    def describe(self) -> str:
        """Return one sentence: does replaying under the recorded config reproduce the recording, and how many
        of the sampled segment states and of the requests' reserved and allocated bytes matched (each count
        with the first event that differed, if one did)."""

        def matched(what: str, ok: int, total: int, unit: str, first: int | None) -> str:
            where = "" if first is None else f" (first difference at event {first:,})"
            return f"{what} at {ok:,} of {total:,} {unit}{where}"

        outcome = "reproduces" if self.exact else "does not reproduce"
        final = "" if self.final_state_matches else "; the segments at the end differ"
        why = "" if self.verdict.replayable else f". It {self.verdict.describe()}"
        if self.verdict.replayable and self.caveats:
            why = ". Under other configs: " + "; ".join(self.caveats)
        return (f"replaying under the recorded config ({self.alloc_conf or 'default'}) {outcome} the recording: "
                + matched("segment states match", self.states_matching, self.states_compared, "sampled events",
                          self.first_state_mismatch) + ", "
                + matched("reserved bytes", self.reserved_matches, self.events_compared, "requests",
                          self.first_reserved_mismatch) + ", "
                + matched("allocated bytes", self.allocated_matches, self.events_compared, "requests",
                          self.first_allocated_mismatch) + final + why)  # fmt: skip


def check_fidelity(
    source: Any,
    *,
    device_total_bytes: int | None = None,
    cap_bytes: int | None = None,
    memory_fraction: float | None = None,
    samples: int = 24,
    progress: bool | None = None,
) -> FidelityReport:
    """Replay under the recorded config and compare with the recording (see :class:`FidelityReport`).

    Args:
        source: a :class:`SnapshotHistory`, or anything :func:`load_snapshot` takes.
        device_total_bytes, cap_bytes, memory_fraction: the simulated device, as for :func:`replay`.
        samples: how many evenly spaced requests (plus the last) to compare segment by segment
            (default: 24).
        progress: ``tqdm.auto`` bar (default: None, automatic).

    The report is kept on the history (``history.verdicts``, by device and cap): :func:`what_if` and
    :func:`replay` of the same history read its :attr:`~FidelityReport.verdict`.
    """
    history = _as_history(source, progress)
    key = (device_total_bytes, cap_bytes, memory_fraction)
    conf = history.settings.alloc_conf()
    tl = history.timeline
    requests = [i for i, c in enumerate(tl.action) if c in _REQUEST_CODES]
    samples = max(samples, 1)
    sample_set = {requests[(k * len(requests)) // samples] for k in range(samples)} if requests else set()
    if requests:
        sample_set.add(requests[-1])
    state = {"compared": 0, "matching": 0, "first": None}

    def probe(i: int, sim: Any) -> None:
        if i in sample_set:
            sample_set.discard(i)
            state["compared"] += 1
            if _signature(sim.segments()) == _signature(history.state_at(i)):
                state["matching"] += 1
            elif state["first"] is None:
                state["first"] = i

    result = replay(history, conf, name="recorded", device_total_bytes=device_total_bytes, cap_bytes=cap_bytes,
                    memory_fraction=memory_fraction, progress=progress, _probe=probe)
    assert result.reserved_bytes is not None and result.allocated_bytes is not None
    compared = r_ok = a_ok = 0
    first_r = first_a = None
    for i in requests:
        compared += 1
        if result.reserved_bytes[i] == tl.reserved_bytes[i]:
            r_ok += 1
        elif first_r is None:
            first_r = i
        if result.allocated_bytes[i] == tl.allocated_bytes[i]:
            a_ok += 1
        elif first_a is None:
            first_a = i
    report = FidelityReport(
        alloc_conf=conf,
        events_compared=compared,
        reserved_matches=r_ok,
        allocated_matches=a_ok,
        first_reserved_mismatch=first_r,
        first_allocated_mismatch=first_a,
        states_compared=state["compared"],
        states_matching=state["matching"],
        final_state_matches=_signature(result.allocator.segments()) == _signature(history.final_segments),
        first_state_mismatch=state["first"],
        recorded_peak_reserved_bytes=recorded_peaks(history)[0],
        replayed_peak_reserved_bytes=result.peak_reserved_bytes,
        result=result,
        notes=_notes(history, result),
        caveats=_caveats(history, capped=cap_bytes is not None or memory_fraction is not None),
    )
    firsts = [i for i in (first_r, first_a, state["first"]) if i is not None]
    report.verdict = verdict(history, result, exact=report.exact, first_event=min(firsts, default=None))
    history.verdicts[key] = report
    if key == (None, None, None):
        result.verdict = report.verdict
    return report


def _caveats(history: SnapshotHistory, *, capped: bool) -> list[str]:
    """What a what-if under another config depends on that the recording leaves open."""
    caveats = []
    unnamed = history.pools.by_neighbours
    if unnamed > 0:
        caveats.append(f"{unnamed} segment{'s' if unnamed > 1 else ''} gone before the snapshot "
                       f"{'have' if unnamed > 1 else 'has'} no recorded pool and {'were' if unnamed > 1 else 'was'} "
                       "replayed in the pool of the allocations around that the allocator's rules allow (the device's "
                       "own if none): a MemPool used and deleted before the snapshot can look the same under this "
                       "config and not under another (expandable segments give each pool its own); snapshots taken "
                       "while such a pool was alive (earlier_snapshots) settle it")
    retries = 0 if capped else _releases_before_new_segments(history)
    if retries:
        caveats.append(f"{retries} of its releases of cached segments come right before a new segment, as an "
                       "allocation's own release and retry under a cap (set_per_process_memory_fraction) does, and "
                       "as empty_cache() before an allocation does: replayed as empty_cache() calls (give the cap, "
                       "recorded_cap_bytes, if the run had one)")
    return caveats


def _notes(history: SnapshotHistory, result: ReplayResult) -> list[str]:
    """What the replay assumed that the recording does not say."""
    notes = [] if result.device is None else [result.device.note]
    captures = history.pools.captures
    if captures:
        version = history.torch_version or "not given, taken as torch 2.11's rule"
        first = captures[0]
        notes.append(f"{len(captures)} CUDA graph capture{'s' if len(captures) > 1 else ''} found by the default "
                     f"generator's registration (torch {version}: capture_begin allocates its two 8-byte tensors "
                     f"on the capture stream, here 0x{first.stream:x} at events {first.generator_events[0]:,} and "
                     f"{first.generator_events[1]:,}, before the capture's pool takes over)")
    return notes


def _releases_before_new_segments(history: SnapshotHistory) -> int:
    """How many runs of ``segment_free`` / ``segment_unmap`` entries the next memory event after is a new segment."""
    events = history.events
    count = 0
    k = 0
    n = len(events)
    while k < n:
        if events[k].get("action") not in ("segment_free", "segment_unmap"):
            k += 1
            continue
        while k < n and events[k].get("action") in ("segment_free", "segment_unmap", "free_completed", "snapshot",
                                                    "annotate"):
            k += 1
        if k < n and events[k].get("action") in ("segment_alloc", "segment_map", "oom"):
            count += 1
    return count


# --------------------------------------------------------------------------------------------------
# Side by side


@dataclass
class WhatIfReport:
    """Several configs replayed on the same recorded requests, plus the fidelity check.

    Attributes:
        results: one :class:`ReplayResult` per config, by name, in the order given; empty when the recording
            cannot be replayed exactly (:attr:`replayable`).
        fidelity: the recorded-config check (:func:`check_fidelity`, under the device and cap the recording ran
            with), or None if skipped.
        recorded_peak_reserved_bytes / recorded_peak_allocated_bytes: what the recording itself shows.
    """

    results: dict[str, ReplayResult]
    fidelity: FidelityReport | None
    recorded_peak_reserved_bytes: int
    recorded_peak_allocated_bytes: int

    @property
    def replayable(self) -> bool:
        """False when the fidelity check found that the recording cannot be replayed exactly: then no config was
        replayed, and :attr:`fidelity` says why (``fidelity.reason``, ``fidelity.remedy``)."""
        return self.fidelity is None or self.fidelity.replayable

    def rows(self) -> list[dict[str, Any]]:
        """Return :meth:`ReplayResult.summary` for every config, in order (numbers, for your own tables;
        :meth:`cells` is the table as strings)."""
        return [r.summary() for r in self.results.values()]

    def cells(self) -> list[list[str]]:
        """Return the table as strings: :data:`TABLE_HEADERS`, the recording's own peaks, then one row per
        config (:meth:`ReplayResult.cells`)."""
        recorded = recorded_cells(self.recorded_peak_reserved_bytes, self.recorded_peak_allocated_bytes)
        return [list(TABLE_HEADERS), recorded, *(r.cells() for r in self.results.values())]

    def table(self) -> str:
        """Return :meth:`cells` as plain text (:func:`~memviz.tables.format_table`), then the fidelity sentence
        (which says why, when the recording cannot be replayed exactly and the table has no replay)."""
        return format_table(self.cells(), footer=None if self.fidelity is None else self.fidelity.describe())


def named_configs(configs: Mapping[str, str] | Iterable[str]) -> dict[str, str]:
    """Return ``configs`` as a dict name → ``PYTORCH_CUDA_ALLOC_CONF`` string: a mapping as given, each string
    of a list named by itself (``""`` as ``"default"``).

    Raises:
        InputTypeError: ``configs`` is a single string (wrap it in a list), or a config is not a string.
    """
    if isinstance(configs, str):
        raise InputTypeError("configs must be a list of PYTORCH_CUDA_ALLOC_CONF strings (or a mapping name -> string), "
                             f"not the string {configs!r}: wrap it, configs=[{configs!r}]")
    named = dict(configs) if isinstance(configs, Mapping) else {c or "default": c for c in configs}
    for name, conf in named.items():
        if not isinstance(conf, str):
            raise InputTypeError(f"config {name!r} must be a PYTORCH_CUDA_ALLOC_CONF string, not {type(conf).__name__}")
    return named


def what_if(
    source: Any,
    configs: Mapping[str, str] | Iterable[str] = ("expandable_segments:True",),
    *,
    device_total_bytes: int | None = None,
    cap_bytes: int | None = None,
    memory_fraction: float | None = None,
    recorded_device_total_bytes: int | None = None,
    recorded_cap_bytes: int | None = None,
    check: bool = True,
    progress: bool | None = None,
) -> WhatIfReport:
    """Replay the recorded requests under each config and compare them side by side.

    First the fidelity check (``check=True``): the recorded config (from ``allocator_settings``) replayed on the
    device and cap the recording ran with, compared with the recording. If it fails, the recording cannot be
    replayed exactly and nothing else is replayed: the report's ``fidelity`` says why and what would help.
    Otherwise the recorded config is replayed as ``"recorded"`` on the what-if's device and cap (the check's own
    replay when they are the recording's), then every config in ``configs``.

    Args:
        source: a :class:`SnapshotHistory`, or anything :func:`load_snapshot` takes.
        configs: ``PYTORCH_CUDA_ALLOC_CONF`` strings, or a mapping name → string
            (default: ``("expandable_segments:True",)``).
        device_total_bytes, cap_bytes, memory_fraction: the simulated device, as for :func:`replay`.
        recorded_device_total_bytes, recorded_cap_bytes: the device and cap the recording ran with, for the
            check (default: None: the device the recording shows, no cap; give the cap when the recording ran
            into it).
        check: run :func:`check_fidelity` (default: True). With False, a check already run on the same history
            still applies.
        progress: ``tqdm.auto`` bars (default: None, automatic).

    Raises:
        SnapshotError: the snapshot has no ``device_traces`` to replay.
        InputTypeError / InputError: ``configs`` is a single string, or a device size, cap or fraction of the
            wrong type or out of range.

    >>> report = what_if("tests/data/snapshots/train_snapshot.pickle", progress=False)  # doctest: +SKIP
    >>> print(report.table())  # doctest: +SKIP
    """
    named = named_configs(configs)
    history = check_replayable(_as_history(source, progress))
    _check_device(history, device_total_bytes, cap_bytes, memory_fraction)
    _check_device(history, recorded_device_total_bytes, recorded_cap_bytes, None)
    for conf in named.values():
        parse_alloc_conf(conf)  # a config torch refuses is refused before any replay
    recorded_key = (recorded_device_total_bytes, recorded_cap_bytes, None)
    fidelity = history.verdicts.get(recorded_key)
    if fidelity is None and check:
        fidelity = check_fidelity(history, device_total_bytes=recorded_device_total_bytes,
                                  cap_bytes=recorded_cap_bytes, progress=progress)
    peak_reserved, peak_allocated = recorded_peaks(history)
    if fidelity is not None and not fidelity.replayable:
        return WhatIfReport(results={}, fidelity=fidelity, recorded_peak_reserved_bytes=peak_reserved,
                            recorded_peak_allocated_bytes=peak_allocated)
    device = {"device_total_bytes": device_total_bytes, "cap_bytes": cap_bytes,
              "memory_fraction": memory_fraction}
    results: dict[str, ReplayResult] = {}
    if fidelity is not None and (device_total_bytes, cap_bytes, memory_fraction) == recorded_key:
        results["recorded"] = fidelity.result
    else:
        results["recorded"] = replay(history, history.settings.alloc_conf(), name="recorded",
                                     progress=progress, **device)
    for label, conf in named.items():
        results[label] = replay(history, conf, name=label, progress=progress, **device)
    return WhatIfReport(results=results, fidelity=fidelity if check else None,
                        recorded_peak_reserved_bytes=peak_reserved,
                        recorded_peak_allocated_bytes=peak_allocated)  # fmt: skip

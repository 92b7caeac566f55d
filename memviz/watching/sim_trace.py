"""A simulated lab's own history, as a watch of the simulator sees it: the allocator's trace from the moment the
watch began, shaped like ``torch.cuda.memory._snapshot()`` (``memviz.sim`` records every alloc and free, with
no stacks, as ``_record_memory_history`` does without them)."""

from __future__ import annotations

from typing import Any

__all__ = ["sim_snapshot", "trace_position"]


def trace_position(lab: Any) -> int:
    """How many trace records the lab's simulator holds now: where a watch's part of its history begins."""
    return sum(1 for _ in lab.backend.allocator.trace_records())


def sim_snapshot(lab: Any, start: int, max_entries: int) -> dict[str, Any]:
    """The simulator's snapshot now, its trace from record ``start`` (:func:`trace_position`) on, at most the last
    ``max_entries`` events (the oldest dropped, as torch's ring does)."""
    from memviz.sim.snapshot import allocator_settings, build_trace

    allocator = lab.backend.allocator
    trace = build_trace(allocator.trace_records(start))[-max_entries:]
    return {"segments": allocator.segments(), "device_traces": [trace],
            "allocator_settings": allocator_settings(allocator.config), "external_annotations": []}  # fmt: skip

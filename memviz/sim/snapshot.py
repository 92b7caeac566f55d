"""Snapshot dicts shaped like ``torch.cuda.memory._snapshot()``, and the invariant check.

A snapshot lists segments sorted by address. A non-expandable segment is one ``cudaMalloc`` range;
an expandable segment is reported as one segment per contiguous *mapped* range, as torch does.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from typing import Any

from .blocks import Block, Segment
from .config import AllocatorConfig
from .constants import ROUNDUP_POWER2_INTERVALS

__all__ = ["allocator_settings", "build_segments", "build_snapshot", "build_trace"]

# roundup_power2_divisions' keys: each interval's start in MiB, "1" .. "32768"
_ROUNDUP_LABELS = [str(1 << k) for k in range(ROUNDUP_POWER2_INTERVALS)]


def _segment_runs(segments: Iterable[Segment]) -> list[tuple[Segment, list[Block]]]:
    """Return (segment, blocks) for every reported segment, in the order given: one per mapped run."""
    runs = []
    for seg in segments:
        run: list[Block] = []
        b = seg.head
        while b is not None:
            if b.mapped:
                run.append(b)
            elif run:
                runs.append((seg, run))
                run = []
            b = b.next
        if run:
            runs.append((seg, run))
    return runs


def build_segments(segments: Iterable[Segment], pending: Container[int] = ()) -> list[dict[str, Any]]:
    """Build ``_snapshot()["segments"]`` from the allocator's segments (``CachingAllocator.iter_segments()``);
    ``pending``: the addresses of frees waiting on events (their blocks are "active_pending_free")."""
    out = []
    for seg, blocks in _segment_runs(segments):
        bl = []
        allocated = active = requested = 0
        for b in blocks:
            state = ("inactive" if not b.allocated else "active_pending_free" if b.ptr in pending
                     else "active_allocated")
            bl.append({"address": b.ptr, "size": b.size, "requested_size": b.requested_size,
                       "state": state, "frames": []})
            if state == "active_allocated":
                allocated += b.size
            if state != "inactive":
                active += b.size
                requested += b.requested_size
        pool = seg.pool
        out.append({
            "device": 0,
            "address": blocks[0].ptr,
            "total_size": sum(b.size for b in blocks),
            "allocated_size": allocated,
            "active_size": active,
            "requested_size": requested,
            "stream": pool.stream,
            "segment_type": "small" if pool.is_small else "large",
            "segment_pool_id": pool.owner.id if pool.owner is not None else (0, 0),
            "is_expandable": seg.expandable,
            "frames": [],
            "blocks": bl,
        })
    return out


def build_trace(entries: Iterable[tuple[str, int, int, int, int | None]]) -> list[dict[str, Any]]:
    """Build one device's ``device_traces`` list from ``CachingAllocator.trace_records()``.

    Entries without a time are numbered 0, 1, ... in trace order (deterministic traces).
    """
    trace: list[dict[str, Any]] = []
    for action, addr, size, stream, time_us in entries:
        # one "free" entry stands for free_requested + free_completed (see CachingAllocator.free_block)
        for act in (("free_requested", "free_completed") if action == "free" else (action,)):
            d: dict[str, Any] = {"action": act}
            if act == "oom":
                d["device_free"] = addr
            else:
                d["addr"] = addr
            d.update(size=size, stream=stream, time_us=time_us if time_us is not None else len(trace),
                     compile_context="N/A", user_metadata="")
            trace.append(d)
    return trace


def allocator_settings(cfg: AllocatorConfig) -> dict[str, Any]:
    """Build ``_snapshot()["allocator_settings"]`` for a config, as torch 2.11 reports it."""
    return {
        "PYTORCH_CUDA_ALLOC_CONF": cfg.settings,
        "max_split_size": -1 if cfg.max_split_size >= 1 << 63 else cfg.max_split_size,
        "garbage_collection_threshold": cfg.garbage_collection_threshold,
        "expandable_segments": cfg.expandable_segments,
        "pinned_num_register_threads": cfg.other.get("pinned_num_register_threads", 1),
        "release_lock_on_cudamalloc": cfg.other.get("release_lock_on_cudamalloc", False),
        "pinned_use_cuda_host_register": cfg.other.get("pinned_use_cuda_host_register", False),
        "graph_capture_record_stream_reuse": cfg.other.get("graph_capture_record_stream_reuse", False),
        "roundup_power2_divisions": dict(zip(_ROUNDUP_LABELS, cfg.roundup_power2_divisions, strict=True)),
    }


def build_snapshot(segments: Iterable[Segment], entries: Iterable[tuple[str, int, int, int, int | None]],
                   cfg: AllocatorConfig, pending: Container[int] = ()) -> dict[str, Any]:
    """Build the ``_snapshot()`` dict: segments, device_traces, allocator_settings, external_annotations.

    The trace is read before the segments, as torch's ``snapshot()`` does."""
    trace = build_trace(entries)
    return {"segments": build_segments(segments, pending), "device_traces": [trace],
            "allocator_settings": allocator_settings(cfg), "external_annotations": []}

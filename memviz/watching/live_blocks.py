"""What was live at a moment of a recorded history: the largest tensors, grouped by where they were made.

At the peak of a leaking loop the answer is "33 blocks of 64 MiB, all made at ``forward (train.py:12)``":
grouping by (the allocation's innermost user frame, block size) turns a thousand blocks into the few lines a
reader needs. Blocks are the allocator's (rounded sizes, exact bytes); a block allocated before the recording
began, or on the simulator, has no stack, and says so.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memviz.snapshots.frames import frame_label, user_frames
from memviz.units import format_bytes

__all__ = ["NO_STACK", "LiveGroup", "live_groups"]

NO_STACK = "no stack recorded"
STACK_FRAMES = 6  # user frames kept per group, innermost first


@dataclass(frozen=True)
class LiveGroup:
    """Live blocks of one size made at one place.

    Attributes:
        where: the innermost user frame that allocated them (``"forward (train.py:12)"``), or :data:`NO_STACK`.
        size_bytes: each block's size (the allocator's rounding of the request).
        requested_bytes: the request of the first of them (what the program asked for).
        count: how many.
        total_bytes: ``count * size_bytes``.
        stack: the first block's user frames, innermost first (at most 6), as ``"function (file.py:line)"``.
    """

    where: str
    size_bytes: int
    requested_bytes: int
    count: int
    total_bytes: int
    stack: tuple[str, ...]

    def line(self) -> str:
        """``"33 × 64.00 MiB = 2.06 GiB  forward (train.py:12)"``."""
        return f"{self.count} × {format_bytes(self.size_bytes)} = {format_bytes(self.total_bytes)}  {self.where}"


def live_groups(segments: list[Mapping[str, Any]], top: int = 8) -> list[LiveGroup]:
    """The ``top`` largest groups of live (``active_allocated``) blocks in ``segments`` (a snapshot's, or
    :meth:`~memviz.snapshots.SnapshotHistory.state_at`'s), largest total first."""
    groups: dict[tuple[str, int], list] = {}
    for seg in segments:
        for block in seg["blocks"]:
            if block["state"] != "active_allocated":
                continue
            frames = block.get("frames")
            key = (frame_label(frames) or NO_STACK, block["size"])
            group = groups.get(key)
            if group is None:
                groups[key] = [block.get("requested_size", block["size"]), 1, frames]
            else:
                group[1] += 1
    made = [LiveGroup(where, size, requested, count, count * size, _stack(frames))
            for (where, size), (requested, count, frames) in groups.items()]  # fmt: skip
    made.sort(key=lambda g: (-g.total_bytes, g.where))
    return made[:top]


def _stack(frames: Any) -> tuple[str, ...]:
    return tuple(f"{f.get('name', '?')} ({os.path.basename(str(f['filename']))}:{f.get('line', 0)})"
                 for f in user_frames(frames)[:STACK_FRAMES])  # fmt: skip

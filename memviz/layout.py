"""Segments and blocks as text: the segment map in a form a notebook can print and nbval can check.

Segments with the same layout are counted once, and runs of equal blocks are shortened, so 99 small
segments of 51 tensors each print as one line. The order depends on layouts only, never on device
addresses, so a real GPU and the simulator print the same text for the same state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from memviz.units import format_bytes

__all__ = ["segment_table"]

_STATE_WORDS = {"active_allocated": "live", "inactive": "free", "active_pending_free": "pending"}


def _layout(segment: Mapping) -> tuple:
    blocks = tuple((b["size"], _STATE_WORDS.get(b["state"], b["state"])) for b in segment["blocks"])
    kind = segment.get("segment_type", "large") + (" expandable" if segment.get("is_expandable") else "")
    return kind, segment["total_size"], blocks


def _runs(blocks: tuple) -> str:
    parts: list[str] = []
    i = 0
    while i < len(blocks):
        j = i
        while j < len(blocks) and blocks[j] == blocks[i]:
            j += 1
        size, word = blocks[i]
        parts.append(f"[{format_bytes(size)} {word}]" + (f"×{j - i}" if j - i > 1 else ""))
        i = j
    return " ".join(parts)


def segment_table(segments: Iterable[Mapping] | Mapping, limit: int = 12) -> str:
    """One line per distinct segment layout: pool, segment size, how many such segments, and the blocks.

    Args:
        segments: ``_snapshot()["segments"]``, or the snapshot dict itself.
        limit: most layouts to print (the most common first); the rest are summed up in one line.
    """
    if isinstance(segments, Mapping):
        segments = segments["segments"]
    counts = Counter(_layout(s) for s in segments)
    if not counts:
        return "(no segments: nothing reserved)"
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    lines = [f"{kind:<17}{format_bytes(total):>11} ×{n:<4} {_runs(blocks)}" for (kind, total, blocks), n in
             ordered[:limit]]  # fmt: skip
    rest = ordered[limit:]
    if rest:
        lines.append(f"... and {sum(n for _, n in rest)} more segments in {len(rest)} other layouts")
    return "\n".join(lines)

"""The recorded allocator configuration: read ``_snapshot()["allocator_settings"]``, round sizes as it did.

History reconstruction needs two allocator rules to know how big a block was (trace events carry only
the requested size): ``round_size`` and ``should_split`` (allocator spec §3.1, §3.2, §4.2). They are
restated here so that :mod:`memviz.snapshots.history` works without :mod:`memviz.sim`. All sizes are
bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["RecordedSettings", "alloc_conf_from_settings", "settings_from_snapshot"]

MIN_BLOCK_SIZE = 512  # all sizes are rounded to at least 512 bytes (kMinBlockSize)
SMALL_SIZE = 1 << 20  # largest "small" allocation is 1 MiB (kSmallSize)
SMALL_BUFFER = 2 << 20  # small-pool segments are 2 MiB (kSmallBuffer)
LARGE_BUFFER = 20 << 20  # default large segment / expandable large page: 20 MiB (kLargeBuffer)
MiB = 1 << 20
SIZE_MAX = (1 << 64) - 1  # "unlimited" max_split_size
_INTERVALS = 16  # roundup_power2_divisions entries, keyed "1".."32768" (MiB)
_DIVISION_KEYS = tuple(str(1 << k) for k in range(_INTERVALS))


@dataclass(frozen=True)
class RecordedSettings:
    """The allocator options a snapshot was recorded under.

    Attributes (sizes in bytes):
        max_split_size: blocks at least this large are never split (``SIZE_MAX``: unlimited).
        roundup_power2_divisions: 16 entries, for the size intervals starting at 1, 2, 4 … 32768 MiB.
        garbage_collection_threshold: 0.0 when off.
        expandable_segments: whether segments grow by mapping pages.
        large_segment_size: large segment / expandable page size (default 20 MiB).
        max_non_split_rounding_size: how much an oversize cached block may exceed the request.
    """

    max_split_size: int = SIZE_MAX
    roundup_power2_divisions: tuple[int, ...] = (0,) * _INTERVALS
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    large_segment_size: int = LARGE_BUFFER
    max_non_split_rounding_size: int = LARGE_BUFFER

    def round_size(self, size: int) -> int:
        """Return the block size in bytes the allocator gives a request of ``size`` bytes (``round_size``)."""
        if size < MIN_BLOCK_SIZE:
            return MIN_BLOCK_SIZE
        index = min(max(0, size.bit_length() - 1 - 20), _INTERVALS - 1)
        divisions = self.roundup_power2_divisions[index]
        if divisions > 1 and size > MIN_BLOCK_SIZE * divisions:
            if size & (size - 1) == 0:
                return size
            floor2 = 1 << (size.bit_length() - 1)
            step = floor2 >> (divisions.bit_length() - 1)
            if step == 0:
                return 2 * floor2
            return -(-size // step) * step
        return -(-size // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE

    def should_split(self, block_size: int, size: int, *, small: bool, expandable: bool = False) -> bool:
        """Whether a free block of ``block_size`` bytes is split to serve a rounded ``size`` (``should_split``)."""
        remaining = block_size - size
        if small or expandable:
            return remaining >= MIN_BLOCK_SIZE
        return size < self.max_split_size and remaining > SMALL_SIZE

    def alloc_conf(self) -> str:
        """Return the ``PYTORCH_CUDA_ALLOC_CONF`` string that sets these options ('' for the defaults)."""
        parts = []
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        if self.max_split_size != SIZE_MAX:
            parts.append(f"max_split_size_mb:{self.max_split_size // MiB}")
        if self.garbage_collection_threshold > 0:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold:g}")
        divs = self.roundup_power2_divisions
        if any(divs):
            if len(set(divs)) == 1:
                parts.append(f"roundup_power2_divisions:{divs[0]}")
            else:
                body = ",".join(f"{key}:{v}" for key, v in zip(_DIVISION_KEYS, divs, strict=True))
                parts.append(f"roundup_power2_divisions:[{body}]")
        if self.large_segment_size != LARGE_BUFFER:
            parts.append(f"large_segment_size_mb:{self.large_segment_size // MiB}")
        if self.max_non_split_rounding_size != self.large_segment_size:
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding_size // MiB}")
        return ",".join(parts)


def _conf_mb(conf: str, key: str) -> int | None:
    """Return ``key``'s value in MiB from a ``PYTORCH_CUDA_ALLOC_CONF`` string, or None."""
    tokens = conf.replace(" ", "").replace(",", " ").split()
    for tok in tokens:
        name, _, value = tok.partition(":")
        if name == key and value.isdigit():
            return int(value)
    return None


def _settings(allocator_settings: Mapping[str, Any]) -> RecordedSettings:
    s = allocator_settings
    max_split = s.get("max_split_size", -1)
    max_split = SIZE_MAX if not isinstance(max_split, int) or max_split < 0 else max_split
    raw = s.get("roundup_power2_divisions") or {}
    if isinstance(raw, Mapping):
        divs = tuple(int(raw.get(k, 0) or 0) for k in _DIVISION_KEYS)
    elif isinstance(raw, (list, tuple)) and len(raw) == _INTERVALS:
        divs = tuple(int(v) for v in raw)
    else:
        divs = (0,) * _INTERVALS
    conf = s.get("PYTORCH_CUDA_ALLOC_CONF") or ""
    conf = conf if isinstance(conf, str) else ""
    large_mb = _conf_mb(conf, "large_segment_size_mb")
    large = large_mb * MiB if large_mb else LARGE_BUFFER
    rounding_mb = _conf_mb(conf, "max_non_split_rounding_mb")
    return RecordedSettings(
        max_split_size=max_split,
        roundup_power2_divisions=divs,
        garbage_collection_threshold=float(s.get("garbage_collection_threshold", 0.0) or 0.0),
        expandable_segments=bool(s.get("expandable_segments", False)),
        large_segment_size=large,
        max_non_split_rounding_size=rounding_mb * MiB if rounding_mb else large,
    )


def settings_from_snapshot(snapshot: Mapping[str, Any]) -> RecordedSettings:
    """Return the :class:`RecordedSettings` of a loaded snapshot (defaults if it has no ``allocator_settings``).

    >>> settings_from_snapshot({"allocator_settings": {"expandable_segments": True}}).alloc_conf()
    'expandable_segments:True'
    """
    return _settings(snapshot.get("allocator_settings") or {})


def alloc_conf_from_settings(allocator_settings: Mapping[str, Any]) -> str:
    """Return the ``PYTORCH_CUDA_ALLOC_CONF`` string equivalent to a snapshot's ``allocator_settings``.

    >>> alloc_conf_from_settings({"max_split_size": 128 * 1024 * 1024, "expandable_segments": False})
    'max_split_size_mb:128'
    """
    return _settings(allocator_settings).alloc_conf()

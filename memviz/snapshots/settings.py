"""The recorded allocator configuration: read ``_snapshot()["allocator_settings"]``, round sizes as it did.

History reconstruction needs two allocator rules to know how big a block was (trace events carry only
the requested size): ``round_size`` and ``should_split`` (allocator spec §3.1, §3.2, §4.2). They come from
:mod:`memviz.sim.rules`, the simulator's own copy, applied to the recorded config. All sizes are bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from memviz.errors import AllocatorConfigError
from memviz.sim import rules
from memviz.sim.config import AllocatorConfig, parse_alloc_conf
from memviz.sim.constants import LARGE_BUFFER, ROUNDUP_POWER2_INTERVALS, SIZE_MAX, MiB

__all__ = ["RecordedSettings", "alloc_conf_from_settings", "settings_from_snapshot"]

# roundup_power2_divisions' keys in allocator_settings: each interval's start in MiB, "1" .. "32768"
_DIVISION_KEYS = tuple(str(1 << k) for k in range(ROUNDUP_POWER2_INTERVALS))


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
    roundup_power2_divisions: tuple[int, ...] = (0,) * ROUNDUP_POWER2_INTERVALS
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    large_segment_size: int = LARGE_BUFFER
    max_non_split_rounding_size: int = LARGE_BUFFER

    @cached_property
    def config(self) -> AllocatorConfig:
        """These options as the simulator's :class:`~memviz.sim.AllocatorConfig` (what the rules read)."""
        return AllocatorConfig(
            settings=self.alloc_conf(), max_split_size=self.max_split_size,
            max_non_split_rounding_size=self.max_non_split_rounding_size, large_segment_size=self.large_segment_size,
            roundup_power2_divisions=self.roundup_power2_divisions,
            garbage_collection_threshold=self.garbage_collection_threshold,
            expandable_segments=self.expandable_segments,
        )

    def round_size(self, size: int) -> int:
        """Return the block size in bytes the allocator gives a request of ``size`` bytes (``round_size``)."""
        return rules.round_size(size, self.config)

    def should_split(self, block_size: int, size: int, *, small: bool, expandable: bool = False) -> bool:
        """Whether a free block of ``block_size`` bytes is split to serve a rounded ``size`` (``should_split``)."""
        return rules.should_split(block_size, size, self.config, small=small, expandable=expandable)

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


def _settings(allocator_settings: Mapping[str, Any]) -> RecordedSettings:
    """Read ``allocator_settings``: its explicit keys, and what only the ``PYTORCH_CUDA_ALLOC_CONF`` string
    holds (``large_segment_size_mb``, ``max_non_split_rounding_mb``), parsed by the simulator's parser."""
    s = allocator_settings
    max_split = s.get("max_split_size", -1)
    max_split = SIZE_MAX if not isinstance(max_split, int) or max_split < 0 else max_split
    raw = s.get("roundup_power2_divisions") or {}
    if isinstance(raw, Mapping):
        divs = tuple(int(raw.get(k, 0) or 0) for k in _DIVISION_KEYS)
    elif isinstance(raw, (list, tuple)) and len(raw) == ROUNDUP_POWER2_INTERVALS:
        divs = tuple(int(v) for v in raw)
    else:
        divs = (0,) * ROUNDUP_POWER2_INTERVALS
    conf = s.get("PYTORCH_CUDA_ALLOC_CONF") or ""
    try:
        parsed = parse_alloc_conf(conf) if isinstance(conf, str) else AllocatorConfig()
    except AllocatorConfigError:
        parsed = AllocatorConfig()  # a string torch took but this torch version's parser does not: defaults
    return RecordedSettings(
        max_split_size=max_split,
        roundup_power2_divisions=divs,
        garbage_collection_threshold=float(s.get("garbage_collection_threshold", 0.0) or 0.0),
        expandable_segments=bool(s.get("expandable_segments", False)),
        large_segment_size=parsed.large_segment_size,
        max_non_split_rounding_size=parsed.max_non_split_rounding_size,
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

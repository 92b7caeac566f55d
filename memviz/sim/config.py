"""Parse ``PYTORCH_CUDA_ALLOC_CONF`` the way torch 2.11 does.

The string is split into tokens at ``, : [ ]`` (whitespace dropped, as ``ConfigTokenizer`` does),
then read as ``key:value`` pairs separated by commas. Every option torch 2.11 knows is accepted;
an unknown key or a malformed value raises :class:`AllocatorConfigError` naming the option, with
torch's own wording where torch has one. Numbers are what torch's ``std::stoull`` / ``std::stod`` read,
in full: ASCII digits (no other script's digits, no ``_``), a decimal point and exponent for fractions.
Options that do not change a single-stream program's stats (``pinned_*``, ``release_lock_on_cudamalloc``,
...) are validated and kept for ``allocator_settings`` only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from memviz.errors import AllocatorConfigError

from .constants import LARGE_BUFFER, MIN_LARGE_ALLOC, ROUNDUP_POWER2_INTERVALS, SIZE_MAX, MiB

__all__ = ["AllocatorConfig", "parse_alloc_conf", "tokenize"]

_BOOL_KEYS = (
    "expandable_segments",
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_use_background_threads",
    "graph_capture_record_stream_reuse",
)


# What torch's std::stoull / std::stod read in the C locale, whole: ASCII digits only. Python's int() and float()
# also take other scripts' digits ("٣", "²") and underscores ("0.6_0"), which torch reads differently or not
# at all, so a token must match these in full (torch would silently ignore trailing characters; refused here).
_SIZE_T = re.compile(r"[0-9]+", re.ASCII)
_DOUBLE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)


def _is_power_of_2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass(eq=True)
class AllocatorConfig:
    """The allocator options that a ``PYTORCH_CUDA_ALLOC_CONF`` string sets.

    Attributes (sizes in bytes):
        settings: the string as given (``allocator_settings["PYTORCH_CUDA_ALLOC_CONF"]``).
        max_split_size: blocks this large are never split (default: SIZE_MAX, i.e. unlimited).
        max_non_split_rounding_size: how much larger than an oversize request a reused cached
            block may be (default: large_segment_size, 20 MiB).
        large_segment_size: segment size for large requests under 10 MiB, and the large-pool page
            of expandable segments (default: 20 MiB; ``large_segment_size_mb``, torch 2.11+).
        roundup_power2_divisions: 16 entries, one per power-of-2 size interval from 1 MiB up
            (default: all 0, no power-of-2 rounding).
        garbage_collection_threshold: fraction of the allowed memory above which cached blocks
            are garbage collected; only acts with a memory fraction < 1 (default: 0.0, off).
        expandable_segments: map pages on demand into one growing segment (default: False).
        per_process_memory_fraction: the fraction set by the option, or None (torch 2.10+).
        other: validated options that do not affect the simulation, by key.
    """

    settings: str = ""
    max_split_size: int = SIZE_MAX
    max_non_split_rounding_size: int = LARGE_BUFFER
    large_segment_size: int = LARGE_BUFFER
    roundup_power2_divisions: tuple[int, ...] = (0,) * ROUNDUP_POWER2_INTERVALS
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    per_process_memory_fraction: float | None = None
    other: dict[str, object] = field(default_factory=dict)


def tokenize(conf: str) -> list[str]:
    """Split a config string into tokens at ``, : [ ]``, dropping whitespace (``ConfigTokenizer``)."""
    tokens: list[str] = []
    buf: list[str] = []
    for ch in conf:
        if ch in ",:[]":
            if buf:
                tokens.append("".join(buf))
                buf = []
            tokens.append(ch)
        elif not ch.isspace():
            buf.append(ch)
    if buf:
        tokens.append("".join(buf))
    return tokens


def option_names(conf: str) -> set[str]:
    """The option names a config string sets (each token before a ``:`` at the top level, outside ``[...]``)."""
    toks = tokenize(conf)
    names, depth = set(), 0
    for j, tok in enumerate(toks):
        if tok == "[":
            depth += 1
        elif tok == "]":
            depth -= 1
        elif depth == 0 and j + 1 < len(toks) and toks[j + 1] == ":" and (j == 0 or toks[j - 1] == ","):
            names.add(tok)
    return names


class _Tokens:
    """Index-checked access to the token list, with torch's error texts."""

    def __init__(self, conf: str) -> None:
        self.toks = tokenize(conf)

    def __len__(self) -> int:
        return len(self.toks)

    def get(self, i: int, key: str) -> str:
        if i >= len(self.toks):
            raise AllocatorConfigError(f"CachingAllocator option {key}: missing value "
                                       f"(Index out of bounds in ConfigTokenizer)")
        return self.toks[i]

    def expect(self, i: int, token: str, key: str) -> None:
        got = self.get(i, key)
        if got != token:
            raise AllocatorConfigError(f"Expected '{token}' at index {i} in ConfigTokenizer but got "
                                       f"'{got}' (option {key})")

    def size_t(self, i: int, key: str) -> int:
        tok = self.get(i, key)
        if not _SIZE_T.fullmatch(tok):
            raise AllocatorConfigError(f"CachingAllocator option {key}: expected a non-negative integer in ASCII "
                                       f"digits (0-9) but got '{tok}'")
        return int(tok)

    def double(self, i: int, key: str) -> float:
        tok = self.get(i, key)
        if not _DOUBLE.fullmatch(tok):
            raise AllocatorConfigError(f"CachingAllocator option {key}: expected a decimal number such as 0.6 "
                                       f"(ASCII digits, '.', an optional exponent) but got '{tok}'")
        value = float(tok)
        if not math.isfinite(value):
            raise AllocatorConfigError(f"CachingAllocator option {key}: expected a finite number but got "
                                       f"'{tok}'")
        return value

    def boolean(self, i: int, key: str) -> bool:
        tok = self.get(i, key)
        if tok == "True":
            return True
        if tok == "False":
            return False
        raise AllocatorConfigError(f"Expected 'True' or 'False' at index {i} in ConfigTokenizer but got "
                                   f"'{tok}' (option {key})")


def _parse_mb_at_least(t: _Tokens, i: int, key: str, minimum_mb: int) -> int:
    value = t.size_t(i, key)
    if value < minimum_mb:
        raise AllocatorConfigError(f"CachingAllocator option {key} too small, must be >= {minimum_mb}")
    return min(value, SIZE_MAX // MiB) * MiB


def _parse_divisions(t: _Tokens, i: int, key: str) -> tuple[int, int]:
    """Parse ``roundup_power2_divisions``'s value at token ``i``; return (entries, last index used)."""
    entries = [0] * ROUNDUP_POWER2_INTERVALS
    if t.get(i, key) != "[":
        value = t.size_t(i, key)
        if not _is_power_of_2(value):
            raise AllocatorConfigError("For roundups, the divisions has to be power of 2 "
                                       f"(option {key}, got {value})")
        return (value,) * ROUNDUP_POWER2_INTERVALS, i
    first = True
    last_index = 0
    i += 1
    while t.get(i, key) != "]":
        bound = t.get(i, key)
        t.expect(i + 1, ":", key)
        value = t.size_t(i + 2, key)
        i += 2
        if value != 0 and not _is_power_of_2(value):
            raise AllocatorConfigError("For roundups, the divisions has to be power of 2 or 0 to disable "
                                       f"roundup (option {key}, got {value})")
        if bound == ">":
            for k in range(last_index + 1, ROUNDUP_POWER2_INTERVALS):
                entries[k] = value
        else:
            boundary = t.size_t(i - 2, key)
            if not _is_power_of_2(boundary):
                raise AllocatorConfigError(f"For roundups, the intervals have to be power of 2 {bound} "
                                           f"(option {key})")
            index = min(boundary.bit_length() - 1, ROUNDUP_POWER2_INTERVALS - 1)
            if first:
                for k in range(index):
                    entries[k] = value
                first = False
            entries[index] = value
            last_index = index
        if t.get(i + 1, key) != "]":
            t.expect(i + 1, ",", key)
            i += 1
        i += 1
    return tuple(entries), i


def parse_alloc_conf(conf: str) -> AllocatorConfig:
    """Parse a ``PYTORCH_CUDA_ALLOC_CONF`` string into an :class:`AllocatorConfig`.

    Args:
        conf: e.g. ``"expandable_segments:True,max_split_size_mb:128"`` (default options for "").

    Raises:
        AllocatorConfigError: unknown key, malformed value or out-of-range value; the message
            names the option, e.g. "CachingAllocator option max_split_size_mb too small, must be >= 20".
    """
    if not isinstance(conf, str):
        raise TypeError(f"alloc_conf must be a str, not {type(conf).__name__}")
    t = _Tokens(conf)
    cfg = AllocatorConfig(settings=conf)
    # large_segment_size_mb is read first: the other limits are checked against it.
    toks = t.toks
    for j in range(len(toks) - 2):
        if toks[j] == "large_segment_size_mb" and toks[j + 1] == ":":
            value = t.size_t(j + 2, "large_segment_size_mb")
            if value <= MIN_LARGE_ALLOC // MiB:
                raise AllocatorConfigError("CachingAllocator option large_segment_size_mb too small, "
                                           f"must be > {MIN_LARGE_ALLOC // MiB}")
            cfg.large_segment_size = value * MiB
    cfg.max_non_split_rounding_size = cfg.large_segment_size
    min_mb = cfg.large_segment_size // MiB
    i = 0
    while i < len(t):
        key = t.get(i, "")
        if key in ",:[]":
            raise AllocatorConfigError(f"Expected an option name at index {i} in ConfigTokenizer but got "
                                       f"'{key}'")
        t.expect(i + 1, ":", key)
        i += 2
        if key == "max_split_size_mb":
            cfg.max_split_size = _parse_mb_at_least(t, i, key, min_mb)
        elif key == "max_non_split_rounding_mb":
            cfg.max_non_split_rounding_size = _parse_mb_at_least(t, i, key, min_mb)
        elif key == "large_segment_size_mb":
            t.size_t(i, key)  # parsed above
        elif key == "garbage_collection_threshold":
            value = t.double(i, key)
            if not 0.0 < value < 1.0:
                raise AllocatorConfigError("garbage_collect_threshold is invalid, set it in (0.0, 1.0) "
                                           f"(option {key}, got {value})")
            cfg.garbage_collection_threshold = value
        elif key == "roundup_power2_divisions":
            cfg.roundup_power2_divisions, i = _parse_divisions(t, i, key)
        elif key in _BOOL_KEYS:
            value = t.boolean(i, key)
            if key == "expandable_segments":
                cfg.expandable_segments = value
            else:
                cfg.other[key] = value
        elif key == "per_process_memory_fraction":
            value = t.double(i, key)
            if not 0.0 <= value <= 1.0:
                raise AllocatorConfigError("per_process_memory_fraction is invalid, set it in [0.0, 1.0] "
                                           f"(got {value})")
            cfg.per_process_memory_fraction = value
        elif key == "pinned_num_register_threads":
            value = t.size_t(i, key)
            if not _is_power_of_2(value) or value > 128:
                raise AllocatorConfigError("Number of register threads has to be power of 2 and less than "
                                           f"or equal to 128 (option {key}, got {value})")
            cfg.other[key] = value
        elif key == "backend":
            value = t.get(i, key)
            if value not in ("native", "cudaMallocAsync"):
                raise AllocatorConfigError("Unknown allocator backend, options are native and "
                                           f"cudaMallocAsync (option backend, got '{value}')")
            if value == "cudaMallocAsync":
                raise AllocatorConfigError("backend:cudaMallocAsync is a different allocator; memviz.sim "
                                           "models the native backend only")
        else:
            raise AllocatorConfigError(f"Unrecognized key '{key}' in CUDA allocator config.")
        if i + 1 < len(t):
            t.expect(i + 1, ",", key)
            i += 1
        i += 1
    return cfg

"""What the cache saves: alloc + free from the cache vs through cudaMalloc/cudaFree, in microseconds.

On a GPU :func:`cache_timings` measures it; without one it returns the figures recorded on an NVIDIA
H200 with torch 2.11 (``memviz/data/h200_timings.json``), labelled as such.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from importlib import resources

from memviz.sim.constants import MiB
from memviz.units import format_bytes

__all__ = ["CacheTimings", "cache_timings", "recorded_h200"]


@dataclass(frozen=True)
class CacheTimings:
    """Median microseconds per alloc + free pair.

    Attributes:
        cached_us: served from the cache (no driver call), by request size in bytes.
        uncached_us: each pair forced through cudaMalloc + cudaFree by ``empty_cache()``, by size.
        source: ``"measured on <GPU>"`` or ``"recorded on NVIDIA H200 (torch 2.11)"``.
    """

    cached_us: dict[int, float]
    uncached_us: dict[int, float]
    source: str

    def __str__(self) -> str:
        lines = [f"alloc + free, median µs ({self.source})", f"{'size':>10}  {'cached':>8}  {'cudaMalloc':>10}"]
        for size in sorted(self.cached_us.keys() | self.uncached_us.keys()):
            cached, uncached = (_cell(t.get(size)) for t in (self.cached_us, self.uncached_us))
            lines.append(f"{format_bytes(size):>10}  {cached:>8}  {uncached:>10}")  # "—": not measured at that size
        return "\n".join(lines)


def _cell(us: float | None) -> str:
    return "—" if us is None else f"{us:.1f}"


def recorded_h200() -> CacheTimings:
    """The H200 figures from ``h200_timings.json`` (cached pairs at 4 KiB, 1 MiB and 100 MiB)."""
    data = json.loads(resources.files("memviz.data").joinpath("h200_timings.json").read_text())
    cached = {4096: data["cached_alloc_free_4096_us"], MiB: data["cached_alloc_free_1048576_us"],
              100 * MiB: data["cached_alloc_free_104857600_us"]}  # fmt: skip
    uncached = {2 * MiB: data["uncached_alloc_free_emptycache_2097152_us"],
                100 * MiB: data["uncached_alloc_free_emptycache_104857600_us"]}  # fmt: skip
    return CacheTimings(cached, uncached, f"recorded on {data['device']} (torch {data['torch']})")


def cache_timings(sizes: tuple[int, ...] = (2 * MiB, 100 * MiB), repeats: int = 200) -> CacheTimings:
    """Measure on the current CUDA device, or return :func:`recorded_h200` when there is none.

    Args:
        sizes: request sizes in bytes (default 2 MiB and 100 MiB).
        repeats: timed pairs per size; the median is reported (default 200).
    """
    try:
        import torch
    except ImportError:
        return recorded_h200()
    if not torch.cuda.is_available():
        return recorded_h200()
    cached, uncached = {}, {}
    for size in sizes:

        def pair(s: int = size) -> None:
            tensor = torch.empty(s, dtype=torch.uint8, device="cuda")
            del tensor

        def driver_pair(s: int = size) -> None:
            pair(s)
            torch.cuda.empty_cache()  # the next pair must cudaMalloc again; this one's cudaFree is timed

        cached[size] = _median_us(pair, repeats)
        uncached[size] = _median_us(driver_pair, max(20, repeats // 4))
    return CacheTimings(cached, uncached, f"measured on {torch.cuda.get_device_name()} (torch {torch.__version__})")


def _median_us(pair, repeats: int) -> float:
    """Median µs of ``pair()`` over ``repeats`` calls, after one untimed warm-up call."""
    import torch

    pair()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        pair()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)

"""The allocator configs memviz tries, compares and checks against the GPU: every list, in one place.

Each is a tuple of ``PYTORCH_CUDA_ALLOC_CONF`` strings (``""`` is torch's defaults), in the order the
reports and pickers show them.
"""

from __future__ import annotations

__all__ = ["CANDIDATE_CONFIGS", "RECORDED_CONFIGS", "WORKLOAD_CONFIGS"]

RECORDED_CONFIGS = (
    "",
    "expandable_segments:True",
    "max_split_size_mb:64",
    "garbage_collection_threshold:0.6,max_split_size_mb:128",
    "roundup_power2_divisions:4",
)
"""The five configs of the golden traces recorded on an H200 (tests/data/golden), which the GPU parity
test (tests/test_cuda_parity.py) runs again."""

WORKLOAD_CONFIGS = (
    "",
    "expandable_segments:True",
    "max_split_size_mb:128",
    "garbage_collection_threshold:0.7,max_split_size_mb:128",
)
"""The four configs of the real training workload recorded on an H200 (tests/data/snapshots/workload)."""

CANDIDATE_CONFIGS = (
    RECORDED_CONFIGS[1],
    RECORDED_CONFIGS[2],
    WORKLOAD_CONFIGS[2],
    *RECORDED_CONFIGS[3:],
)
"""The configs an OOM explanation tries (and the dashboard's picker offers): the four non-default recorded
configs, with ``max_split_size_mb:128`` alone (from the workload) after ``max_split_size_mb:64``."""

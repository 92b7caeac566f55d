"""Run the program for real on this machine's GPU, capped, and measure its peaks beside the prediction.

The run happens in this process (a notebook's function cannot be sent to a fresh one): the cache is emptied
and the peaks reset first, the cap is set with ``set_per_process_memory_fraction`` and lifted afterwards,
and bytes that were allocated before the run (the notebook's own tensors) are subtracted. What a fresh
process would add and this one may already hold — cuBLAS's workspace of a thread that already ran a matrix
product — is said beside the figures. The allocator config is this process's (``PYTORCH_CUDA_ALLOC_CONF``
is read when CUDA starts), so the prediction beside it is made under that config.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from memviz.devices import PRESETS

__all__ = ["Measured", "local_device", "process_alloc_conf", "run_for_real"]


@dataclass(frozen=True)
class Measured:
    """One real run: ``fits``, the peaks above what was allocated before it (bytes), torch's OOM line, seconds."""

    fits: bool
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    oom_message: str
    seconds: float


def process_alloc_conf() -> str:
    """The allocator config this process's CUDA started with."""
    return os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")


def local_device() -> str | int:
    """This GPU as :func:`memviz.predict` takes it: the preset whose name it bears and whose memory it has
    (within 10%: a card reports a little less than nominal), else its size in bytes."""
    import torch

    name = torch.cuda.get_device_name().upper()
    total = torch.cuda.get_device_properties(0).total_memory
    for key, preset in PRESETS.items():
        family = key.partition("-")[0]
        if family in name.split() and abs(preset.total_memory_bytes - total) <= 0.1 * preset.total_memory_bytes:
            return key
    return total


def run_for_real(fn: Callable[..., Any], kwargs: Mapping[str, Any], cap_bytes: int | None) -> Measured:
    """Run ``fn(**kwargs)`` on the GPU under ``cap_bytes`` (None: no cap); the cap is lifted afterwards."""
    import torch

    from memviz.sim.limits import fraction_for_cap

    total = torch.cuda.get_device_properties(0).total_memory
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base_allocated = torch.cuda.memory_allocated()
    base_reserved = torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    fraction = fraction_for_cap(cap_bytes, total)
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction)
    start = time.perf_counter()
    message = ""
    try:
        fn(**kwargs)
        torch.cuda.synchronize()
    except torch.OutOfMemoryError as error:
        message = str(error).splitlines()[0]
    finally:
        seconds = time.perf_counter() - start
        peak_allocated = torch.cuda.max_memory_allocated() - base_allocated
        peak_reserved = torch.cuda.max_memory_reserved() - base_reserved
        gc.collect()
        torch.cuda.empty_cache()
        if fraction is not None:
            torch.cuda.set_per_process_memory_fraction(1.0)
    return Measured(not message, peak_allocated, peak_reserved, message, seconds)

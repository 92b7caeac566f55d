"""Run the program for real on this machine's GPU, capped, and measure its peaks beside the prediction.

The run happens in this process (a notebook's function cannot be sent to a fresh one), so it first puts
the process as near a fresh one as it can: garbage is collected, cuBLAS's per-thread workspaces are
dropped (a fresh process allocates them at its first matrix product, and the prediction counts them),
the cache is emptied and the peaks reset. Bytes still allocated and reserved then (the notebook's own
tensors) are subtracted from the peaks, and the cap is set with ``set_per_process_memory_fraction`` at
``cap + reserved before the run`` (torch's limit counts everything this process reserved), so the
program gets the cap a fresh process would. Afterwards the program's memory is freed and the fraction
this process had before is set back. The allocator config is this process's (``PYTORCH_CUDA_ALLOC_CONF``
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
    """Run ``fn(**kwargs)`` on the GPU with ``cap_bytes`` for itself (None: no cap); the process's own
    fraction is set back afterwards, also when ``fn`` raises."""
    import torch

    from memviz.sim.limits import fraction_for_cap

    total = torch.cuda.get_device_properties(0).total_memory
    _drop_cached_state(torch)
    base_allocated = torch.cuda.memory_allocated()
    base_reserved = torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # not in older torch
    before = getter() if getter is not None else 1.0
    fraction = None if cap_bytes is None else fraction_for_cap(min(cap_bytes + base_reserved, total), total)
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
        _drop_cached_state(torch)
        if fraction is not None:
            torch.cuda.set_per_process_memory_fraction(before)
    return Measured(not message, peak_allocated, peak_reserved, message, seconds)


def _drop_cached_state(torch: Any) -> None:
    """Free what a finished run left cached: garbage, cuBLAS's workspaces, the cache's free segments."""
    gc.collect()
    torch.cuda.synchronize()
    clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)  # CUDA builds since torch 1.13
    if clear_workspaces is not None:
        clear_workspaces()
    torch.cuda.empty_cache()

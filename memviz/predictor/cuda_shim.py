"""``torch.cuda`` as a program sees it during a prediction: one simulated GPU, its stats from the simulator.

A CPU-only torch has no CUDA runtime, and a CUDA torch must not touch the real one while predicting, so
for the duration of one prediction the functions a training script calls are replaced (and put back
afterwards, whatever happens): availability and device queries answer for the target GPU; the RNG calls
do nothing; streams and events are the simulated GPU's (:mod:`memviz.predictor.streams`: each stream its own
identity, its allocations its own pools; ``synchronize`` completes the frees that wait on streams); the memory
queries (``memory_allocated``, ``memory_stats``,
``max_memory_reserved``, ``mem_get_info``, ``empty_cache``, ``reset_peak_memory_stats``, ``memory_summary``)
read and drive the simulated allocator, so a program that prints them prints the prediction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["cuda_modules", "cuda_replacements"]


@dataclass
class _Properties:
    """What ``torch.cuda.get_device_properties`` returns, for the simulated GPU."""

    name: str
    total_memory: int
    major: int
    minor: int
    multi_processor_count: int = 132
    is_integrated: bool = False
    is_multi_gpu_board: bool = False
    warp_size: int = 32


class _NoOpContext:
    """``torch.cuda.device(i)``: nothing to switch (one device)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> _NoOpContext:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def cuda_replacements(session: Any) -> dict[str, Any]:
    """Name → replacement, for whichever of :func:`cuda_modules` has the name."""
    alloc = session.allocator
    streams = session.streams
    props = _Properties(session.device.name, session.device.total_memory_bytes, *session.arch.capability)
    nothing = lambda *a, **k: None  # noqa: E731

    def memory_stats(device: Any = None) -> dict[str, int]:
        return dict(alloc.memory_stats())

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        return alloc.device_free_bytes(), alloc.total_memory

    def set_fraction(fraction: float, device: Any = None) -> None:
        alloc.set_memory_fraction(fraction)

    return {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "is_current_stream_capturing": lambda: False,
        "init": nothing,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": nothing,
        "synchronize": lambda device=None: streams.synchronize(None),
        "get_device_name": lambda device=None: props.name,
        "get_device_properties": lambda device=None: props,
        "get_device_capability": lambda device=None: session.arch.capability,
        "is_bf16_supported": lambda including_emulation=True: session.arch.supports_bf16 or including_emulation,
        "manual_seed": nothing,
        "manual_seed_all": nothing,
        "seed": nothing,
        "seed_all": nothing,
        "get_rng_state": lambda device="cuda": torch.zeros(16, dtype=torch.uint8),
        "set_rng_state": nothing,
        "get_rng_state_all": lambda: [torch.zeros(16, dtype=torch.uint8)],
        "set_rng_state_all": nothing,
        "device": _NoOpContext,
        "stream": streams.context,
        "Stream": streams.Stream,
        "Event": streams.Event,
        "current_stream": streams.current_stream,
        "default_stream": lambda device=None: streams.default,
        "empty_cache": session.empty_cache,
        "memory_allocated": lambda device=None: alloc.memory_allocated(),
        "memory_reserved": lambda device=None: alloc.memory_reserved(),
        "max_memory_allocated": lambda device=None: alloc.max_memory_allocated(),
        "max_memory_reserved": lambda device=None: alloc.max_memory_reserved(),
        "memory_stats": memory_stats,
        "reset_peak_memory_stats": lambda device=None: alloc.reset_peak_memory_stats(),
        "reset_accumulated_memory_stats": lambda device=None: alloc.reset_accumulated_memory_stats(),
        "reset_max_memory_allocated": lambda device=None: alloc.reset_peak_memory_stats(),
        "memory_summary": lambda device=None, abbreviated=False: alloc.memory_summary(abbreviated),
        "mem_get_info": mem_get_info,
        "set_per_process_memory_fraction": set_fraction,
        # torch.accelerator's own names (torch >= 2.6): the same GPU, whichever API the program or torch asks
        "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "current_device_index": lambda: 0,
        "current_device_idx": lambda: 0,
        "set_device_index": nothing,
        "set_device_idx": nothing,
        "set_stream": streams.set_stream,
        "get_memory_info": mem_get_info,
        # memory history: the prediction is its own record; _snapshot() is the simulator's
        "_record_memory_history": nothing,
        "_dump_snapshot": nothing,
        "_snapshot": lambda *a, **k: alloc.snapshot(),
    }


def cuda_modules() -> list[Any]:
    """Where the names live: ``torch.cuda``, ``torch.cuda.memory`` and, where this torch has it,
    ``torch.accelerator`` (which a CPU-only build answers with "no accelerator" and a CUDA build on a
    machine without a GPU answers from the driver: ``torch.optim``'s step asks it for the current stream)."""
    modules = [torch.cuda, torch.cuda.memory]
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        modules.append(accelerator)
        if getattr(accelerator, "memory", None) is not None:
            modules.append(accelerator.memory)
    return modules

"""torch's CUDA reduction kernel: the global-memory scratch a long reduction splits into.

``gpu_reduce_kernel`` (``aten/src/ATen/native/cuda/Reduce.cuh``) sizes its launch with ``setReduceConfig``; when a
reduction is long and its grid small, it splits each output's inputs across blocks that meet in a global-memory
buffer, with one semaphore per output block, allocated after the output and freed (semaphores first) when the
kernel returns. Ported from the source with the target's SM count (:mod:`memviz.predictor.gpus`); the sizes it
gives were seen in the H200 recordings (a Linear's bias gradient, a convolution's).
"""

from __future__ import annotations

from typing import Any

import torch

from ..device import DeviceMemory
from ..gpus import GpuArch
from . import Measurement, Rule

__all__ = ["RULES", "reduce_scratch_bytes"]

aten = torch.ops.aten

def _last_pow2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def reduce_scratch_bytes(arch: GpuArch, shape: tuple[int, ...], reduce_dims: set[int], element_bytes: int,
                         acc_bytes: int, storage_offset: int = 0) -> tuple[int, int]:
    """``(buffer_bytes, semaphore_bytes)`` that torch's CUDA reduction kernel (``gpu_reduce_kernel`` in
    ``aten/src/ATen/native/cuda/Reduce.cuh``) allocates while it runs, for a contiguous input of ``shape``
    reduced over ``reduce_dims``; ``(0, 0)`` when it reduces in one pass (the usual case).

    ``setReduceConfig`` ported for inputs whose reduced dimensions form one block (a prefix, a suffix or
    all): when each thread would sum ≥ 256 values and the grid is small, it splits the inputs across
    ``ctas_per_output`` blocks that meet in a global-memory buffer (``acc_bytes`` per partial value) with
    one semaphore per output block. Example: the bias gradient of a Linear, ``grad.sum(0)`` over 4096 rows
    of 3072 outputs, takes a 96 MiB buffer on an H200 (seen in the recordings, one per layer). A reduction
    over the outer and the inner dimensions around kept ones (a convolution's bias gradient, ``sum((0, 2,
    3))`` of N×C×H×W) is one over the fastest dimension with two reduced dimensions, so not vectorized:
    2560 B of buffer for 128×128×32×32 fp32 (seen in the recordings). ``(0, 0)`` also for layouts the port
    does not cover (other interleavings).
    """
    groups: list[list[Any]] = []  # [reduced, size], fastest dimension last
    for d, size in enumerate(shape):
        if size == 1:
            continue
        reduced = d in reduce_dims
        if groups and groups[-1][0] == reduced:
            groups[-1][1] *= size
        else:
            groups.append([reduced, size])
    outer_and_inner = [r for r, _ in groups] == [True, False, True]
    if not any(r for r, _ in groups) or (len(groups) > 2 and not outer_and_inner):
        return 0, 0
    num_outputs = 1
    inputs = 1
    for reduced, size in groups:
        if reduced:
            inputs *= size
        else:
            num_outputs *= size
    inner = groups[-1][0]  # reduction on the fastest-moving dimension
    output_vec = 1
    if inner:
        dim0, dim1 = inputs, num_outputs
        if dim0 > 128 and not outer_and_inner:
            dim0 //= 4  # vectorize along input (input_vec_size = vt0 = 4), only with one reduced dimension
    else:
        output_vec = 4
        for n in (storage_offset, num_outputs):
            while n % output_vec:
                output_vec //= 2
        dim0, dim1 = num_outputs // output_vec, inputs
    max_threads = 512 // output_vec
    dim0_pow2 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    dim1_pow2 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    block_width = min(dim0_pow2, 32)
    block_height = min(dim1_pow2, max_threads // block_width)
    block_width = min(dim0_pow2, max_threads // block_height)
    num_threads = block_width * block_height
    step_input = step_output = 1
    if inner:
        step_input *= block_width
    else:
        step_output *= block_width
    split_across_warps = -(-inputs // step_input) >= min(block_height * 16, 256)
    if split_across_warps:
        step_input *= block_height
    else:
        step_output *= block_height
    target_grid = arch.sm_count * (arch.max_threads_per_sm // num_threads)
    grid_x = -(-(num_outputs // output_vec) // step_output)
    values_per_thread = -(-inputs // step_input)
    if not (split_across_warps and values_per_thread >= 256 and grid_x <= target_grid):
        return 0, 0
    ctas = max(min(-(-target_grid // grid_x), -(-values_per_thread // 16)), -(-values_per_thread // 256))
    if ctas <= 1:
        return 0, 0
    buffer_bytes = acc_bytes * num_outputs * ctas
    if not inner:
        buffer_bytes *= block_width * output_vec
    return buffer_bytes, 4 * grid_x


def _reduction(memory: DeviceMemory, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    """``sum`` / ``mean``: the reduction kernel's global-memory scratch (:func:`reduce_scratch_bytes`),
    allocated after the output and freed (semaphores first) when the kernel returns."""
    inp = args[0]
    if not inp.is_contiguous() or inp.numel() == 0 or inp.is_complex():
        return
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        reduce_dims = set(range(inp.dim()))
    else:
        dims = [dims] if isinstance(dims, int) else dims
        reduce_dims = {d % max(inp.dim(), 1) for d in dims}
    acc_bytes = 8 if inp.dtype in (torch.float64, torch.int64) or not inp.is_floating_point() else 4
    buffer_bytes, semaphore_bytes = reduce_scratch_bytes(memory.arch, tuple(inp.shape), reduce_dims,
                                                         inp.element_size(), acc_bytes, inp.storage_offset())
    if buffer_bytes:
        name = func.__name__
        buffer = memory.malloc(buffer_bytes, name, "workspaces")
        memory.free(memory.malloc(semaphore_bytes, name, "workspaces"), name)
        memory.free(buffer, name)


RULES = (
    Rule("reduction scratch", "reductions", "allocates",
         (aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default), _reduction, "source",
         "aten/src/ATen/native/cuda/Reduce.cuh (setReduceConfig, gpu_reduce_kernel)",
         (Measurement("sm90", "H200", "torch 2.11.0+cu130", "evaluation/recordings/h200/: a Linear's bias gradient "
                      "(96 MiB for 4096 rows of 3072 outputs), a convolution's (2560 B for 128x128x32x32 fp32)"),)),
)

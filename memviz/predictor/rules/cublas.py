"""cuBLAS and cuBLASLt: the workspaces a matrix product keeps for the process.

cuBLAS keeps one workspace per (handle, stream), and torch keeps one handle per thread: the first cuBLAS call on
the main thread and the first in autograd's backward thread each allocate one and keep it until
``torch._C._cuda_clearCublasWorkspaces()`` (``empty_cache()`` does not free them). Size: torch's default
``CUBLAS_WORKSPACE_CONFIG`` (``aten/src/ATen/cuda/CublasHandlePool.cpp``): ``:4096:8`` = 32 MiB on compute
capability 9.0 and above, ``:4096:2:16:8`` = 8 MiB + 128 KiB below. An ``addmm`` whose bias is a vector goes
through cuBLASLt's bias epilogue (``gemm_and_bias``, ``addmm_out_cuda_impl``'s ``useLtInterface``) and also
keeps a cuBLASLt workspace, ``CUBLASLT_WORKSPACE_SIZE`` = 1024 KiB by default.

Measured on the H200 (torch 2.11, ``evaluation/recordings/h200_probe.json.gz``, ``blas``): the first fp32 ``mm``
on a thread keeps 33,554,432 bytes; the first ``addmm`` with a bias keeps 1,048,576 bytes more.
"""

from __future__ import annotations

from typing import Any

import torch

from ..device import DeviceMemory
from ..gpus import GpuArch
from . import Measurement, Rule

__all__ = ["RULES", "cublas_workspace_bytes", "cublaslt_workspace_bytes"]

aten = torch.ops.aten

H200_BLAS = Measurement("sm90", "H200", "torch 2.11.0+cu130", "evaluation/recordings/h200_probe.json.gz: blas "
                        "(first mm / addmm on the main thread and in autograd's backward thread)")


def cublas_workspace_bytes(arch: GpuArch) -> int:
    """torch's default cuBLAS workspace on ``arch``: ``:4096:8`` (32 MiB) from sm90, ``:4096:2:16:8`` below."""
    if arch.capability >= (9, 0):
        return 4096 * 1024 * 8
    return 4096 * 1024 * 2 + 16 * 1024 * 8


def cublaslt_workspace_bytes(arch: GpuArch) -> int:
    """``CUBLASLT_WORKSPACE_SIZE``'s default, 1024 KiB, on every architecture."""
    return 1024 * 1024


def _cublas(memory: DeviceMemory, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    memory.keep("cublas", cublas_workspace_bytes(memory.arch), func.__name__)


def _addmm(memory: DeviceMemory, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    memory.keep("cublas", cublas_workspace_bytes(memory.arch), func.__name__)
    bias, mat1, mat2 = args[0], args[1], args[2]
    beta = kwargs.get("beta", args[3] if len(args) > 3 else 1)
    if (bias.dim() == 1 and beta == 1 and mat1.dim() == 2 and bias.size(0) == mat2.size(1) and bias.is_contiguous()
            and mat1.dtype in (torch.float32, torch.float16, torch.bfloat16) and mat1.size(0) > 1
            and mat2.size(1) > 1):
        memory.keep("cublaslt", cublaslt_workspace_bytes(memory.arch), func.__name__)


RULES = (
    Rule("cuBLAS workspace per thread", "cublas", "allocates",
         (aten.mm.default, aten.bmm.default, aten.baddbmm.default, aten.addbmm.default, aten.addmv.default,
          aten.mv.default, aten.dot.default, aten.vdot.default, aten._addmm_activation.default),
         _cublas, "source", "aten/src/ATen/cuda/CublasHandlePool.cpp (getChosenWorkspaceSize)", (H200_BLAS,)),
    Rule("cuBLAS and cuBLASLt workspaces of addmm", "cublas", "allocates", (aten.addmm.default,), _addmm, "source",
         "aten/src/ATen/native/cuda/Blas.cpp (addmm_out_cuda_impl, useLtInterface); CublasHandlePool.cpp",
         (H200_BLAS,)),
)

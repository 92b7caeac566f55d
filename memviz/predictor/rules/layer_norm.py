"""Layer norm's CUDA kernels: the contiguous copies they take of a non-contiguous input.

``layer_norm_cuda`` / ``layer_norm_backward_cuda`` (``aten/src/ATen/native/cuda/layer_norm_kernel.cu``) take
``expect_contiguous()`` of the input (and of the output gradient, in backward) before allocating their outputs.
"""

from __future__ import annotations

from typing import Any

import torch

from ..device import Allocation, DeviceMemory
from . import Measurement, Rule

__all__ = ["RULES"]

aten = torch.ops.aten


def _contiguous_copies(memory: DeviceMemory, tensors: tuple, op: str) -> list[Allocation]:
    """``expect_contiguous()`` of each non-contiguous tensor: a contiguous copy the kernel reads, allocated
    before its outputs and freed when it returns."""
    return [memory.malloc(t.numel() * t.element_size(), op, "temporaries") for t in tensors
            if isinstance(t, torch.Tensor) and t.numel() and not t.is_contiguous()]


def _layer_norm(memory: DeviceMemory, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    """A non-contiguous input (the residual sum after ``nn.MultiheadAttention`` with ``batch_first``, which
    returns a transposed view) costs one input-sized copy while the kernel runs (the H200 trace of torchvision's
    ViT-B/16: two 77,463,552 B allocations and the statistics per ``ln_2``)."""
    name = func.__name__
    inputs = (args[0],) if func is aten.native_layer_norm.default else (args[0], args[1])
    copies = _contiguous_copies(memory, inputs, name)
    for t in out:
        if isinstance(t, torch.Tensor) and t.is_meta:
            memory.track(t, name)
    for copy in reversed(copies):
        memory.free(copy, name)


RULES = (
    Rule("layer norm's contiguous copies", "layer_norm", "allocates",
         (aten.native_layer_norm.default, aten.native_layer_norm_backward.default), _layer_norm, "source",
         "aten/src/ATen/native/cuda/layer_norm_kernel.cu (expect_contiguous)",
         (Measurement("sm90", "H200", "torch 2.11.0+cu130", "evaluation/recordings/h200/ho-tv-vit-*: torchvision "
                      "ViT-B/16's ln_2 after batch-first attention"),),
         tracks_outputs=True, doc=_layer_norm.__doc__ or ""),
)

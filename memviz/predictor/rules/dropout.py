"""Dropout's fused CUDA kernel: the order of its two outputs.

``native_dropout_cuda`` (``aten/src/ATen/native/cuda/Dropout.cu``) in training with ``0 < p < 1`` runs
``dropout_cuda``, which allocates the bool ``mask`` before the output ``ret``; the meta kernel makes them the other
way round. Which block each one takes from the cache depends on that order.
"""

from __future__ import annotations

from typing import Any

import torch

from ..device import DeviceMemory
from . import Measurement, Rule

__all__ = ["RULES"]

aten = torch.ops.aten


def _mask_first(memory: DeviceMemory, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    """The mask, then the output, as ``dropout_cuda`` allocates them; its shortcuts (``train=False``: a clone,
    then a mask of ones; ``p == 1``: zeros, then a mask of zeros) allocate the output first."""
    p = args[1] if len(args) > 1 else kwargs.get("p")
    train = args[2] if len(args) > 2 else kwargs.get("train")
    ret, mask = out
    order = (ret, mask) if train is False or p == 1 else (mask, ret)
    for t in order:
        if isinstance(t, torch.Tensor) and t.is_meta:
            memory.track(t, func.__name__)


RULES = (
    Rule("dropout's mask before its output", "dropout", "allocates", (aten.native_dropout.default,), _mask_first,
         "source", "aten/src/ATen/native/cuda/Dropout.cu (native_dropout_cuda, dropout_cuda)",
         (Measurement("sm90", "H200", "torch 2.11.0+cu130", "evaluation/recordings/hf/runs/"
                      "hf-gpt2-b8-s1024-bf16-ckpt: each dropout's 6,291,456 B mask before its 25,165,824 B output"),),
         tracks_outputs=True, doc=_mask_first.__doc__ or ""),
)

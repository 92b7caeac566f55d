"""Ops whose CUDA kernel is not their composite decomposition.

The capture runs an op that reaches it undecomposed (under ``inference_mode``) through its
``CompositeImplicitAutograd`` decomposition, op by op, as CUDA would — except the ops listed here, which have a
composite kernel and a CUDA kernel of their own: CUDA runs its own (one output, no temporaries).
"""

from __future__ import annotations

import torch

from . import Rule

__all__ = ["RULES"]

RULES = (
    Rule("silu_backward runs CUDA's own kernel", "kernels", "own_kernel", (torch.ops.aten.silu_backward.default,),
         None, "source", "aten/src/ATen/native/native_functions.yaml (silu_backward: CompositeImplicitAutograd "
         "math_silu_backward, and a CUDA kernel)",
         doc="math_silu_backward's sigmoid and five temporaries are not what CUDA runs. From torch 2.14.1's CUDA "
             "build, the aten ops that register both a composite and a CUDA kernel and reach the capture on meta "
             "tensors (mish_backward has no meta kernel, so autograd decomposes it before: Mish's backward is "
             "predicted with its composite's temporaries)."),
)

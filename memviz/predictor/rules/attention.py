"""Scaled dot-product attention: which kernel the target runs, and what its backward pass allocates.

- The backend as ``sdp_utils.cpp`` picks it for the target GPU (:func:`choose_sdpa_backend`).
- Flash attention's backward (``mha_bwd``) holds ``softmax_d`` (B·H·round128(L) fp32) and ``dq_accum``
  (B·round128(L)·H·round32(D) fp32) while it runs; memory-efficient attention's backward in fp16/bf16 its
  fp32 grad_q accumulator (:func:`_efficient_backward`).

On the H200, torch 2.11's SDPA ran what looks like cuDNN attention where flash is chosen here: the same output,
log-sum-exp and backward bytes, not its few-byte side tensors (docs/predict.md).
"""

from __future__ import annotations

from typing import Any

import torch

from ..device import DeviceMemory
from ..gpus import GpuArch
from . import Measurement, Rule

__all__ = ["RULES", "choose_sdpa_backend"]

aten = torch.ops.aten


def _round(x: int, m: int) -> int:
    return -(-x // m) * m


def _flash_backward(memory: DeviceMemory, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    """``mha_bwd`` (flash_api.cpp) after its gradients: ``softmax_d``, ``dq_accum`` and, for grouped-query attention
    (fewer key/value heads), ``dk_expanded`` / ``dv_expanded`` at the query's heads, summed into dK and dV. On the
    H200 torch 2.11 runs cuDNN attention here, whose one backward workspace is these bytes together (a LLaMA-style
    1B with 32 query and 8 key/value heads, batch 8 × 512 tokens: 67,633,408 B = 524,288 + 33,554,432 + 2 ×
    16,777,216 + 256)."""
    q, k = args[1], args[2]  # (grad_out, query, key, value, out, logsumexp, ...): (B, H, L, D)
    b, h, length, d = q.shape
    lq = _round(length, 128)
    name = func.__name__
    softmax_d = memory.malloc(b * h * lq * 4, name, "workspaces")
    dq_accum = memory.malloc(b * lq * h * _round(d, 32) * 4, name, "workspaces")
    if k.size(1) != h:
        expanded_bytes = b * k.size(2) * h * d * q.element_size()
        dk_expanded = memory.malloc(expanded_bytes, name, "workspaces")
        memory.free(memory.malloc(expanded_bytes, name, "workspaces"), name)
        memory.free(dk_expanded, name)
    memory.free(dq_accum, name)
    memory.free(softmax_d, name)


def _efficient_backward(memory: DeviceMemory, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    """Memory-efficient attention's backward (``_efficient_attention_backward``, attention_backward.cu), after
    its gradients: ``delta`` (B·H·M fp32), which the fp16/bf16 kernels compute themselves
    (``kKernelComputesDelta``) and fp32 takes from ``(grad_out.float() * out.float()).sum(-1)`` (the product
    and the sum are temporaries), then the kernel's workspace, B·H·``workspace_strideBH`` floats: with grad_q
    accumulated in global memory, ceil(M/64)·ceil(D/64) tiles of 64×64 floats and a 16-byte lock
    (``GradQTempStorage``). Measured for fp32: gpt-b8-fp32 (B 8, H 12, M 512, D 64) asks 12,582,912 B,
    196,608 B, 196,608 B, then 12,595,200 B, as here; fp16/bf16 from the source, not measured."""
    q = args[1]
    if q.dim() != 4:
        return
    b, h, length, d = q.shape
    name = func.__name__
    if q.dtype is torch.float32:
        product = memory.malloc(b * h * length * d * 4, name, "workspaces")
        summed = memory.malloc(b * h * length * 4, name, "workspaces")
        delta = memory.malloc(b * h * length * 4, name, "workspaces")
        memory.free(summed, name)
        memory.free(product, name)
    else:
        delta = memory.malloc(b * h * length * 4, name, "workspaces")
    tiles = -(-length // 64) * -(-d // 64)
    workspace = memory.malloc(b * h * _round(tiles * (64 * 64 + 4), 4) * 4, name, "workspaces")
    memory.free(delta, name)  # a local of the kernel launch; the workspace lives to the end of the function
    memory.free(workspace, name)


def _safe_softmax(memory: DeviceMemory, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    """``_safe_softmax`` (attention.cpp), the math backend's softmax: after ``at::softmax``'s output,
    ``self.isneginf()`` (a bool per element), ``all(masked, dim, keepdim)`` (a bool per row) and a 0-dim ``zero`` of
    the output's dtype, then ``at::where_out(out, masked_rows, zero, out)`` into the softmax's own storage; the three
    are freed on return. On the H200 (hfho-gen-t5v11-b16-dynamic, B 16, H 12, L 512, fp32 scores): 50,331,648 B,
    98,304 B and 4 B after the 201,326,592 B softmax, freed 4 B first."""
    self, dim = args[0], args[1] if len(args) > 1 else kwargs.get("dim", -1)
    if not isinstance(self, torch.Tensor) or self.numel() == 0:
        return
    name = func.__name__
    masked = memory.malloc(self.numel(), name, "temporaries")
    masked_rows = memory.malloc(self.numel() // self.size(dim), name, "temporaries")
    zero = memory.malloc(out.element_size(), name, "temporaries")
    for allocation in (zero, masked_rows, masked):
        memory.free(allocation, name)


def choose_sdpa_backend(arch: GpuArch, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any,
                        dropout_p: float, enable_gqa: bool) -> str:
    """``"flash"``, ``"efficient"`` or ``"math"``: the first backend whose constraints the inputs meet,
    in torch's default priority order (flash, memory-efficient, math), honouring
    ``torch.backends.cuda.enable_*_sdp``. Constraints (``sdp_utils.cpp``): flash needs sm80+, fp16/bf16,
    no attention mask, head dim ≤ 256, 4-D inputs; memory-efficient needs sm50+, fp32/fp16 (bf16 on sm80+),
    head dim a multiple of 8 for fp16/bf16 (4 for fp32). Flash takes grouped-query attention (``enable_gqa``:
    fewer key/value heads, dividing the query's: ``check_batch_size_and_num_heads_dense<supports_gqa=true>``);
    memory-efficient attention needs every input to have the same number of heads (its backward has no
    reduction of dK / dV over the query's groups; on the H200, torch 2.11, an fp32 LLaMA-style step with 16
    query and 4 key/value heads allocates exactly what the math path's expanded keys and values make:
    evaluation/recordings/hf/runs/hf-llama400m-b4-s512), so grouped-query attention outside flash runs the
    math path. Every fused kernel wants the last dimension of q, k and v at stride 1 (flash and cuDNN pass a head
    dim of 1 whatever its stride) and, on a GPU, of the attention mask too (``check_last_dim_stride_equals_1_dense``,
    sdp_utils_cpp.h: "GPU backends require attn_mask's last dimension to have stride 1 while the CPU does not"):
    T5's relative position bias, ``permute([2, 0, 1])`` of an embedding, has stride num_heads there, so its
    attention runs the math fallback (hfho-gen-t5v11-b16-dynamic on the H200: the (B, H, L, L) fp32 scores of
    ``_scaled_dot_product_attention_math``)."""
    b = torch.backends.cuda
    head = q.size(-1)
    if mask is not None and mask.stride(-1) != 1:
        return "math"
    qkv_last_stride_1 = q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    same_dims = q.size(-1) == k.size(-1) == v.size(-1)
    four_d = q.dim() == k.dim() == v.dim() == 4
    same_heads = four_d and q.size(-3) == k.size(-3) == v.size(-3)
    grouped_heads = four_d and enable_gqa and k.size(-3) == v.size(-3) and q.size(-3) % k.size(-3) == 0
    if (b.flash_sdp_enabled() and arch.supports_flash_attention and q.dtype in (torch.float16, torch.bfloat16)
            and mask is None and head <= 256 and same_dims and (same_heads or grouped_heads)
            and (qkv_last_stride_1 or head == 1)):
        return "flash"
    align = 4 if q.dtype is torch.float32 else 8
    dtype_ok = q.dtype in (torch.float32, torch.float16) or (q.dtype is torch.bfloat16 and arch.supports_bf16)
    if b.mem_efficient_sdp_enabled() and dtype_ok and head % align == 0 and same_heads and qkv_last_stride_1:
        return "efficient"
    return "math"



RULES = (
    Rule("SDPA backend choice", "attention", "choice", (), choose_sdpa_backend, "source",
         "aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (select_sdp_backend)", doc=choose_sdpa_backend.__doc__
         or ""),
    Rule("flash attention backward workspaces", "attention", "allocates",
         (aten._scaled_dot_product_flash_attention_backward.default,), _flash_backward, "source",
         "aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp (mha_bwd)",
         (Measurement("sm90", "H200", "torch 2.11.0+cu130, cuDNN 9.19", "evaluation/recordings/hf/runs/"
                      "hf-lora-llama1b-bf16-b8-s512 (grouped-query attention: cuDNN's one backward workspace)"),),
         doc=_flash_backward.__doc__ or ""),
    Rule("safe softmax's masks", "attention", "allocates", (aten._safe_softmax.default,), _safe_softmax, "source",
         "aten/src/ATen/native/transformers/attention.cpp (_safe_softmax)",
         (Measurement("sm90", "H200", "torch 2.11.0+cu130", "evaluation/recordings/hf_heldout/runs/"
                      "hfho-gen-t5v11-b16-dynamic (the math backend under T5's position bias)"),),
         doc=_safe_softmax.__doc__ or ""),
    Rule("memory-efficient attention backward workspaces", "attention", "allocates",
         (aten._scaled_dot_product_efficient_attention_backward.default,), _efficient_backward, "source",
         "aten/src/ATen/native/transformers/cuda/attention_backward.cu (_efficient_attention_backward)",
         (Measurement("sm90", "H200", "torch 2.11.0+cu130", "evaluation/recordings/h200/gpt-b8-fp32 (fp32 only)"),),
         doc=_efficient_backward.__doc__ or ""),
)

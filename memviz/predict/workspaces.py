"""What the real kernels allocate beyond their outputs, and the kernel choices that decide it.

Rules, not cases: each rule is keyed by an aten op and reads only the op's arguments and the target
architecture (:mod:`memviz.predict.gpus`).

- cuBLAS (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``addbmm``, ``addmv``, ``mv``, ``dot``, ``vdot``,
  ``_addmm_activation``): the first call on a thread (the main thread, autograd's backward thread) keeps
  the architecture's cuBLAS workspace; an ``addmm`` whose bias is a vector goes through cuBLASLt's bias
  epilogue (``gemm_and_bias``, ``addmm_out_cuda_impl``'s ``useLtInterface``) and also keeps the cuBLASLt
  workspace. Kept for the process: ``empty_cache()`` does not free them.
- Flash attention's backward (``mha_bwd``) holds ``softmax_d`` (B·H·round128(L) fp32) and ``dq_accum``
  (B·round128(L)·H·round32(D) fp32) while it runs; memory-efficient attention's backward in fp16/bf16 its
  fp32 grad_q accumulator.
- SDPA's backend as ``sdp_utils.cpp`` picks it for the target GPU (:func:`choose_sdpa_backend`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .fastmeta import cudnn_channels_last
from .gpus import GpuArch

__all__ = ["RULES", "TRACKS_OUTPUTS", "choose_sdpa_backend", "conv_workspace_bytes", "depthwise_workspace_bytes",
           "grouped_workspace_bytes", "reduce_scratch_bytes"]

aten = torch.ops.aten


def _thread() -> str:
    return "backward" if torch._C._current_graph_task_id() != -1 else "main"


def _keep(s: Any, kind: str, nbytes: int, op: str) -> None:
    key = (kind, _thread())
    if key not in s.workspaces and nbytes:
        ptr, _ = s.malloc(nbytes, op, "workspaces")
        s.workspaces[key] = ptr


def _cublas(s: Any, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    _keep(s, "cublas", s.arch.cublas_workspace_bytes, func.__name__)


def _addmm(s: Any, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    _keep(s, "cublas", s.arch.cublas_workspace_bytes, func.__name__)
    bias, mat1, mat2 = args[0], args[1], args[2]
    beta = kwargs.get("beta", args[3] if len(args) > 3 else 1)
    if (bias.dim() == 1 and beta == 1 and mat1.dim() == 2 and bias.size(0) == mat2.size(1) and bias.is_contiguous()
            and mat1.dtype in (torch.float32, torch.float16, torch.bfloat16) and mat1.size(0) > 1
            and mat2.size(1) > 1):
        _keep(s, "cublaslt", s.arch.cublaslt_workspace_bytes, func.__name__)


def _cudnn_workspace(s: Any, nbytes: int, op: str) -> None:
    """A convolution's workspace, held while it runs. If it does not fit, torch's ``try_plans`` catches the
    OOM and runs cuDNN's next plan: taken here as one that needs no workspace."""
    if nbytes > 0:
        ptr, index = s.malloc(nbytes, op, "workspaces", soft=True)
        if index >= 0:
            s.free(ptr, index, op)


def _round(x: int, m: int) -> int:
    return -(-x // m) * m


def _padded_pixels_bytes(nbytes: int, c_in: int, element_bytes: int) -> int:
    """``nbytes`` of ``c_in``-channel pixels copied to channels-last with each pixel padded to 16 bytes (4 fp32
    or 8 bf16 channels), as cuDNN copies operands whose channels are not 16-byte aligned."""
    return nbytes // (c_in * element_bytes) * _round(c_in * element_bytes, 16)


def _split_k_bytes(partial_bytes: int) -> int:
    """cuDNN's split-K partial results of backward-weight: as many partials of ``partial_bytes`` as fit in
    8 MiB, between 1 and 14."""
    return min(14, max(1, (8 << 20) // partial_bytes)) * partial_bytes


def _flash_backward(s: Any, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    q = args[1]  # (grad_out, query, key, value, out, logsumexp, ...): query is (B, H, L, D)
    b, h, length, d = q.shape
    lq = _round(length, 128)
    softmax_d = b * h * lq * 4
    dq_accum = b * lq * h * _round(d, 32) * 4
    ptr1, i1 = s.malloc(softmax_d, func.__name__, "workspaces")
    ptr2, i2 = s.malloc(dq_accum, func.__name__, "workspaces")
    s.free(ptr2, i2, func.__name__)
    s.free(ptr1, i1, func.__name__)


def conv_workspace_bytes(phase: str, c_in: int, c_out: int, kernel: tuple[int, ...], stride: tuple[int, ...],
                         element_bytes: int, input_bytes: int, output_bytes: int, weight_bytes: int,
                         output_pixels: int = 0, batch: int = 1, channels_last: bool = False) -> int:
    """cuDNN's workspace request in bytes for one 2-D convolution pass (``"forward"``, ``"backward_input"``,
    ``"backward_weight"``) with ``torch.backends.cudnn.benchmark=False``; ``output_pixels`` is N·H_out·W_out;
    ``channels_last`` (default False): the input or the weight is channels-last, so cuDNN runs the
    convolution in that layout (:func:`_channels_last_bytes`). The rules below are for NCHW operands.

    Measured on the H200 (cuDNN 9.19, ``evaluation/recordings/``: ``h200_probe.json.gz``, 696 geometries of
    ResNet-18/50 and a VGG-style net at batches 1/16/64, and ``h200_probe2.json.gz``, the 72 convolutions
    of the recorded programs plus 8 grid sizes at batches 32/96/128/192/256; fp32 and bf16; fitted on all
    but batches 96/192 and the grid, which check the rules). cuDNN's heuristics pick engines that
    transform the operands to channels-last, so the workspace is about one copy of each operand
    (input + output + weight); backward-weight adds split-K partial weights: as many weights as fit in
    8 MiB, between 1 and 14 (independent of the spatial size). Where the measurements show a cheaper engine:

    - 1×1 stride 1 (a GEMM): :func:`_pointwise_bytes`; 1×1 strided backward-weight: input + output (a 1×1
      weight is the same in either layout) + min(8 MiB, 64 weights) below 4 MiB weights;
    - input channels not 16-byte aligned (an RGB stem): at stride 1 a direct kernel (none in fp32, none
      forward in bf16, except fp32 backward-weight over ≤ 2^17 output pixels: the input padded to 16-byte
      pixels + the output); fp32 backward-input none; in bf16 the channels-last input is padded to 8 channels,
      and stride-1 backward-weight adds about sqrt(N·H·W)/2 partial weights; strided backward-weight as
      :func:`_unaligned_strided_backward_weight_bytes`; a strided 3×3 RGB stem (``h200_probe3.json.gz``:
      4 stems at batches 32–256) none forward, none fp32 backward-weight;
    - 1×1 strided (a ResNet downsample) with ≤ 64 input channels forward, or ≤ 128 backward-input in fp32:
      none; fp32 forward from ≥ 512 channels: input + output, from ≥ 256 channels over ≥ 32768 input
      pixels (N·H·W): input + weight;
    - a k×k fp32 forward that widens aligned channels from ≤ 64 (32→64, 64→128): input + weight (bf16:
      input + output + weight, like the rest);
    - non-overlapping patches over unaligned channels (kernel = stride, a patch embedding): :func:`_patchify_bytes`.
    """
    if channels_last:
        return _channels_last_bytes(phase, c_in, kernel, stride, element_bytes, input_bytes, output_bytes,
                                    weight_bytes)
    pointwise = all(k == 1 for k in kernel)
    unit_stride = all(st == 1 for st in stride)
    unaligned = (c_in * element_bytes) % 16 != 0
    input_pixels = input_bytes // (c_in * element_bytes)
    if pointwise and unit_stride:
        return _pointwise_bytes(phase, c_in, c_out, element_bytes, input_bytes, output_bytes, weight_bytes,
                                output_pixels, batch)
    if unaligned and kernel == stride:
        return _patchify_bytes(phase, c_in, c_out, kernel, element_bytes, input_bytes, output_bytes, weight_bytes,
                               batch)
    if (unaligned and unit_stride and element_bytes == 4 and phase == "backward_weight"
            and output_pixels <= 1 << 17):
        return _padded_pixels_bytes(input_bytes, c_in, element_bytes) + output_bytes
    if unaligned and ((unit_stride and (element_bytes == 4 or phase == "forward"))
                      or (phase == "backward_input" and element_bytes == 4)):
        return 0
    if unaligned and max(kernel) <= 3 and (phase == "forward" or (phase == "backward_weight" and element_bytes == 4)):
        return 0  # a 3×3 stride-2 RGB stem (MobileNet's): a direct kernel (h200_probe3.json.gz)
    if pointwise and ((phase == "forward" and c_in <= 64)
                      or (phase == "backward_input" and c_in <= 128 and element_bytes == 4)):
        return 0
    if pointwise and phase == "forward" and c_in >= 512 and element_bytes == 4:
        return input_bytes + output_bytes
    if pointwise and phase == "forward" and c_in >= 256 and input_pixels >= 1 << 15 and element_bytes == 4:
        return input_bytes + weight_bytes
    if phase == "forward" and not pointwise and not unaligned and c_in <= 64 and c_out > c_in and element_bytes == 4:
        return input_bytes + weight_bytes
    if pointwise and phase == "backward_weight" and not unaligned:  # strided 1×1: the weight needs no copy
        return input_bytes + output_bytes + (min(8 << 20, 64 * weight_bytes) if weight_bytes < 4 << 20 else 0)
    if unaligned and phase == "backward_weight" and not unit_stride:
        return _unaligned_strided_backward_weight_bytes(c_in, c_out, kernel, element_bytes, input_bytes,
                                                        output_bytes, output_pixels)
    if unaligned and element_bytes == 2:
        input_bytes = _padded_pixels_bytes(input_bytes, c_in, element_bytes)
    workspace = input_bytes + output_bytes + weight_bytes
    if phase == "backward_weight":
        if unaligned:
            workspace += int(output_pixels ** 0.5 / 2) * weight_bytes
        else:
            workspace += _split_k_bytes(weight_bytes)
    return workspace


def _channels_last_bytes(phase: str, c_in: int, kernel: tuple[int, ...], stride: tuple[int, ...],
                         element_bytes: int, input_bytes: int, output_bytes: int, weight_bytes: int) -> int:
    """A dense convolution in channels-last: nothing to transform, so forward and backward-input ask no
    workspace (a few hundred bytes measured), and backward-weight only its split-K partial weights, in fp32
    (``w4`` = the weight's elements × 4 bytes) whatever the dtype: a k×k kernel as many as fit in 8 MiB,
    between 1 and 14; a 1×1 kernel 128, up to 16 MiB at stride 1 in fp32, else 8 MiB.

    An RGB stem (input channels not 16-byte aligned) pads each pixel to 16 bytes (4 fp32 or 8 bf16
    channels): forward fp32 input + weight, bf16 the padded two; backward-input fp32 input + output,
    bf16 the padded input; backward-weight the padded input (+ the output in fp32) + 121 padded partial
    weights.

    Measured on the H200 (``h200_probe5.json.gz``: the fitted ResNet-50's 23 convolutions at 224² with
    channels-last input and weight, batches 16/41/64/128, fp32 and bf16; the rules over-ask by up to 8 MiB
    per convolution where cuDNN picks a plan with fewer partials, mostly in bf16 below 128 images)."""
    unaligned = (c_in * element_bytes) % 16 != 0
    if unaligned:
        padded_input_bytes = _padded_pixels_bytes(input_bytes, c_in, element_bytes)
        padded_weight_bytes = _padded_pixels_bytes(weight_bytes, c_in, element_bytes)
        fp32 = element_bytes == 4
        if phase == "forward":
            return input_bytes + weight_bytes if fp32 else padded_input_bytes + padded_weight_bytes
        if phase == "backward_input":
            return input_bytes + output_bytes if fp32 else padded_input_bytes
        return padded_input_bytes + (output_bytes if fp32 else 0) + 121 * padded_weight_bytes
    if phase != "backward_weight":
        return 0
    w4 = weight_bytes // element_bytes * 4
    if all(k == 1 for k in kernel):
        unit_stride = all(st == 1 for st in stride)
        return min((16 << 20) if unit_stride and element_bytes == 4 else (8 << 20), 128 * w4)
    return _split_k_bytes(w4)


def depthwise_workspace_bytes(phase: str, channels: int, kernel: tuple[int, ...], element_bytes: int,
                              input_bytes: int, batch: int, channels_last: bool) -> int:
    """cuDNN's workspace request in bytes for one pass of a depthwise 2-D convolution (groups = input
    channels = output channels), as :func:`conv_workspace_bytes` for dense ones.

    Contiguous (NCHW) ones run PyTorch's own depthwise kernels or cuDNN with no workspace. Channels-last
    ones (``cudnn_conv_suggest_memory_format``) run cuDNN: no forward or backward-input workspace; in
    backward-weight bf16 takes 8 fp32 partial weights per image (batch × 8 × channels × k² × 4 bytes);
    fp32, for a 7×7 kernel over fewer than 256 channels, 8 copies of the input and 528 fp32 partial
    weights, and under 4.4 MB (taken as none) otherwise.

    Measured on the H200 (``h200_probe4.json.gz`` and ``h200_probe5.json.gz``: 3×3/5×5/7×7 kernels, stride 1
    and 2, 64–512 channels on 112² to 7² maps, batches 16–128, fp32 and bf16): bf16 exact in all 64
    channels-last cases; fp32 7×7 over 64 channels on 56² and 128 on 28²: 8 inputs + 528 partials (+ 2.5 kB)
    at batch 16, and over 64 channels at every batch; 8 inputs + 272 partials over 128 channels from 41
    images; none over 256 channels on 14² and 512 on 7². (The held-out ConvNeXt-like run,
    ``ho-cnx-b16-fp32``, later showed 48 and 96 channels as the rule says, 192 on 14² with 272 partials, and
    384 on 7² with none.)"""
    if not channels_last or phase != "backward_weight":
        return 0
    taps = math.prod(kernel)
    if element_bytes == 2:
        return batch * 8 * channels * taps * 4
    return 8 * input_bytes + 528 * channels * taps * 4 if taps >= 49 and channels < 256 else 0


def grouped_workspace_bytes(phase: str, c_in: int, groups: int, element_bytes: int, input_bytes: int,
                            output_bytes: int, weight_bytes: int) -> int:
    """cuDNN's workspace request in bytes for one pass of a grouped 2-D convolution on NCHW operands (8 or more
    groups, fewer than the input channels), as :func:`conv_workspace_bytes` for dense ones: the operands copied to
    channels-last with each group's channels padded to the next power of two, at least 4, the input and the
    output by that factor, the weight by its square; every pass alike.

    Measured on the H200 (``h200_probe4.json.gz``: 3×3 kernels with 2, 6, 8, 12, 24 and 32 channels per group
    (8–64 groups, 56² to 7², stride 1 and 2), batches 32–256, fp32 and bf16): forward and backward-input to
    within 147 bytes; backward-weight adds split-K partials that vary with the batch (0–209 padded weights,
    at most 31 MB; taken as none: 9.0% of the probe's bytes either way). Where cuDNN asks none: fp32
    backward-input with fewer than 8 channels per group, bf16 forward and backward-weight with 2."""
    per_group = c_in // groups
    if (phase == "backward_input" and element_bytes == 4 and per_group < 8) or \
            (phase != "backward_input" and element_bytes == 2 and per_group == 2):
        return 0
    padded = max(4, 1 << (per_group - 1).bit_length())
    return (input_bytes + output_bytes) * padded // per_group + weight_bytes * padded * padded // per_group ** 2


def _pointwise_bytes(phase: str, c_in: int, c_out: int, element_bytes: int, input_bytes: int, output_bytes: int,
                     weight_bytes: int, output_pixels: int, batch: int) -> int:
    """A 1×1 stride-1 convolution (a GEMM over the N·H·W pixels).

    Backward-weight takes the smaller of two plans: the reduction split per image, one fp32 partial
    weight per image (N·c_out·c_in·4 bytes), or the channels-last path, input + output + weight; in fp32
    over fewer than 64 input channels and fewer than 64 images, always the channels-last path.
    Forward and backward-input need nothing, except between 512 and ≥ 2048 channels on at most 8×8
    pixels, where cuDNN goes channels-last: input + output (a 1×1 weight is the same in either layout).
    Fitted on the probes' batches 1/16/32/64/128/256 (``h200_probe.json.gz``, ``h200_probe2.json.gz``),
    checked on 96/192 and on the 20²/40² grid (``tests/test_predict_workspaces.py``); the fp32 exception from
    ``h200_probe6.json.gz`` (MobileNetV2's 16→96, 24→144, 32→16 and 32→192 at batches 24–96: the
    channels-last path at every batch below 64, the per-image split from 64 on)."""
    if phase == "backward_weight":
        channels_last_path = input_bytes + output_bytes + weight_bytes
        if element_bytes == 4 and c_in < 64 and batch < 64:
            return channels_last_path
        return min(batch * c_out * c_in * 4, channels_last_path)
    if max(c_in, c_out) >= 2048 and output_pixels <= 64 * batch:
        return input_bytes + output_bytes
    return 0


def _patchify_bytes(phase: str, c_in: int, c_out: int, kernel: tuple[int, ...], element_bytes: int,
                    input_bytes: int, output_bytes: int, weight_bytes: int, batch: int) -> int:
    """A patch embedding: a convolution whose kernel equals its stride over channels that are not 16-byte
    aligned (RGB; ViT's 16×16/16, ConvNeXt's and Swin's 4×4/4).

    Measured on the H200 (``h200_probe3.json.gz``: 3→96/128 at 4×4 and 3→384/768 at 16×16;
    ``h200_probe4.json.gz``: 3→64/192 at 4×4 and 3→192/256 at 16×16; 224² images, batches 32–256, fp32 and
    bf16). Where cuDNN needs a workspace it copies the input to channels-last with 16-byte pixels (4 fp32
    or 8 bf16 channels) and the weight likewise ("padded"):

    - forward, 4×4 patches: fp32 none (3→96 from 96 images asks padded input + weight: not modelled); bf16
      none below 256 images, else padded input + output + padded weight;
    - forward, 16×16 patches: bf16 none below 512 output channels, else the three; fp32 none up to 32
      images, the three below 256, padded input + padded weight from 256;
    - backward-input: none, except 4×4 bf16 patches: input + output + weight;
    - backward-weight: none for 4×4 fp32 patches; else padded input + output + split-K partial weights of
      the padded size: 499 for 4×4 bf16 patches, 9 for 16×16 bf16 (7 under 96 images), 1 for 16×16 fp32
      (121 for 256–384 output channels from 128 images).
    """
    taps = math.prod(kernel)
    padded_input_bytes = _padded_pixels_bytes(input_bytes, c_in, element_bytes)
    padded_weight_bytes = _padded_pixels_bytes(weight_bytes, c_in, element_bytes)
    small_patch = taps <= 16
    if phase == "forward":
        if small_patch:
            return 0 if element_bytes == 4 or batch < 256 else padded_input_bytes + output_bytes + padded_weight_bytes
        if (element_bytes == 2 and c_out < 512) or (element_bytes == 4 and batch <= 32):
            return 0
        return padded_input_bytes + padded_weight_bytes + (output_bytes if element_bytes == 2 or batch < 256 else 0)
    if phase == "backward_input":
        return input_bytes + output_bytes + weight_bytes if element_bytes == 2 and small_patch else 0
    if element_bytes == 4 and small_patch:
        return 0
    if element_bytes == 4:
        splits = 121 if 256 <= c_out <= 384 and batch >= 128 else 1
    else:
        splits = 499 if small_patch else 7 if batch < 96 else 9
    return padded_input_bytes + output_bytes + splits * padded_weight_bytes


def _unaligned_strided_backward_weight_bytes(c_in: int, c_out: int, kernel: tuple[int, ...], element_bytes: int,
                                             input_bytes: int, output_bytes: int, output_pixels: int) -> int:
    """Backward-weight of a strided convolution whose input channels are not 16-byte aligned (an RGB stem).

    cuDNN copies the input to channels-last with each pixel padded to 16 bytes (4 fp32 or 8 bf16
    channels), keeps the output gradient and an fp32 weight gradient, and splits the reduction over the
    N·H_out·W_out output pixels into partial weights in the padded layout (c_out·k·k·16 bytes each). The
    split count grows about as sqrt(N·H_out·W_out) / element_bytes, between 36 and 120 (saturated from
    about 480² output pixels in fp32, 240² in bf16). Fitted on the probe's 224×224 and 64×64 stems, checked on
    the held-out 160×160 ones (``tests/test_predict_workspaces.py``)."""
    taps = math.prod(kernel)
    padded_input_bytes = _padded_pixels_bytes(input_bytes, c_in, element_bytes)
    partial_bytes = c_out * taps * _round(c_in * element_bytes, 16)
    splits = min(120, max(36, int(output_pixels ** 0.5) // element_bytes))
    return padded_input_bytes + output_bytes + c_out * c_in * taps * 4 + splits * partial_bytes


def _conv_workspace(phase: str, inp: torch.Tensor, weight: torch.Tensor, output_numel: int, stride: Any,
                    transposed: bool, groups: int) -> int | None:
    """The workspace one convolution pass asks, from its operands; None where no rule covers it."""
    if transposed or inp.dim() != 4 or not inp.is_floating_point():
        return None
    es = inp.element_size()
    c_in, c_out = inp.size(1), weight.size(0)
    channels_last = cudnn_channels_last(inp, weight)
    if groups == c_in == c_out:
        return depthwise_workspace_bytes(phase, c_in, tuple(weight.shape[2:]), es, inp.numel() * es, inp.size(0),
                                         channels_last)
    if groups != 1:
        if channels_last or groups < 8:
            return None
        return grouped_workspace_bytes(phase, c_in, groups, es, inp.numel() * es, output_numel * es,
                                       weight.numel() * es)
    return conv_workspace_bytes(phase, c_in, c_out, tuple(weight.shape[2:]), tuple(stride), es, inp.numel() * es,
                                output_numel * es, weight.numel() * es, output_numel // c_out, inp.size(0),
                                channels_last)


_UNMODELLED_CONV = ("convolutions in fewer than 8 groups or channels-last groups (not depthwise), transposed or "
                    "non-2-D: no cuDNN workspace is modelled")


def _conv_forward(s: Any, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    nbytes = _conv_workspace("forward", args[0], args[1], out.numel(), args[3], args[6], args[8])
    if nbytes is None:
        s.note(_UNMODELLED_CONV)
    else:
        _cudnn_workspace(s, nbytes, "cudnn_convolution")


def _conv_backward(s: Any, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    """cuDNN runs backward-input then backward-weight, each allocating its result, then its workspace."""
    grad_out, inp, weight = args[0], args[1], args[2]
    name = func.__name__
    for phase, result in zip(("backward_input", "backward_weight", "bias"), out, strict=True):
        if result is None:
            continue
        s.track(result, name)
        if phase == "bias":
            _bias_reduction(s, grad_out, name)
            continue
        nbytes = _conv_workspace(phase, inp, weight, grad_out.numel(), args[4], args[7], args[9])
        if nbytes is None:
            s.note(_UNMODELLED_CONV)
        else:
            _cudnn_workspace(s, nbytes, "cudnn_convolution_backward")


def _bias_reduction(s: Any, grad_out: torch.Tensor, op: str) -> None:
    """The bias gradient: ``convolution_backward`` sums the output gradient over every dimension but the
    channels after the backend's own passes (``Convolution.cpp``), with the reduction kernel's scratch."""
    if not grad_out.is_contiguous() or grad_out.dim() < 3:
        return
    reduce_dims = {d for d in range(grad_out.dim()) if d != 1}
    buffer_bytes, semaphore_bytes = reduce_scratch_bytes(s.arch, tuple(grad_out.shape), reduce_dims,
                                                         grad_out.element_size(), 4, grad_out.storage_offset())
    if buffer_bytes:
        ptr1, i1 = s.malloc(buffer_bytes, op, "workspaces")
        ptr2, i2 = s.malloc(semaphore_bytes, op, "workspaces")
        s.free(ptr2, i2, op)
        s.free(ptr1, i1, op)


def _efficient_backward(s: Any, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
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
        product = s.malloc(b * h * length * d * 4, name, "workspaces")
        summed = s.malloc(b * h * length * 4, name, "workspaces")
        delta = s.malloc(b * h * length * 4, name, "workspaces")
        s.free(*summed, name)
        s.free(*product, name)
    else:
        delta = s.malloc(b * h * length * 4, name, "workspaces")
    tiles = -(-length // 64) * -(-d // 64)
    workspace = s.malloc(b * h * _round(tiles * (64 * 64 + 4), 4) * 4, name, "workspaces")
    s.free(*delta, name)  # a local of the kernel launch; the workspace lives to the end of the function
    s.free(*workspace, name)


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


def _reduction(s: Any, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
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
    buffer_bytes, semaphore_bytes = reduce_scratch_bytes(s.arch, tuple(inp.shape), reduce_dims,
                                                         inp.element_size(), acc_bytes, inp.storage_offset())
    if buffer_bytes:
        name = func.__name__
        ptr1, i1 = s.malloc(buffer_bytes, name, "workspaces")
        ptr2, i2 = s.malloc(semaphore_bytes, name, "workspaces")
        s.free(ptr2, i2, name)
        s.free(ptr1, i1, name)


def _contiguous_copies(s: Any, tensors: tuple, op: str) -> list[tuple[int, int]]:
    """``expect_contiguous()`` of each non-contiguous tensor: a contiguous copy the kernel reads, allocated
    before its outputs and freed when it returns."""
    return [s.malloc(t.numel() * t.element_size(), op, "temporaries") for t in tensors
            if isinstance(t, torch.Tensor) and t.numel() and not t.is_contiguous()]


def _track_outputs(s: Any, out: Any, op: str) -> None:
    for t in out if isinstance(out, (tuple, list)) else (out,):
        if isinstance(t, torch.Tensor) and t.is_meta:
            s.track(t, op)


def _layer_norm(s: Any, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    """``layer_norm_cuda`` / ``layer_norm_backward_cuda`` (``aten/src/ATen/native/cuda/layer_norm_kernel.cu``)
    take ``expect_contiguous()`` of the input (and of the output gradient, in backward) before allocating
    their outputs: a non-contiguous input (the residual sum after ``nn.MultiheadAttention`` with
    ``batch_first``, which returns a transposed view) costs one input-sized copy while the kernel runs (the
    H200 trace of torchvision's ViT-B/16: two 77,463,552 B allocations and the statistics per ``ln_2``)."""
    name = func.__name__
    inputs = (args[0],) if func is aten.native_layer_norm.default else (args[0], args[1])
    copies = _contiguous_copies(s, inputs, name)
    _track_outputs(s, out, name)
    for ptr, index in reversed(copies):
        s.free(ptr, index, name)


TRACKS_OUTPUTS = frozenset({aten.convolution_backward.default, aten.native_layer_norm.default,
                            aten.native_layer_norm_backward.default})
"""Rules that account the op's outputs themselves (to interleave them with workspaces as the kernel does)."""

RULES: dict[Any, Any] = {
    aten.convolution.default: _conv_forward,
    aten.convolution_backward.default: _conv_backward,
    **dict.fromkeys([aten.mm.default, aten.bmm.default, aten.baddbmm.default, aten.addbmm.default,
                     aten.addmv.default, aten.mv.default, aten.dot.default, aten.vdot.default,
                     aten._addmm_activation.default], _cublas),
    aten.addmm.default: _addmm,
    aten.native_layer_norm.default: _layer_norm,
    aten.native_layer_norm_backward.default: _layer_norm,
    aten._scaled_dot_product_flash_attention_backward.default: _flash_backward,
    aten._scaled_dot_product_efficient_attention_backward.default: _efficient_backward,
    **dict.fromkeys([aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default], _reduction),
}
"""aten op → ``rule(session, op, args, kwargs, outputs)`` adding the op's library allocations."""


def choose_sdpa_backend(arch: GpuArch, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any,
                        dropout_p: float, enable_gqa: bool) -> str:
    """``"flash"``, ``"efficient"`` or ``"math"``: the first backend whose constraints the inputs meet,
    in torch's default priority order (flash, memory-efficient, math), honouring
    ``torch.backends.cuda.enable_*_sdp``. Constraints (``sdp_utils.cpp``): flash needs sm80+, fp16/bf16,
    no attention mask, head dim ≤ 256, 4-D inputs; memory-efficient needs sm50+, fp32/fp16 (bf16 on sm80+),
    head dim a multiple of 8 for fp16/bf16 (4 for fp32)."""
    b = torch.backends.cuda
    head = q.size(-1)
    same_heads = q.size(-1) == k.size(-1) == v.size(-1)
    four_d = q.dim() == k.dim() == v.dim() == 4
    if (b.flash_sdp_enabled() and arch.supports_flash_attention and q.dtype in (torch.float16, torch.bfloat16)
            and mask is None and head <= 256 and four_d and same_heads and not enable_gqa):
        return "flash"
    align = 4 if q.dtype is torch.float32 else 8
    dtype_ok = q.dtype in (torch.float32, torch.float16) or (q.dtype is torch.bfloat16 and arch.supports_bf16)
    if b.mem_efficient_sdp_enabled() and dtype_ok and head % align == 0 and four_d and not enable_gqa:
        return "efficient"
    return "math"

"""cuDNN convolutions: the workspace each pass asks, and the channels-last outputs cuDNN returns.

``torch.backends.cudnn.benchmark=False`` (the default): cuDNN's heuristics pick one plan per call; its workspace is
requested after the pass's result and freed when the pass returns. If it does not fit, torch's ``try_plans`` catches
the OOM and runs cuDNN's next plan: taken here as one that needs no workspace. Backward runs backward-input, then
backward-weight, each allocating its result then its workspace, then the bias gradient (a reduction). A convolution
whose input or weight is channels-last (``cudnn_conv_suggest_memory_format``) runs cuDNN in that layout and
returns channels-last outputs and gradients (the meta kernels return contiguous ones).

The workspace sizes are measured, on the H200 only (cuDNN 9.19; the probes of ``evaluation/recordings/``, see
each function); other architectures get them with a note. The layout rule is torch's source
(``aten/src/ATen/native/ConvUtils.h``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..device import DeviceMemory
from . import Measurement, Rule
from .reductions import reduce_scratch_bytes

__all__ = ["RULES", "conv_workspace_bytes", "cudnn_channels_last", "depthwise_workspace_bytes",
           "grouped_workspace_bytes"]

aten = torch.ops.aten

_CUDNN = "torch 2.11.0+cu130, cuDNN 9.19"
EVIDENCE = (
    Measurement("sm90", "H200", _CUDNN, "evaluation/recordings/h200_probe.json.gz: 696 geometries of ResNet-18/50 "
                "and a VGG-style net, batches 1/16/64, fp32 and bf16"),
    Measurement("sm90", "H200", _CUDNN, "evaluation/recordings/h200_probe2.json.gz: the recorded programs' 72 "
                "convolutions and 8 grid sizes, batches 32/96/128/192/256, fp32 and bf16"),
    Measurement("sm90", "H200", _CUDNN, "evaluation/recordings/h200_probe3.json.gz and h200_probe4.json.gz: "
                "patchify stems, 3x3/2 RGB stems, patch merging, depthwise and grouped convolutions"),
    Measurement("sm90", "H200", _CUDNN, "evaluation/recordings/h200_probe5.json.gz and h200_probe6.json.gz: "
                "channels-last dense and depthwise convolutions; narrow fp32 1x1 convolutions, batches 16-128"),
)


def _cudnn_workspace(memory: DeviceMemory, nbytes: int, op: str) -> None:
    """A convolution's workspace, held while it runs. If it does not fit, torch's ``try_plans`` catches the
    OOM and runs cuDNN's next plan: taken here as one that needs no workspace."""
    if nbytes > 0:
        workspace = memory.try_malloc(nbytes, op, "workspaces")
        if workspace is not None:
            memory.free(workspace, op)


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
    checked on 96/192 and on the 20²/40² grid (``tests/test_predict_rules_conv.py``); the fp32 exception from
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
    the held-out 160×160 ones (``tests/test_predict_rules_conv.py``)."""
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


def _conv_forward(memory: DeviceMemory, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    nbytes = _conv_workspace("forward", args[0], args[1], out.numel(), args[3], args[6], args[8])
    if nbytes is None:
        memory.note(_UNMODELLED_CONV)
    else:
        _cudnn_workspace(memory, nbytes, "cudnn_convolution")


def _conv_backward(memory: DeviceMemory, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
    """cuDNN runs backward-input then backward-weight, each allocating its result, then its workspace."""
    grad_out, inp, weight = args[0], args[1], args[2]
    name = func.__name__
    for phase, result in zip(("backward_input", "backward_weight", "bias"), out, strict=True):
        if result is None:
            continue
        memory.track(result, name)
        if phase == "bias":
            _bias_reduction(memory, grad_out, name)
            continue
        nbytes = _conv_workspace(phase, inp, weight, grad_out.numel(), args[4], args[7], args[9])
        if nbytes is None:
            memory.note(_UNMODELLED_CONV)
        else:
            _cudnn_workspace(memory, nbytes, "cudnn_convolution_backward")


def _bias_reduction(memory: DeviceMemory, grad_out: torch.Tensor, op: str) -> None:
    """The bias gradient: ``convolution_backward`` sums the output gradient over every dimension but the
    channels after the backend's own passes (``Convolution.cpp``), with the reduction kernel's scratch."""
    if not grad_out.is_contiguous() or grad_out.dim() < 3:
        return
    reduce_dims = {d for d in range(grad_out.dim()) if d != 1}
    buffer_bytes, semaphore_bytes = reduce_scratch_bytes(memory.arch, tuple(grad_out.shape), reduce_dims,
                                                         grad_out.element_size(), 4, grad_out.storage_offset())
    if buffer_bytes:
        buffer = memory.malloc(buffer_bytes, op, "workspaces")
        memory.free(memory.malloc(semaphore_bytes, op, "workspaces"), op)
        memory.free(buffer, op)




def _channels_last(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() == 4 and \
        torch._prims_common.suggest_memory_format(t) is torch.channels_last


def cudnn_channels_last(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """``cudnn_conv_suggest_memory_format(input, weight) == ChannelsLast`` (``ConvUtils.h``): a 4-D, non-double
    convolution whose input or weight is channels-last. ``select_conv_backend`` then takes cuDNN, depthwise
    ones included (``use_cudnn_depthwise``), whose outputs and gradients are channels-last."""
    return x.is_meta and x.dim() == 4 and torch.float64 not in (x.dtype, weight.dtype) and \
        (_channels_last(x) or _channels_last(weight))


def _channels_last_outputs(func: Any, args: tuple, kwargs: dict) -> Any:
    """A convolution in channels-last returns channels-last outputs; NotImplemented where the meta kernel is right."""
    if func is aten.convolution.default:
        if kwargs or not cudnn_channels_last(args[0], args[1]):
            return NotImplemented
        return torch.empty_like(func(*args), memory_format=torch.channels_last)
    if kwargs or not cudnn_channels_last(args[1], args[2]):
        return NotImplemented
    return tuple(g if g is None or g.dim() != 4 else torch.empty_like(g, memory_format=torch.channels_last)
                 for g in func(*args))


RULES = (
    Rule("cuDNN convolution workspaces", "cudnn_conv", "allocates", (aten.convolution.default,), _conv_forward,
         "measured", "aten/src/ATen/native/cudnn/Conv_v8.cpp (try_plans); cuDNN's heuristics", EVIDENCE,
         doc=conv_workspace_bytes.__doc__ or ""),
    Rule("cuDNN convolution workspaces", "cudnn_conv", "allocates", (aten.convolution_backward.default,),
         _conv_backward, "measured", "aten/src/ATen/native/Convolution.cpp (convolution_backward); Conv_v8.cpp",
         EVIDENCE, tracks_outputs=True, doc=_conv_backward.__doc__ or ""),
    Rule("channels-last convolution outputs", "cudnn_conv", "outputs",
         (aten.convolution.default, aten.convolution_backward.default), _channels_last_outputs, "source",
         "aten/src/ATen/native/ConvUtils.h (cudnn_conv_suggest_memory_format)", doc=cudnn_channels_last.__doc__ or ""),
)

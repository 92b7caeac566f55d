"""CUDA's autocast and CUDA's kernel choices, emulated on meta tensors.

Meta tensors carry no autocast dispatch key, so ``torch.autocast("cuda")`` casts nothing on them. The
predictor registers, for the duration of one prediction, a Python kernel per autocast-listed op on a
dispatch key no real tensor uses here (``AutocastIPU``) and includes that key in the thread's dispatch
set. The kernels sit where CUDA's own autocast kernels sit (above autograd), so the casts are recorded
by autograd and the tensors saved for backward are the cast copies, as on a GPU.

The op lists are CUDA's (``aten/src/ATen/autocast_mode.h``: ``AT_FORALL_LOWER_PRECISION_FP``,
``AT_FORALL_FP32``, ``AT_FORALL_FP32_SET_OPT_DTYPE``, ``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE``,
``AT_FORALL_PROMOTE``), intersected with what the installed torch registers for ``AutocastCUDA``. The cast
cache follows ``at::autocast::cached_cast``: fp32 leaf tensors that require grad (parameters) are cast
once per outermost autocast region and the copy is kept until the region ends; under ``inference_mode``
each use casts again where the installed torch does so (:func:`caches_under_inference_mode`).

The same key carries the CUDA-only decisions of composite ops that would otherwise take their CPU/meta
path: ``scaled_dot_product_attention`` picks flash / memory-efficient / math as
``sdp_utils.cpp`` does for the target GPU, and ``dropout`` uses the fused ``native_dropout`` (a bool mask)
as CUDA does (``is_fused_kernel_acceptable``).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["POLICIES", "CudaEmulation"]

_KEY = torch._C.DispatchKey.AutocastIPU
_KEYSET = torch._C.DispatchKeySet(_KEY)

LOWER, FP32, SET_OPT_DTYPE, APPEND_DTYPE, PROMOTE, BANNED = (
    "lower_precision_fp", "fp32", "fp32_set_opt_dtype", "fp32_append_dtype", "promote", "banned")

_LOWER = """_convolution.deprecated _convolution conv1d conv2d conv3d conv_tbc conv_transpose1d
conv_transpose2d.input conv_transpose3d.input convolution prelu addmm addmv addr matmul einsum mm mv linalg_vecdot
linear addbmm baddbmm bmm chain_matmul linalg_multi_dot _thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell
gru_cell rnn_tanh_cell rnn_relu_cell _scaled_dot_product_flash_attention scaled_dot_product_attention
cudnn_convolution cudnn_convolution_transpose"""
_FP32 = """acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow.Tensor_Scalar
pow.Tensor_Tensor pow.Scalar softplus layer_norm native_layer_norm group_norm rms_norm frobenius_norm.dim
nuclear_norm nuclear_norm.dim cosine_similarity poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d
hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss mse_loss margin_ranking_loss multilabel_margin_loss
soft_margin_loss triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm
logsumexp upsample_nearest1d _upsample_nearest_exact1d upsample_nearest2d _upsample_nearest_exact2d
upsample_nearest3d _upsample_nearest_exact3d upsample_linear1d upsample_bilinear2d _upsample_bilinear2d_aa
upsample_trilinear3d upsample_bicubic2d _upsample_bicubic2d_aa"""
_SET_OPT = """prod prod.dim_int softmax.int log_softmax.int cumprod cumsum linalg_vector_norm linalg_matrix_norm
linalg_matrix_norm.str_ord sum sum.dim_IntList"""
_APPEND = "norm.Scalar norm.ScalarOpt_dim"
_PROMOTE = "addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add"

POLICIES: dict[str, str] = {}
for _names, _policy in ((_LOWER, LOWER), (_FP32, FP32), (_SET_OPT, SET_OPT_DTYPE), (_APPEND, APPEND_DTYPE),
                        (_PROMOTE, PROMOTE), ("binary_cross_entropy", BANNED)):
    POLICIES.update(dict.fromkeys(_names.split(), _policy))
"""CUDA autocast's policy per op (``name.overload``), from torch's ``autocast_mode.h``."""

_APPEND_TARGET = {"norm.Scalar": ("norm", "ScalarOpt_dtype"), "norm.ScalarOpt_dim": ("norm", "ScalarOpt_dim_dtype")}


def _op(name: str) -> torch._ops.OpOverload:
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


class _CountCasts(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.casts = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.casts += func in (torch.ops.aten._to_copy.default, torch.ops.aten.to.dtype)
        return func(*args, **(kwargs or {}))


@functools.cache
def caches_under_inference_mode() -> bool:
    """Whether the installed torch's autocast keeps its weight casts under ``torch.inference_mode()``.

    torch 2.11 casts a parameter again at each use there (pytorch#165068; the H200's inference recordings
    free each bf16 weight copy right after its op), older builds kept one copy per region. Measured once, on
    CPU autocast (the same ``cached_cast``): ``mm(w, w)`` of one fp32 parameter casts it once when cached."""
    weight = torch.nn.Parameter(torch.ones(2, 2))
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16), _CountCasts() as count:
        torch.mm(weight, weight)
    return count.casts == 1


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
"""Tensors that are no subclass (``at::areAnyTensorSubclassLike`` is False for them on the GPU)."""


def _additive_mask(attn_mask: Any, dtype: torch.dtype) -> Any:
    """``convert_boolean_attn_mask`` (attention.cpp), before the memory-efficient and math kernels: a bool mask
    becomes ``where(mask, 0.0, scalar_tensor(-inf, dtype))``, a mask-shaped tensor of the query's dtype that the
    fused kernel keeps for its backward (the H200, hfho-mistral290m-b2-s2048-nosw-bf16: two 2 B scalars and a
    16,777,216 B (2, 1, 2048, 2048) bf16 mask per layer, alive until backward); a float mask passes through."""
    if attn_mask is None or attn_mask.dtype is not torch.bool:
        return attn_mask
    return torch.where(attn_mask, 0.0, torch.scalar_tensor(float("-inf"), dtype=dtype, device=attn_mask.device))


class CudaEmulation:
    """CUDA autocast and CUDA kernel choices for meta tensors, active between ``enter()`` and ``exit()``.

    Args:
        is_device: whether a tensor stands for a GPU tensor (autocast casts only those).
        choose_sdpa: ``(query, key, value, attn_mask, dropout_p, enable_gqa) -> "flash" | "efficient" |
            "math"``, the target GPU's choice.
        on_host_outputs: called with tensors that CUDA keeps on the host (flash's philox seed/offset).
    """

    def __init__(self, is_device: Callable[[torch.Tensor], bool], choose_sdpa: Callable[..., str],
                 on_host_outputs: Callable[..., None]) -> None:
        self.is_device = is_device
        self.choose_sdpa = choose_sdpa
        self.on_host_outputs = on_host_outputs
        self.cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._caches_under_inference_mode = caches_under_inference_mode()
        self._lib: torch.library.Library | None = None
        self._fallthrough: torch.library.Library | None = None
        self._guard: Any = None
        self._was_excluded = True

    # ---- lifetime

    def enter(self) -> None:
        lib = torch.library.Library("aten", "IMPL")
        registered = set(torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name, policy in POLICIES.items():
                if name == "scaled_dot_product_attention" or ("aten::" + name) not in registered:
                    continue
                lib.impl(name, self._kernel(_op(name), policy, name), _KEY.name)
            lib.impl("scaled_dot_product_attention", self._sdpa, _KEY.name)
            lib.impl("dropout", self._dropout, _KEY.name)
        fallthrough = torch.library.Library("_", "IMPL")  # every other op passes the key by
        fallthrough.fallback(torch.library.fallthrough_kernel, _KEY.name)
        self._lib = lib
        self._fallthrough = fallthrough
        self._was_excluded = torch._C._dispatch_tls_is_dispatch_key_excluded(_KEY)
        torch._C._dispatch_tls_set_dispatch_key_excluded(_KEY, False)
        self._guard = torch._C._IncludeDispatchKeyGuard(_KEY)
        self._guard.__enter__()

    def exit(self) -> None:
        if self._guard is not None:
            self._guard.__exit__(None, None, None)
            self._guard = None
        torch._C._dispatch_tls_set_dispatch_key_excluded(_KEY, self._was_excluded)
        if self._lib is not None:
            self._lib._destroy()
            self._fallthrough._destroy()
            self._lib = None
        self.cache.clear()

    def clear_cache(self) -> None:
        """``torch.clear_autocast_cache()``: the outermost autocast region ended."""
        self.cache.clear()

    # ---- casting (at::autocast::cached_cast)

    def _eligible(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype is not torch.float64 \
            and self.is_device(t)

    def _cast(self, dtype: torch.dtype, t: Any) -> Any:
        if isinstance(t, (list, tuple)):
            return type(t)(self._cast(dtype, x) for x in t)
        if not self._eligible(t) or t.dtype is dtype:
            return t
        cacheable = (dtype is torch.get_autocast_dtype("cuda") and t.dtype is torch.float32 and t.requires_grad
                     and t.is_leaf and not t._is_view() and torch.is_autocast_cache_enabled()
                     and (self._caches_under_inference_mode or not torch.is_inference_mode_enabled()))
        if cacheable:
            hit = self.cache.get(id(t))
            if hit is not None and hit[0] is t:
                return hit[1]
        out = t.to(dtype)
        if cacheable:
            self.cache[id(t)] = (t, out)
        return out

    def _kernel(self, op: torch._ops.OpOverload, policy: str, name: str) -> Callable[..., Any]:
        schema_args = op._schema.arguments
        dtype_index = next((i for i, a in enumerate(schema_args) if a.name == "dtype"), None)
        dtype_kwarg_only = dtype_index is not None and schema_args[dtype_index].kwarg_only
        append = _op(".".join(_APPEND_TARGET[name])) if policy == APPEND_DTYPE else None

        def kernel(*args: Any, **kwargs: Any) -> Any:
            with torch._C._ExcludeDispatchKeyGuard(_KEYSET):
                if not torch.is_autocast_enabled("cuda"):
                    return op(*args, **kwargs)
                low = torch.get_autocast_dtype("cuda")
                if policy in (LOWER, FP32):
                    to = low if policy == LOWER else torch.float32
                    # C++ evaluates the cast pack right to left (GCC): the last argument is cast first
                    kwargs = {k: self._cast(to, v) for k, v in reversed(list(kwargs.items()))}
                    args = tuple(reversed([self._cast(to, a) for a in reversed(args)]))
                elif policy == SET_OPT_DTYPE:
                    if self._eligible(args[0]):
                        if dtype_kwarg_only or dtype_index >= len(args):
                            kwargs.setdefault("dtype", None)
                            if kwargs["dtype"] is None:
                                kwargs["dtype"] = torch.float32
                        elif args[dtype_index] is None:
                            args = (*args[:dtype_index], torch.float32, *args[dtype_index + 1:])
                elif policy == APPEND_DTYPE:
                    out_type = torch.float32 if self._eligible(args[0]) else args[0].dtype
                    return append(*args, **kwargs, dtype=out_type)
                elif policy == PROMOTE:
                    to = low
                    for a in (*args, *kwargs.values()):
                        for t in (a if isinstance(a, (list, tuple)) else (a,)):
                            if self._eligible(t) and t.dtype is torch.float32:
                                to = torch.float32
                    # C++ evaluates the cast pack right to left (GCC): the last argument is cast first
                    kwargs = {k: self._cast(to, v) for k, v in reversed(list(kwargs.items()))}
                    args = tuple(reversed([self._cast(to, a) for a in reversed(args)]))
                else:  # BANNED
                    raise RuntimeError(
                        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
                        "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
                        "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_"
                        "logits\nor torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and "
                        "BCEWithLogits are\nsafe to autocast.")
                return op(*args, **kwargs)

        return kernel

    # ---- CUDA's kernel choices

    def _dropout(self, input: torch.Tensor, p: float, train: bool) -> torch.Tensor:
        with torch._C._ExcludeDispatchKeyGuard(_KEYSET):
            if self.is_device(input) and 0 < p < 1 and input.numel() > 0:  # is_fused_kernel_acceptable
                return torch.ops.aten.native_dropout(input, p, train)[0]
            return torch.ops.aten.dropout(input, p, train)

    def _sdpa(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False, *,
              scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
        with torch._C._ExcludeDispatchKeyGuard(_KEYSET):
            if torch.is_autocast_enabled("cuda"):
                low = torch.get_autocast_dtype("cuda")
                query, key, value, attn_mask = (self._cast(low, t) for t in (query, key, value, attn_mask))
            if not self.is_device(query):
                return torch.ops.aten.scaled_dot_product_attention(
                    query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
            backend = self.choose_sdpa(query, key, value, attn_mask, dropout_p, enable_gqa)
            if backend == "flash":
                head = query.size(-1)
                if head % 8:  # pad_last_dim<8>: the kernel wants a multiple of 8
                    pad = 8 - head % 8
                    query, key, value = (torch.nn.functional.pad(t, (0, pad)) for t in (query, key, value))
                out = torch.ops.aten._scaled_dot_product_flash_attention(
                    query, key, value, dropout_p, is_causal, False,
                    scale=scale if scale is not None else head ** -0.5)
                self.on_host_outputs(out[6], out[7])
                return out[0][..., :head] if head % 8 else out[0]
            if backend == "efficient":
                attn_mask = _additive_mask(attn_mask, query.dtype)
                need_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
                out = torch.ops.aten._scaled_dot_product_efficient_attention(
                    query, key, value, attn_mask, need_grad, dropout_p, is_causal, scale=scale)
                self.on_host_outputs(out[2], out[3])
                return out[0]
            return self._math_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    def _math_attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any,
                        dropout_p: float, is_causal: bool, scale: float | None, enable_gqa: bool) -> torch.Tensor:
        """SDPA's math backend as CUDA runs it (attention.cpp: ``scaled_dot_product_attention``'s math case, then
        ``_scaled_dot_product_attention_math``), op by op. fp16/bf16 inputs are computed in fp32 (unless
        ``allow_fp16_bf16_reduction_math_sdp``); the mask is added to the scores in place — aten's composite adds it
        out of place whenever a dispatch mode is active (``areAnyTensorSubclassLike``), one (B, H, L, S) temporary
        the GPU never allocates; the weights (the second output, in the input's dtype) are made before the output
        (GCC evaluates ``make_tuple``'s arguments right to left) and dropped."""
        attn_mask = _additive_mask(attn_mask, query.dtype)
        origin = query.dtype
        upcast = origin in (torch.float16, torch.bfloat16) and \
            not torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
        query_acc, key_acc, value_acc = (t.to(torch.float32) if upcast else t for t in (query, key, value))
        factor = math.sqrt(abs(scale) if scale is not None else 1.0 / math.sqrt(query.size(-1)))
        q = query_acc * (-factor if scale is not None and scale < 0 else factor)
        if is_causal:
            attn_mask = _additive_mask(
                torch.ones(q.size(-2), key_acc.size(-2), dtype=torch.bool, device=q.device).tril(), q.dtype)
        if enable_gqa and key_acc.dim() >= 3 and q.size(-3) != key_acc.size(-3):
            key_acc = key_acc.repeat_interleave(q.size(-3) // key_acc.size(-3), -3)
            value_acc = value_acc.repeat_interleave(q.size(-3) // value_acc.size(-3), -3)
        attn = torch.matmul(q, key_acc.transpose(-2, -1) * factor)
        if attn_mask is not None:
            if type(attn) in _PLAIN_TENSORS and type(attn_mask) in _PLAIN_TENSORS:
                attn.add_(attn_mask)
            else:
                attn = attn.add(attn_mask)
        attn = torch.ops.aten._safe_softmax(attn, -1)
        if dropout_p > 0.0:
            attn = self._dropout(attn, dropout_p, True)
        _weights = attn.to(origin)  # freed on return, after the fp32 copies, as the C++ locals then the tuple
        return torch.matmul(attn, value_acc).to(origin)

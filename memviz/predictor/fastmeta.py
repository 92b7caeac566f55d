"""Shortcuts for the meta kernels that cost the most in Python: same outputs, no shape arithmetic.

The meta kernels of some ops are Python decompositions (``torch._refs`` / ``torch._decomp``) that cost
milliseconds per call: batch norm and its backward, pointwise backward ops, and the foreach in-place
ops an optimizer step runs over every parameter. A prediction only needs the outputs' shapes, dtypes
and strides, which for these ops follow from the inputs directly:

- an in-place op (``add_``, ``_foreach_mul_``...) returns its first argument, or nothing — except the ops that
  change the first argument's shape or strides (``transpose_``, ``squeeze_``, ``resize_``..., torch's
  ``inplace_view`` tag), whose meta kernel must run (GRU's backward transposes a gradient in place);
- a pointwise op whose tensor arguments all have one shape, dtype and layout returns one like them;
  ``silu_backward`` returns one like its input when the gradient has its shape and dtype (a broadcast
  gradient from ``sum()`` included);
- ``native_batch_norm`` returns the output like the input and, in training, the per-channel mean and
  inverse std in the accumulation type (fp32 for fp16/bf16 inputs); ``native_batch_norm_backward``
  returns the gradients the output mask asks for, like input / weight; ``native_layer_norm`` and its
  backward likewise (per-row mean and rstd).

Only speed: what CUDA does differently from the meta kernels is in :mod:`memviz.predictor.rules`.

Each shortcut returns ``NotImplemented`` when its conditions do not hold; the op's own meta kernel then runs.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["shortcut"]

aten = torch.ops.aten

_POINTWISE = {aten.threshold_backward.default, aten.add.Tensor, aten.mul.Tensor, aten.sub.Tensor, aten.div.Tensor,
              aten.relu.default, aten.gelu.default, aten.gelu_backward.default, aten.silu.default,
              aten.sigmoid.default,
              aten.sigmoid_backward.default, aten.tanh.default, aten.tanh_backward.default, aten.neg.default,
              aten.sqrt.default, aten.rsqrt.default, aten.exp.default}


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _batch_norm(args: tuple, kwargs: dict) -> Any:
    x, training = args[0], args[5]
    if kwargs or not x.is_meta:
        return NotImplemented
    out = torch.empty_like(x)
    n = x.size(1) if training else 0
    return out, x.new_empty((n,), dtype=_acc(x.dtype)), x.new_empty((n,), dtype=_acc(x.dtype))


def _batch_norm_backward(args: tuple, kwargs: dict) -> Any:
    x, weight, mask = args[1], args[2], args[9]
    if kwargs or not x.is_meta or weight is None:
        return NotImplemented
    return (torch.empty_like(x) if mask[0] else None, torch.empty_like(weight) if mask[1] else None,
            torch.empty_like(weight) if mask[2] else None)


def _same_like(args: tuple, kwargs: dict) -> Any:
    first = None
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            if first is None:
                first = a
            elif a.shape != first.shape or a.dtype != first.dtype or a.stride() != first.stride():
                return NotImplemented
    if first is None or not first.is_meta:
        return NotImplemented
    return torch.empty_like(first)


def _layer_norm(args: tuple, kwargs: dict) -> Any:
    x, normalized_shape = args[0], args[1]
    if kwargs or not x.is_meta:
        return NotImplemented
    stat_shape = (*x.shape[:x.dim() - len(normalized_shape)], *([1] * len(normalized_shape)))
    return (torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(stat_shape, dtype=_acc(x.dtype)),
            x.new_empty(stat_shape, dtype=_acc(x.dtype)))


def _layer_norm_backward(args: tuple, kwargs: dict) -> Any:
    x, weight, bias, mask = args[1], args[5], args[6], args[7]
    if kwargs or not x.is_meta:
        return NotImplemented
    return (torch.empty_like(x, memory_format=torch.contiguous_format) if mask[0] else None,
            torch.empty_like(weight) if mask[1] and weight is not None else None,
            torch.empty_like(bias) if mask[2] and bias is not None else None)


def _activation_backward(args: tuple, kwargs: dict) -> Any:
    grad, x = args[0], args[1]
    if kwargs or not x.is_meta or grad.shape != x.shape or grad.dtype != x.dtype:
        return NotImplemented
    return torch.empty_like(x)


_OTHER = {aten.native_batch_norm.default: _batch_norm,
          aten.silu_backward.default: _activation_backward,
          aten.native_batch_norm_backward.default: _batch_norm_backward,
          aten.native_layer_norm.default: _layer_norm,
          aten.native_layer_norm_backward.default: _layer_norm_backward}

_RESIZES = {"resize_", "resize_as_", "resize_as_sparse_", "set_", "_resize_output_", "sparse_resize_",
            "sparse_resize_and_clear_"}
"""In-place ops that change their first argument's metadata but carry no ``inplace_view`` tag."""

_cache: dict[Any, Any] = {}


def _classify(func: Any) -> Any:
    if func in _OTHER:
        return _OTHER[func]
    if func in _POINTWISE:
        return _same_like
    schema = func._schema
    name = schema.name.split("::")[-1]
    first = schema.arguments[0] if schema.arguments else None
    writes_first = first is not None and first.alias_info is not None and first.alias_info.is_write
    if torch.Tag.inplace_view in func.tags or name in _RESIZES:
        return False
    if name.endswith("_") and writes_first and not any(a.kwarg_only and a.name == "out" for a in schema.arguments):
        if not schema.returns:
            return lambda args, kwargs: _inplace(args, None)
        ret = schema.returns[0]
        if len(schema.returns) == 1 and ret.alias_info is not None and ret.alias_info.is_write:
            return lambda args, kwargs: _inplace(args, args[0])
    return False


def _inplace(args: tuple, result: Any) -> Any:
    first = args[0]
    meta = first.is_meta if isinstance(first, torch.Tensor) else (
        bool(first) and isinstance(first[0], torch.Tensor) and first[0].is_meta)
    return result if meta else NotImplemented


def shortcut(func: Any, args: tuple, kwargs: dict) -> Any:
    """The op's outputs without its meta kernel, or ``NotImplemented`` when no shortcut applies."""
    fast = _cache.get(func)
    if fast is None:
        fast = _cache[func] = _classify(func)
    if fast is False:
        return NotImplemented
    return fast(args, kwargs)

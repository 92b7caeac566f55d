"""Requests for the GPU become meta tensors; calls on GPU tensors are marked as device work.

A ``TorchFunctionMode`` (:class:`Redirect`) sees every torch function the program calls: ``device="cuda"``,
``.cuda()``, ``.to("cuda")`` and the factories under ``torch.set_default_device("cuda")`` make meta tensors whose
storages the session accounts as device memory; calls that touch device tensors run "on the device" (their new
storages are allocations); a device tensor says it is on ``cuda:0``; reads of its values get the values the
prediction knows, or zeros (:mod:`memviz.predictor.values`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

from .session import OWN_DIR, TORCH_DIR, Session
from .values import READ_BYTES

__all__ = ["Redirect", "is_cuda"]

def is_cuda(dev: Any) -> bool:
    if isinstance(dev, str):
        return dev.startswith("cuda")
    if isinstance(dev, torch.device):
        return dev.type == "cuda"
    return isinstance(dev, int) and not isinstance(dev, bool)


def _is_cpu(dev: Any) -> bool:
    return (isinstance(dev, str) and dev.startswith("cpu")) or (isinstance(dev, torch.device) and dev.type == "cpu")


class Redirect(TorchFunctionMode):
    """Requests for the GPU become meta tensors; calls on GPU tensors are marked as device work."""

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        self._unmodelled = session.rules.unmodelled
        session.redirect = self

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        s = self.session
        kwargs = kwargs or {}
        special = _SPECIAL.get(func)
        if special is not None:
            return special(s, func, args, kwargs)
        unmodelled = self._unmodelled.get(getattr(func, "__name__", None))
        if unmodelled is not None and s.any_device(args, kwargs):
            s.note(unmodelled)
        device = kwargs.get("device")
        if device is None and s.default_cuda and func in _FACTORIES:
            device = "cuda"
        if device is not None and is_cuda(device):
            if func in _FROM_DATA:  # torch.tensor(data, device="cuda"): the data, copied to the device
                return _from_data(s, func, args, kwargs)
            kwargs["device"] = "meta"
            with s.on_device():
                return func(*args, **kwargs)
        if s.any_device(args, kwargs):
            with s.on_device():
                return func(*args, **kwargs)
        return func(*args, **kwargs)


def _to_device(s: Session, t: torch.Tensor, call: Callable[..., torch.Tensor], *args: Any,
               **kwargs: Any) -> torch.Tensor:
    if t.is_meta and not s.is_device(t):
        kwargs["copy"] = True  # a host meta tensor: the copy is the device allocation
    with s.on_device():
        out = call(t, *args, **kwargs)
    if isinstance(t, torch.nn.Parameter):
        s.tag(out, "parameters")
    if out is not t and t.device.type == "cpu" and s.values.host_known(t) and s.is_device(out):
        s.values.set_from(out, t.to(out.dtype))
    return out


def _tensor_cuda(s: Session, func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    t = args[0]
    if s.is_device(t):
        return t
    memory_format = kwargs.get("memory_format", torch.preserve_format)
    return _to_device(s, t, torch.Tensor.to, "meta", memory_format=memory_format)


def _tensor_to(s: Session, func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    t, rest = args[0], list(args[1:])
    target = None
    for i, a in enumerate(rest):
        if isinstance(a, torch.dtype):
            continue
        if is_cuda(a):
            rest[i], target = "meta", "cuda"
        elif _is_cpu(a):
            target = "cpu"
        elif isinstance(a, torch.Tensor):
            target = "cuda" if s.is_device(a) else ("cpu" if a.device.type == "cpu" else None)
    if "device" in kwargs:
        if is_cuda(kwargs["device"]):
            kwargs["device"], target = "meta", "cuda"
        elif _is_cpu(kwargs["device"]):
            target = "cpu"
    if target == "cuda":
        return _to_device(s, t, func, *rest, **kwargs)
    if target == "cpu" and s.is_device(t):
        return _to_host(s, t, next((a for a in (*rest, kwargs.get("dtype")) if isinstance(a, torch.dtype)), None))
    if s.is_device(t):
        with s.on_device():
            return func(t, *rest, **kwargs)
    return func(t, *rest, **kwargs)


def _to_host(s: Session, t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``.cpu()`` of a device tensor: a real host tensor with its values (known ones, or zeros:
    :meth:`memviz.predictor.values.Values.read`), no device memory; a meta host tensor when too large to fill."""
    with s.on_host():
        if s.values.of(t) is None and t.untyped_storage().nbytes() > READ_BYTES:
            return torch.empty_like(t, dtype=dtype or t.dtype, device="meta")
        return s.values.read(t, "Tensor.cpu").to(dtype or t.dtype, copy=True)


def _tensor_cpu(s: Session, func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    t = args[0]
    return _to_host(s, t) if s.is_device(t) else func(*args, **kwargs)


def _tensor_backward(s: Session, func: Any, args: tuple, kwargs: dict) -> Any:
    """``backward()`` / ``autograd.grad``: device work, in phase "backward" (the engine runs with this mode active
    again: the patch "backward hooks see the GPU as forward does", :mod:`memviz.predictor.patches`)."""
    previous = s.phase
    s.set_phase("backward")
    try:
        with s.on_device():
            return func(*args, **kwargs)
    finally:
        for module in s.modules.values():
            for p in module.parameters(recurse=False):
                s.tag(p.grad, "gradients")
        s.set_phase("other" if previous == "forward" else previous)


def _linear(s: Session, func: Any, args: tuple, kwargs: dict) -> Any:
    """``F.linear``. ``at::linear`` takes ``addmm`` for a 2-D input and a flattened ``addmm`` for a contiguous
    one; otherwise (a transposed input, as ``nn.MultiheadAttention`` with ``batch_first`` makes) it runs
    ``matmul`` and adds the bias in place — but out of place whenever a dispatch mode is active (it takes the
    mode for a tensor subclass), one output-sized temporary the GPU never allocates. Done here as on the GPU
    (under autocast the bias is added in its own dtype, without autocast's cast copy of a few KiB)."""
    inp, weight = args[0], args[1]
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    if not s.any_device(args, kwargs):
        return func(*args, **kwargs)
    with s.on_device():
        if bias is None or inp.dim() == 2 or inp.is_contiguous():
            return func(*args, **kwargs)
        return torch.matmul(inp, weight.t()).add_(bias)


_CUDA0 = torch.device("cuda", 0)


def _tensor_device(s: Session, func: Any, args: tuple, kwargs: dict) -> Any:
    """``t.device`` of a device tensor is ``cuda:0``, as on the GPU: ``torch.arange(n, device=x.device)``,
    ``device = next(model.parameters()).device`` and ``torch.autocast(x.device.type)`` land on the device.
    torch's pickling (``torch.save``, ``Tensor.__reduce_ex__``) sees ``meta``: it saves no values."""
    if not s.is_device(args[0]):
        return func(*args, **kwargs)
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(OWN_DIR):
        f = f.f_back
    if f is not None and f.f_code.co_filename in _SEES_META:
        return func(*args, **kwargs)
    return _CUDA0


_SEES_META = {os.path.join(TORCH_DIR, "serialization.py"), os.path.join(TORCH_DIR, "_tensor.py"),
              os.path.join(TORCH_DIR, "utils", "checkpoint.py")}
"""Where a device tensor's ``.device`` stays ``meta``: torch's serialization and ``Tensor``'s pickling and
deep copy (which copy meta tensors with ``clone``, on the device, instead of reading their storage), and the
checkpoint's metadata check (its forward records it inside autograd's pack hooks, where this mode is off)."""


_DISTRIBUTED_DIR = os.path.join(TORCH_DIR, "distributed") + os.sep


def _tensor_is_meta(s: Session, func: Any, args: tuple, kwargs: dict) -> Any:
    """``t.is_meta`` of a device tensor is False where torch.distributed asks (FSDP2 refuses parameters still on
    meta and skips re-padding shards it takes for meta ones), as on the GPU; everywhere else a meta tensor says so."""
    caller = sys._getframe(2).f_code.co_filename
    if caller.startswith(_DISTRIBUTED_DIR) and s.is_device(args[0]):
        return False
    return func(*args, **kwargs)


def _set_data(s: Session, func: Any, args: tuple, kwargs: dict) -> Any:
    """``host_tensor.data = device_tensor`` (FSDP2 moves parameters so): a host tensor's data cannot become a meta
    tensor's (another tensor type), so the two tensors' contents are swapped instead — the same Python object, now
    the device tensor, as on the GPU."""
    t, value = args[0], args[1]
    if isinstance(value, torch.Tensor) and value.is_meta and not t.is_meta and s.is_device(value):
        if isinstance(t, torch.nn.Parameter) and not isinstance(value, torch.nn.Parameter):
            value = torch.nn.Parameter(value, requires_grad=t.requires_grad)
        torch.utils.swap_tensors(t, value)
        return None
    return func(*args, **kwargs)


def _compatible_shallow_copy(s: Session, func: Any, args: tuple, kwargs: dict) -> Any:
    """``torch._has_compatible_shallow_copy_type(host_tensor, device_tensor)`` is True, as for a CPU and a CUDA
    tensor: ``Module._apply`` (``.cuda()``, ``.to("cuda")``, ``to_empty``) then sets each parameter's ``.data`` in
    place (:func:`_set_data`) instead of making new parameters, so tied parameters (a language model's embedding and
    head) stay one tensor, as on the GPU."""
    a, b = args[0], args[1]
    if type(a) in _HOST_TYPES and type(b) in _HOST_TYPES and (a.is_meta != b.is_meta) and \
            (s.is_device(a) or s.is_device(b)):
        return True
    return func(*args, **kwargs)


_HOST_TYPES = (torch.Tensor, torch.nn.Parameter)


def _record_stream(s: Session, func: Any, args: tuple, kwargs: dict) -> Any:
    """``t.record_stream(stream)``: the block's free waits for ``stream`` (:mod:`memviz.predictor.streams`)."""
    t, stream = args[0], args[1] if len(args) > 1 else kwargs.get("stream")
    if not s.is_device(t):
        return func(*args, **kwargs)
    ptr = s.data_ptr(t.untyped_storage())
    s.streams.record_stream(ptr or 0, stream)
    return None


def _tensor_is_cuda(s: Session, func: Any, args: tuple, kwargs: dict) -> Any:
    return True if s.is_device(args[0]) else func(*args, **kwargs)


def _tensor_get_device(s: Session, func: Any, args: tuple, kwargs: dict) -> Any:
    return 0 if s.is_device(args[0]) else func(*args, **kwargs)


def _pass_through(s: Session, func: Any, args: tuple, kwargs: dict) -> Any:
    return args[0]


def _parse_to(s: Session, func: Any, args: tuple, kwargs: dict) -> Any:
    """``Module.to``'s parse of its arguments (``torch._C._nn._parse_to``) keeps ``device="cuda"`` as it is: each
    tensor's ``.to`` then gets the CUDA device (:func:`_tensor_to`). Redirected as a factory's ``device=`` it would
    hand every parameter ``.to(meta)``, a host copy, and ``model.to(device="cuda", dtype=...)`` would put no
    parameter on the device."""
    return func(*args, **kwargs)


def _host_values(s: Session, func: Any, args: tuple, kwargs: dict) -> Any:
    """``tolist()`` / ``numpy()`` of a device tensor: of its values (known ones, or zeros)."""
    t = args[0]
    if isinstance(t, torch.Tensor) and t.is_meta:
        with s.on_host():
            return func(s.values.read(t, f"Tensor.{func.__name__}").clone(), *args[1:], **kwargs)
    return func(*args, **kwargs)


_FACTORIES = frozenset(_device_constructors())
"""The functions ``torch.set_default_device`` applies to (``torch.utils._device``)."""

_FROM_DATA = frozenset({torch.tensor, torch.as_tensor, torch.asarray})
"""Factories of a tensor from host data: on meta they would keep no values."""


def _from_data(s: Session, func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    """The host tensor ``func`` makes, copied to the device as ``.to("cuda")`` would (its values known)."""
    requires_grad = kwargs.pop("requires_grad", False)
    kwargs["device"] = "cpu"
    kwargs.pop("pin_memory", None)
    with s.on_host():
        host = func(*args, **kwargs)
    out = _to_device(s, host, torch.Tensor.to, "meta")
    return out.requires_grad_() if requires_grad else out


_SPECIAL: dict[Any, Callable[[Session, Any, tuple, dict], Any]] = {
    torch.Tensor.cuda: _tensor_cuda,
    torch.Tensor.to: _tensor_to,
    torch.Tensor.cpu: _tensor_cpu,
    torch.Tensor.backward: _tensor_backward,
    torch.autograd.backward: _tensor_backward,
    torch.autograd.grad: _tensor_backward,
    torch.nn.functional.linear: _linear,
    torch.Tensor.pin_memory: _pass_through,
    torch.Tensor.device.__get__: _tensor_device,
    torch.Tensor.is_cuda.__get__: _tensor_is_cuda,
    torch.Tensor.is_meta.__get__: _tensor_is_meta,
    torch.Tensor.record_stream: _record_stream,
    torch.Tensor.data.__set__: _set_data,
    torch._has_compatible_shallow_copy_type: _compatible_shallow_copy,
    torch.Tensor.get_device: _tensor_get_device,
    torch.Tensor.numpy: _host_values,
    torch.Tensor.tolist: _host_values,
    torch._C._nn._parse_to: _parse_to,
}

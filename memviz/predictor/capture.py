"""Every aten op the program runs, below autograd: run on meta, its new storages allocated, the rules applied.

Each output whose storage is new is one ``malloc`` of the storage's bytes, and a weak reference on the storage
frees it when the storage dies (storages, not tensors: views share one; in-place ops make none). What the kernels
do beyond their meta kernel is the rules' (:mod:`memviz.predictor.rules`): CUDA's own outputs, its own kernels
where the meta path would decompose, the libraries' workspaces, the engine's in-place gradient joins.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .fastmeta import shortcut
from .session import Session
from .values import READ_BYTES

__all__ = ["Capture"]

aten = torch.ops.aten

_DATA_DEPENDENT = {
    aten._local_scalar_dense.default, aten.nonzero.default, aten._unique2.default, aten.unique_dim.default,
    aten.unique_consecutive.default, aten.repeat_interleave.Tensor, aten.bincount.default, aten.equal.default,
    aten.is_nonzero.default, aten._is_all_true.default, aten._is_any_true.default,
}
"""Ops whose outputs (their shapes, or the Python value they return) depend on their inputs' values: computed on the
host from the values the prediction knows, or zeros (:mod:`memviz.predictor.values`)."""

_MASKED = {aten.masked_select.default: 1, aten.index.Tensor: None, aten.index_put_.default: None,
           aten.index_put.default: None, aten._index_put_impl_.default: None}
"""Ops that select by a boolean mask (argument index, or None: the ``indices`` list): the mask's values give the
shape, the selected tensor's need not be known."""

_RANDOM_FILL = {torch.ops.aten.uniform_.default, torch.ops.aten.normal_.default, torch.ops.aten.bernoulli_.float,
                torch.ops.aten.random_.default, torch.ops.aten.exponential_.default, torch.ops.aten.log_normal_.default}
"""In-place random fills skipped on host parameters (``nn.init``): the CPU work of building a model."""

_ADD, _ADD_ = torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor

_PASSED = frozenset({"c10d", "profiler"})
"""Op namespaces run as they are: collectives (the fake group's, which allocate nothing) and the profiler's marks."""

_TO_COPY, _COPY_ = aten._to_copy.default, aten.copy_.default
_FAKE = torch._C._TorchDispatchModeKey.FAKE


def _fake_mode() -> Any:
    return torch._C._get_dispatch_mode(_FAKE)

_META = torch.device("meta")


def _is_cpu(device: Any) -> bool:
    return device is not None and torch.device(device).type == "cpu"


_ALLGATHER_BASE = torch.ops.c10d._allgather_base_.default
_ALL_GATHERS = frozenset({_ALLGATHER_BASE, torch.ops.c10d.allgather_.default})

_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})
"""Tensor types the capture handles itself; any other (a wrapper subclass) dispatches first."""


class Capture(TorchDispatchMode):
    """Every aten op: run it on meta, account the storages it creates, apply the rules."""

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        self._composite: dict[Any, bool] = {}
        book = session.rules
        self._own_kernel = book.own_kernel
        self._outputs = book.outputs
        self._allocates = book.allocates
        self._joins_in_place = book.engine["in-place gradient joins"]

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        with torch._C.DisableTorchFunction():  # the predictor's own code here, not the program's: nothing to redirect
            return self._dispatch(func, types, args, kwargs)

    def _dispatch(self, func: Any, types: Any, args: tuple, kwargs: dict | None) -> Any:
        if _fake_mode() is not None:  # a FakeTensorMode's shape propagation (DTensor's): no device work of the program
            return func(*args, **(kwargs or {}))
        for t in types:
            if t not in _PLAIN:
                if hasattr(t, "__tensor_flatten__"):  # a wrapper subclass (DTensor): its own dispatch runs ops on
                    if func in _RANDOM_FILL:  # its local tensors, which come back here; but an in-place random
                        return args[0]  # fill allocates nothing, and its sharding propagation needs CUDA's RNG
                    return NotImplemented
                return func(*args, **(kwargs or {}))  # another mode's tensors (DTensor's FakeTensor propagation)
        s = self.session
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":  # asked below the function mode (DTensor's
            kwargs = {**kwargs, "device": _META}  # dispatch, a decomposition): the device, as the mode would make it
            with s.on_device():
                return self._dispatch(func, types, args, kwargs)
        if func.namespace in _PASSED:
            out = func(*args, **kwargs)
            if func in _ALL_GATHERS:
                self._gathered_values(func, args)
            return out
        composite = self._composite.get(func)
        if composite is None:
            composite = self._composite[func] = func not in self._own_kernel and \
                torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
        if composite:  # reached undecomposed (inference mode): run its decomposition, op by op, as CUDA would
            with self:
                return func.decompose(*args, **kwargs)
        if func is _TO_COPY and args[0].is_meta and _is_cpu(kwargs.get("device")) and s.is_device(args[0]):
            return self._read_to_host(args[0], kwargs)
        if func is _COPY_ and not args[0].is_meta and args[1].is_meta and s.is_device(args[1]):
            return args[0].copy_(self._read_to_host(args[1], {}))
        if func in _DATA_DEPENDENT and any(isinstance(a, torch.Tensor) and a.is_meta for a in args):
            return self._data_dependent(func, args, kwargs)
        if func in _MASKED and _has_meta_mask(func, args):
            return self._masked(func, args, kwargs)
        if func in (aten._assert_async.default, aten._assert_async.msg):
            return None  # an assertion: it holds
        if func is _ADD and s.gpu_depth and self._joins_in_place(args, kwargs, s.producer_of):
            func = _ADD_  # the engine's gradient join, in place on the GPU
        if func in _RANDOM_FILL and args[0].requires_grad and not args[0].is_meta:
            s.values.forget_host(args[0])  # a parameter's initialisation on the host: its values stay unknown
            return args[0]
        out = NotImplemented
        outputs = self._outputs.get(func)
        if outputs is not None:
            out = outputs(func, args, kwargs)
        if out is NotImplemented:
            out = shortcut(func, args, kwargs)
        if out is NotImplemented:
            out = func(*args, **kwargs)
        if s.gpu_depth:
            name = func.__name__
            rule = self._allocates.get(func)
            if rule is None or not rule[1]:
                if isinstance(out, torch.Tensor):
                    if out.is_meta:
                        s.track(out, name)
                elif isinstance(out, (tuple, list)):
                    for t in out:
                        if isinstance(t, torch.Tensor) and t.is_meta:
                            s.track(t, name)
            if rule is not None:
                rule[0](s, func, args, kwargs, out)
            if torch._C._current_graph_task_id() != -1:
                s.mark_producer(out)
            s.values.after(func, args, kwargs, out)
        return out

    def _read_to_host(self, t: torch.Tensor, kwargs: dict) -> torch.Tensor:
        """A copy of a device tensor to the host made below Python (C++'s ``.cpu()``: DDP's check of the
        parameters' shapes across ranks): a real host tensor of its values (known ones, or zeros)."""
        with self.session.on_host():
            host = self.session.values.read(t, "_to_copy")
        return host.to(dtype=kwargs.get("dtype") or t.dtype, copy=True)

    def _gathered_values(self, func: Any, args: tuple) -> None:
        """The fake group's all-gather copies this rank's input into every rank's chunk (what DDP's and
        DeviceMesh's checks across ranks read back): the outputs' values follow the input's where known."""
        values = self.session.values
        if func is _ALLGATHER_BASE:
            output, inp = args[0], args[1]
            known = values.of(inp) if inp.is_meta else inp
            if output.is_meta and known is not None:
                values.set_from(output, known.reshape(-1).repeat(output.numel() // max(known.numel(), 1))
                                .reshape(output.shape))
            return
        for outputs, inp in zip(args[0], args[1], strict=False):
            known = values.of(inp) if inp.is_meta else inp
            for chunk in outputs:
                if chunk.is_meta and known is not None:
                    values.set_from(chunk, known)

    def _outputs_like(self, host: torch.Tensor, op: str) -> torch.Tensor:
        """A meta tensor of ``host``'s shape and dtype holding its values (a device allocation where on the device)."""
        s = self.session
        out = torch.empty_strided(host.shape, host.stride(), dtype=host.dtype, device="meta")
        if s.gpu_depth:
            s.track(out, op)
        s.values.set_from(out, host)
        return out

    def _data_dependent(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run the op on the values (known, or zeros: :meth:`memviz.predictor.values.Values.read`) on the host; its
        tensor outputs become meta tensors of the shapes it gave, holding those values."""
        values = self.session.values
        name = func.__name__
        if func is aten._is_all_true.default and values.of(args[0]) is None:
            return self._outputs_like(torch.tensor(True), name)  # an assertion holds
        host_args, host_kwargs = _host(args, kwargs, lambda t: values.read(t, name))
        result = func(*host_args, **host_kwargs)
        if isinstance(result, torch.Tensor):
            return self._outputs_like(result, name)
        if isinstance(result, tuple):
            return tuple(self._outputs_like(r, name) if isinstance(r, torch.Tensor) else r for r in result)
        return result

    def _masked(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Selection by a boolean mask: the mask becomes the indices its values select (``nonzero``, which the
        GPU's kernel allocates too), and the op runs on meta with them."""
        name = func.__name__
        if func is aten.masked_select.default:
            x, mask = args[0], args[1]
            x_b, mask_b = torch.broadcast_tensors(x, mask)
            indices = self._nonzero_of(mask_b, name)
            with self:
                return aten.index.Tensor(x_b, list(indices))
        x, indices = args[0], list(args[1])
        converted = []
        for index in indices:
            if isinstance(index, torch.Tensor) and index.is_meta and index.dtype in (torch.bool, torch.uint8):
                converted.extend(self._nonzero_of(index, name))
            else:
                converted.append(index)
        with self:
            return func(x, converted, *args[2:], **kwargs)

    def _nonzero_of(self, mask: torch.Tensor, op: str) -> tuple[torch.Tensor, ...]:
        """The int64 index tensors of a mask's true elements, one per dimension (device allocations)."""
        s = self.session
        values = s.values.read(mask, op)
        if mask.numel() * mask.element_size() > READ_BYTES:
            values = torch.zeros(mask.shape, dtype=torch.bool)
        positions = values.nonzero()
        whole = self._outputs_like(positions, "nonzero")
        return tuple(whole[:, d] for d in range(mask.dim()))


def _has_meta_mask(func: Any, args: tuple) -> bool:
    position = _MASKED[func]
    candidates = [args[position]] if position is not None else list(args[1]) if len(args) > 1 else []
    return any(isinstance(t, torch.Tensor) and t.is_meta and t.dtype in (torch.bool, torch.uint8) for t in candidates)


def _host(args: tuple, kwargs: dict, values_of: Any) -> tuple[tuple, dict]:
    def host(a: Any) -> Any:
        if isinstance(a, torch.Tensor) and a.is_meta:
            return values_of(a)
        if isinstance(a, (list, tuple)):
            return type(a)(host(x) for x in a)
        return a

    return tuple(host(a) for a in args), {k: host(v) for k, v in kwargs.items()}

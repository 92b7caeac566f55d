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

from memviz.errors import DataDependentError

from .fastmeta import shortcut
from .session import Session

__all__ = ["Capture"]

_DATA_DEPENDENT = {
    torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default, torch.ops.aten.masked_select.default,
    torch.ops.aten._unique2.default, torch.ops.aten.unique_dim.default, torch.ops.aten.unique_consecutive.default,
    torch.ops.aten.repeat_interleave.Tensor, torch.ops.aten.bincount.default, torch.ops.aten.equal.default,
    torch.ops.aten.is_nonzero.default, torch.ops.aten.nonzero_static.default,
}
"""Ops whose outputs depend on their inputs' values."""

_RANDOM_FILL = {torch.ops.aten.uniform_.default, torch.ops.aten.normal_.default, torch.ops.aten.bernoulli_.float,
                torch.ops.aten.random_.default, torch.ops.aten.exponential_.default, torch.ops.aten.log_normal_.default}
"""In-place random fills skipped on host parameters (``nn.init``): the CPU work of building a model."""

_ADD, _ADD_ = torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor


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
        s = self.session
        kwargs = kwargs or {}
        composite = self._composite.get(func)
        if composite is None:
            composite = self._composite[func] = func not in self._own_kernel and \
                torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
        if composite:  # reached undecomposed (inference mode): run its decomposition, op by op, as CUDA would
            with self:
                return func.decompose(*args, **kwargs)
        if func in _DATA_DEPENDENT and any(isinstance(a, torch.Tensor) and a.is_meta for a in args):
            raise DataDependentError(func.__name__, s.user_line())
        if func is _ADD and s.gpu_depth and self._joins_in_place(args, kwargs, s.producer_of):
            func = _ADD_  # the engine's gradient join, in place on the GPU
        if func in _RANDOM_FILL and args[0].requires_grad and not args[0].is_meta:
            return args[0]  # a parameter's initialisation on the host: its values never reach the prediction
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
        return out

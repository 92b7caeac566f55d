"""The autograd engine's in-place gradient accumulation, which any ``TorchDispatchMode`` turns off.

When a tensor feeds several ops (a residual connection), backward sums its gradients in the engine's input
buffer (``torch/csrc/autograd/input_buffer.cpp``, ``accumulate``): ``old.add_(new)`` when the buffer holds
the last reference to ``old`` and its storage and ``old`` is non-overlapping and dense, else ``old + new``,
a new allocation. ``at::isTensorSubclassLike`` is true whenever a dispatch mode is active, so under the
predictor's mode the engine always takes ``old + new``: one gradient-sized temporary per residual join that
the GPU does not allocate. :func:`runs_in_place` tells the dispatch mode when the engine would have added in
place, from the same conditions: the add joins a gradient an earlier backward node produced (``old``) with
one the running node produced, and ``old``'s use counts are those of a last reference — counted as they
read inside a dispatch mode, measured once by :func:`last_reference_counts` on a join known to be in place.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import Rule

__all__ = ["RULES", "current_node", "last_reference_counts", "runs_in_place", "use_counts"]

aten = torch.ops.aten


def use_counts(t: torch.Tensor) -> tuple[int, int]:
    """(tensor, storage) reference counts of ``t`` as C++ sees them (the storage's includes the Python
    storage object this call makes)."""
    return t._use_count(), torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def current_node() -> int:
    """The sequence number of the backward node running now, or -1."""
    node = torch._C._current_autograd_node()
    return -1 if node is None else node._sequence_nr()


@functools.cache
def last_reference_counts() -> tuple[int, int]:
    """The use counts an input-buffer tensor the engine holds the last reference to shows inside a dispatch
    mode's ``__torch_dispatch__``: measured on ``y * 2 + y * 3``, whose gradient join the engine adds in
    place (without a mode). ``(0, 0)`` (never in place) if this torch does not show the join."""
    seen: list[tuple[int, int]] = []

    class _Probe(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            if func is aten.add.Tensor and torch._C._current_graph_task_id() != -1:
                seen.append(use_counts(args[0]))
            return func(*args, **(kwargs or {}))

    x = torch.empty(8, device="meta", requires_grad=True)
    y = x * 1.0
    loss = (y * 2 + y * 3).sum()
    with _Probe():
        loss.backward()
    return seen[0] if len(seen) == 1 else (0, 0)


def runs_in_place(args: tuple, kwargs: dict, producer_of: Any) -> bool:
    """Whether an ``aten.add.Tensor(old, new)`` seen in backward is the engine's join of two gradients that
    it would add in place. ``producer_of(t)`` is the backward node that made ``t`` (-1 if none)."""
    if kwargs or len(args) != 2 or not all(isinstance(a, torch.Tensor) and a.is_meta for a in args):
        return False
    old, new = args
    dense = old.is_contiguous() or (old.dim() == 4 and old.is_contiguous(memory_format=torch.channels_last))
    if old.shape != new.shape or old.dtype != new.dtype or not dense:  # an expanded gradient (sum's) is not dense
        return False
    node = current_node()
    if node == -1 or producer_of(new) != node or producer_of(old) in (node, -1):
        return False
    limit = last_reference_counts()
    counts = use_counts(old)
    return counts[0] <= limit[0] and counts[1] <= limit[1]


RULES = (
    Rule("in-place gradient joins", "autograd", "engine", (), runs_in_place, "source",
         "torch/csrc/autograd/input_buffer.cpp (accumulate)", doc=__doc__ or ""),
)

"""The prediction's log: one :class:`AllocatorCall` per call the program's run made on the allocator."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from memviz.sim import Op

__all__ = ["CATEGORIES", "PHASES", "AllocatorCall", "as_ops"]

PHASES = ("setup", "forward", "backward", "optimizer", "other")
"""Where the program is: before its first forward, in a forward pass, in backward, in an optimizer step, after."""

CATEGORIES = ("parameters", "gradients", "optimizer state", "activations", "temporaries", "workspaces")
"""The breakdown's categories, in stacking order. Parameters (and buffers) are what modules own;
gradients are the parameters' ``.grad``; optimizer state is what ``opt.state`` holds after a step;
activations are the other tensors made before or during a forward pass (the inputs, what autograd
saves, the outputs); temporaries are the others made in backward, the optimizer step or after;
workspaces are the libraries' non-tensor requests (cuBLAS, cuBLASLt, cuDNN, flash attention)."""


class AllocatorCall(NamedTuple):
    """One allocator call of the prediction (immutable).

    Attributes:
        action: ``"alloc"``, ``"free"``, or the program's ``"empty_cache"``.
        nbytes: the request in bytes (a free repeats its alloc's; 0 for ``empty_cache``).
        ptr: the simulated address.
        alloc_index: for a free, the index of its alloc in the log; for an alloc, its own.
        op: the aten op (or library call) that asked.
        module: the module whose forward ran, or the autograd node in backward ("" if none).
        line: the program's ``file:line (function)``.
        phase: one of :data:`PHASES`.
        category: one of :data:`CATEGORIES` (a free has its alloc's).
        allocated_bytes / reserved_bytes: the allocator's after the call.
        stream: the stream the allocation was made on (0: the default stream; :mod:`memviz.predictor.streams`).
    """

    action: str
    nbytes: int
    ptr: int
    alloc_index: int
    op: str
    module: str
    line: str
    phase: str
    category: str
    allocated_bytes: int
    reserved_bytes: int
    stream: int = 0

    def __repr__(self) -> str:
        return f"AllocatorCall({self.action} {self.nbytes} B, {self.category}, {self.op}, {self.module}, {self.line})"


def as_ops(calls: Sequence[AllocatorCall]) -> list[Op]:
    """The calls as :class:`memviz.sim.Op` for :func:`memviz.sim.replay` (keys: the allocs' indices; each malloc on
    its stream). A free that ``record_stream`` made wait replays as made at once."""
    ops = []
    for index, call in enumerate(calls):
        if call.action == "alloc":
            ops.append(Op("malloc", index, call.nbytes, call.stream))
        elif call.action == "free":
            ops.append(Op("free", call.alloc_index))
        else:
            ops.append(Op("empty_cache"))
    return ops

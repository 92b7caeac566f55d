"""A program written for ``torchrun``, predicted as rank R of an N-rank job on one simulated GPU.

What one rank of a data-parallel job allocates through its caching allocator is that rank's own: its shards, the
all-gather and reduce-scatter buffers FSDP2 makes on its streams, the unsharded parameters and gradients, DDP's
buckets, the optimizer state, the activations. The collectives move bytes between ranks but allocate nothing
through the caching allocator beyond the buffers their callers pass. So a rank's allocator is predicted by
running the program as that rank against torch's fake process group
(``torch.testing._internal.distributed.fake_pg``: collectives complete at once, allocate nothing), every buffer
the program makes accounted as usual. For the length of a prediction (:func:`rank_environment` and the patches
:func:`patches` gives to :data:`memviz.predictor.patches.PATCHES`):

- the environment says what ``torchrun`` would tell rank R with one GPU per process: ``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK=0``, ``LOCAL_WORLD_SIZE=1``, ``GROUP_RANK``, ``MASTER_ADDR`` / ``MASTER_PORT`` (unused), put back
  after;
- ``init_process_group(...)`` with any backend or ``init_method`` joins the fake group as rank R of N (a group the
  program leaves open is destroyed afterwards);
- DDP runs as it is: its constructor (the parameter broadcast's flat buffers, the reducer's buckets) and its
  forward (the bucket rebuild of the second step, the buffers' broadcast) are device work, and each DDP gets the
  communication hook the all-reduce's memory needs on a fake group (:func:`allreduce_hook`);
- ``UntypedStorage.resize_`` of a device storage frees its allocation and makes the new one on the current stream
  (FSDP2 frees and re-allocates unsharded parameters so; no dispatch mode sees it, which is why torch's own
  ``FSDPMemTracker`` patches it too);
- a device storage's ``data_ptr()`` is its simulated address, and torch.distributed's code sees a device tensor as
  not on ``meta`` (FSDP2 refuses parameters still on meta and compares storages by address).

NCCL's own buffers and the CUDA context are not allocator memory: :func:`outside_allocator` estimates them apart.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from memviz.errors import InputError

__all__ = ["ENV_KEYS", "OutsideAllocator", "allreduce_hook", "check_rank", "outside_allocator", "patches",
           "rank_environment"]

ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
"""The variables :func:`rank_environment` sets (and puts back)."""

MAX_WORLD_SIZE = 1 << 16


def check_rank(world_size: Any, rank: Any) -> None:
    """Refuse a world size or rank that no job has.

    Raises:
        InputError: ``world_size`` not an int in [1, 65536], or ``rank`` not an int in [0, world_size).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or not 1 <= world_size <= MAX_WORLD_SIZE:
        raise InputError(f"world_size must be an int from 1 to {MAX_WORLD_SIZE}, got {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise InputError(f"rank must be an int in [0, {world_size}) for world_size {world_size}, got {rank!r}")


def fake_pg_available() -> bool:
    """Whether this torch has the fake process group (``torch.testing._internal.distributed.fake_pg``)."""
    if not torch.distributed.is_available():
        return False
    try:
        importlib.import_module("torch.testing._internal.distributed.fake_pg")
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def rank_environment(world_size: int, rank: int) -> Iterator[None]:
    """The environment ``torchrun`` gives rank ``rank`` of ``world_size`` with one GPU per process; put back after."""
    saved = {key: os.environ.get(key) for key in ENV_KEYS}
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                      GROUP_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    was_initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
    try:
        yield
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized() and not was_initialized:
            torch.distributed.destroy_process_group()  # the program stopped before its own (it raised)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def allreduce_hook(process_group, bucket):  # unannotated: DDP refuses annotations other than its own types
    """What DDP's built-in all-reduce does to memory, on a fake group: the bucket's flat buffer divided by the
    world size in place, returned as the result (no allocation).

    Without a hook, DDP's reducer (``reducer.cpp``: ``run_comm_hook`` → ``_AllReduceBySumCommHook``) returns the
    group's all-reduce future and ``finalize_backward`` parses its value as a tensor; the fake group's future holds
    None, so backward would fail. With a hook the reducer skips its own division by the world size
    (``mark_variable_ready_dense`` copies instead of ``mul_out``: the same write, no allocation), which the hook
    does, as ``default_hooks._allreduce_fut`` does; the future's value is the bucket's own buffer, as NCCL's
    in-place all-reduce completes with its input, so ``finalize_bucket_dense`` copies into ``param.grad`` exactly
    as it would (nothing with ``gradient_as_bucket_view``)."""
    buffer = bucket.buffer()
    buffer.div_(process_group.size())
    torch.distributed.all_reduce(buffer, group=process_group, async_op=True)
    future = torch.futures.Future()
    future.set_result(buffer)
    return future


def _fake_group(session: Any, original: Callable[[str], Any]) -> dict[str, Any]:
    """Every group the program makes is the fake backend's, however it names the backend or finds its peers:
    ``init_process_group`` looks up ``rendezvous`` and ``_new_process_group_helper`` in its module when it runs, so
    a program that imported ``init_process_group`` before the prediction gets them too."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    helper = original("torch.distributed.distributed_c10d:_new_process_group_helper")

    def rendezvous(url: str, rank: int = -1, world_size: int = -1, **kwargs: Any) -> Iterator[tuple]:
        yield (FakeStore(), session.rank if rank is None or rank < 0 else rank,
               session.world_size if world_size is None or world_size < 0 else world_size)

    def new_process_group_helper(*args: Any, **kwargs: Any) -> Any:
        bound = inspect.signature(helper).bind(*args, **kwargs)
        bound.arguments.update(backend="fake", backend_options=None)
        bound.arguments.pop("device_id", None)
        return helper(*bound.args, **bound.kwargs)

    return {"torch.distributed.distributed_c10d:rendezvous": rendezvous,
            "torch.distributed.distributed_c10d:_new_process_group_helper": new_process_group_helper}


def _ddp(session: Any, original: Callable[[str], Any]) -> dict[str, Any]:
    init = original("torch.nn.parallel.distributed:DistributedDataParallel.__init__")
    forward = original("torch.nn.parallel.distributed:DistributedDataParallel.forward")
    register = original("torch.nn.parallel.distributed:DistributedDataParallel.register_comm_hook")

    def on_device(ddp: Any) -> Any:
        params = list(ddp.module.parameters()) if hasattr(ddp, "module") else []
        return session.on_device() if any(session.is_device(p) for p in params) else contextlib.nullcontext()

    def __init__(ddp: Any, module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        device = any(session.is_device(p) for p in module.parameters())
        with session.on_device() if device else contextlib.nullcontext():
            init(ddp, module, *args, **kwargs)
        register(ddp, ddp.process_group, allreduce_hook)

    def ddp_forward(ddp: Any, *inputs: Any, **kwargs: Any) -> Any:
        with on_device(ddp):
            return forward(ddp, *inputs, **kwargs)

    def register_comm_hook(ddp: Any, state: object, hook: Callable) -> None:
        session.note("DDP: the program's own communication hook is not run (a fake group's future holds no "
                     "tensor); the built-in all-reduce's memory is predicted instead")

    return {"torch.nn.parallel.distributed:DistributedDataParallel.__init__": __init__,
            "torch.nn.parallel.distributed:DistributedDataParallel.forward": ddp_forward,
            "torch.nn.parallel.distributed:DistributedDataParallel.register_comm_hook": register_comm_hook}


def _storage_resize(session: Any, original: Callable[[str], Any]) -> dict[str, Any]:
    resize = original("torch:UntypedStorage.resize_")

    def resize_(storage: torch.UntypedStorage, size: int) -> Any:
        out = resize(storage, size)
        session.resize(storage, int(size), "UntypedStorage.resize_")
        return out

    return {"torch:UntypedStorage.resize_": resize_}


def _data_ptr(session: Any, original: Callable[[str], Any]) -> dict[str, Any]:
    data_ptr = original("torch:UntypedStorage.data_ptr")

    def storage_data_ptr(storage: torch.UntypedStorage) -> int:
        ptr = session.data_ptr(storage)
        return data_ptr(storage) if ptr is None else ptr

    return {"torch:UntypedStorage.data_ptr": storage_data_ptr}


def patches() -> tuple:
    """The distributed patches, as :class:`memviz.predictor.patches.Patch` records (applied when the prediction
    plays a rank)."""
    from .patches import Patch

    def rank_only(session: Any) -> bool:
        return session.world_size is not None

    return (
        Patch("init_process_group joins torch's fake group as rank R of N",
              "a prediction has no peers: the fake group's collectives complete at once and allocate nothing, the "
              "buffers their callers pass are the rank's own allocations", _fake_group, applies=rank_only),
        Patch("DDP runs on the fake group, its own allocations device work",
              "DDP's constructor and forward allocate from C++ (flat broadcast buffers, buckets, their rebuild); its "
              "reducer cannot parse a fake group's all-reduce future without a hook (allreduce_hook)", _ddp,
              applies=rank_only),
        Patch("UntypedStorage.resize_ frees and re-allocates a device storage",
              "FSDP2 frees and re-allocates unsharded parameters with resize_(0) / resize_(n), which no dispatch "
              "mode sees (torch's FSDPMemTracker patches resize_ too)", _storage_resize, applies=rank_only),
        Patch("a device storage's data_ptr is its simulated address",
              "FSDP2 compares storages by address (reset_sharded_param); a meta storage's is 0", _data_ptr,
              applies=rank_only),
    )


# ---- outside the allocator


@dataclass(frozen=True)
class OutsideAllocator:
    """GPU memory a rank's process holds outside the caching allocator (an estimate; never in the allocator's peaks).

    Attributes:
        context_bytes: the CUDA context and the libraries' module images (:attr:`memviz.predictor.gpus.GpuArch.
            context_bytes`, measured on the H200).
        nccl_bytes: NCCL's own buffers for one communicator of ``world_size`` ranks (0 for one rank).
        basis: where the figures come from, in words.
    """

    context_bytes: int
    nccl_bytes: int
    basis: str

    @property
    def total_bytes(self) -> int:
        return self.context_bytes + self.nccl_bytes


NCCL_BUFFSIZE_BYTES = 4 << 20
"""NCCL's default ``NCCL_BUFFSIZE`` (4 MiB): the buffer of one protocol (Simple) per channel and peer direction."""

NCCL_CHANNELS = 32
"""The channels NCCL opens on an NVLink-connected H100/H200 node for a ring of 8 (its usual maximum): each holds a
send and a receive buffer per ring neighbour."""


def outside_allocator(context_bytes: int, world_size: int) -> OutsideAllocator:
    """The estimate of what a rank holds outside the allocator: the CUDA context, and NCCL's ring buffers for one
    communicator: ``NCCL_CHANNELS`` channels x 2 ring neighbours x (send + receive) x ``NCCL_BUFFSIZE`` — NCCL's
    documented defaults, not a measurement (the fake group makes no communicator, so the recordings hold none)."""
    nccl = 0 if world_size <= 1 else NCCL_CHANNELS * 2 * 2 * NCCL_BUFFSIZE_BYTES
    basis = ("CUDA context: measured on the H200 (torch 2.11, lesson 6); NCCL: "
             f"{NCCL_CHANNELS} channels x 2 ring peers x send+receive x NCCL_BUFFSIZE 4 MiB, NCCL's defaults "
             "(an estimate, not measured: NCCL's real use varies with the topology, the algorithms and "
             "NCCL_BUFFSIZE / NCCL_MAX_NCHANNELS)") if nccl else "CUDA context: measured on the H200 (torch 2.11)"
    return OutsideAllocator(context_bytes, nccl, basis)

"""Record one CUDA memory snapshot per rank of a ``torchrun`` job (DDP or FSDP2 training), then view them side by side.

    torchrun --nproc-per-node 2 examples/torchrun_snapshots.py --out DIR [--strategy ddp|fsdp2] [--steps 3]
        [--width 1024] [--depth 4] [--batch 64] [--backend auto|nccl|gloo|fake] [--sim] [--sim-device H200]
    RANK=1 WORLD_SIZE=2 python examples/torchrun_snapshots.py --out DIR --backend fake   # one rank, no peers

Each rank does what a user's script does: ``init_process_group``, ``torch.cuda.set_device(local_rank)``,
``torch.cuda.memory._record_memory_history(stacks="python")``, builds an MLP (``--depth`` layers of ``--width``),
wraps it in ``DistributedDataParallel`` or ``fully_shard`` (FSDP2), trains ``--steps`` steps with AdamW on random
batches, and writes ``torch.cuda.memory._dump_snapshot(f"{DIR}/snapshot_rank{rank}.pickle")``. Then, in a notebook::

    from memviz.widgets import RankViewer
    RankViewer("DIR")        # a timeline and a segment map per rank, one event slider for all

The process group: ``--backend auto`` (the default) takes NCCL when every rank has a GPU of its own, and gloo
otherwise: NCCL refuses two ranks on one GPU, and with more ranks than GPUs rank ``r`` uses ``cuda:(local_rank %
device_count)`` (two ranks on one H200 each record their own process's allocator; gloo's collectives on CUDA
tensors go through host memory, NCCL's buffers are outside the caching allocator either way). ``--backend fake``
runs one rank alone, without ``torchrun`` or peers (``RANK`` and ``WORLD_SIZE`` from the environment), in torch's
fake process group (``torch.testing._internal.distributed.fake_pg``): every collective does nothing, every buffer
the rank makes is real; DDP then gets a comm hook that hands each bucket back as it is, since its own all-reduce
cannot read the fake group's result.

Without CUDA (or with ``--sim``) each rank runs the same training on CPU with gloo, and
:class:`memviz.snapshots.sim_recording.SimRecording` stands in for ``_record_memory_history``: every tensor storage
the rank's aten ops make on the CPU goes through memviz's simulated caching allocator of ``--sim-device`` (device
index = local rank), and the snapshot it writes has torch's ``_snapshot()`` format and a ``memviz_simulated``
entry saying it is simulated and what it leaves out (library workspaces, CUDA-only code paths, side streams, NCCL
and the CUDA context). The viewer labels such ranks "simulated".

Each rank prints one line: its device, the strategy and its peak allocated and reserved bytes.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=Path, help="directory for snapshot_rank{rank}.pickle")
    p.add_argument("--strategy", choices=("ddp", "fsdp2"), default="ddp")
    p.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    p.add_argument("--width", type=int, default=1024, help="features of each layer (default 1024)")
    p.add_argument("--depth", type=int, default=4, help="Linear layers (default 4)")
    p.add_argument("--batch", type=int, default=64, help="samples per rank and step (default 64)")
    p.add_argument("--backend", choices=("auto", "nccl", "gloo", "fake"), default="auto")
    p.add_argument("--sim", action="store_true", help="CPU + memviz's simulator even where CUDA is available")
    p.add_argument("--sim-device", default="H200", help="the simulated GPU with --sim or without CUDA (default H200)")
    args = p.parse_args(argv)
    for name in ("steps", "width", "depth", "batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    return args


def build_model(width: int, depth: int) -> nn.Module:
    """``depth`` Linear + ReLU blocks of ``width`` features, then a 10-class head."""
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def wrap(model: nn.Module, strategy: str, device: torch.device, mesh: object) -> nn.Module:
    """DDP, or FSDP2 (``fully_shard`` on each Linear, then on the whole model, over ``mesh``), as their tutorials do."""
    if strategy == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids)
        if dist.get_backend() == "fake":
            ddp.register_comm_hook(None, _bucket_as_it_is)
        return ddp
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    # foreach=True is what torch picks on CUDA by default; said here so that the CPU run takes the same code path
    return torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)


def _bucket_as_it_is(state, bucket):  # no annotations: DDP checks them, and this file's are strings
    """The fake group's all-reduce: the bucket, unchanged (what DDP's all-reduce leaves in place, less the sum)."""
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def train(model: nn.Module, optimizer: torch.optim.Optimizer, args: argparse.Namespace, device: torch.device,
          rank: int) -> None:
    generator = torch.Generator(device=device).manual_seed(rank)  # each rank its own batches, as a sampler gives
    for _ in range(args.steps):
        x = torch.randn(args.batch, args.width, device=device, generator=generator)
        y = torch.randint(0, 10, (args.batch,), device=device, generator=generator)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    use_cuda = torch.cuda.is_available() and not args.sim
    if use_cuda:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
        own_gpus = int(os.environ.get("LOCAL_WORLD_SIZE", world)) <= torch.cuda.device_count()
        backend = args.backend if args.backend != "auto" else ("nccl" if own_gpus else "gloo")
    else:
        device = torch.device("cpu")
        if args.backend == "nccl":
            raise SystemExit("--backend nccl needs CUDA; without it the ranks run on CPU with gloo")
        backend = "fake" if args.backend == "fake" else "gloo"
    if backend == "fake":
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    else:
        dist.init_process_group(backend)
    mesh = None
    if args.strategy == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (world,))  # its rank tensor lives on the host
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"snapshot_rank{rank}.pickle"

    if use_cuda:
        # Python stacks only: symbolizing the C++ frames can take minutes when the snapshot is dumped
        torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
        model = wrap(build_model(args.width, args.depth).to(device), args.strategy, device, mesh)
        optimizer = make_optimizer(model)
        train(model, optimizer, args, device, rank)
        torch.cuda.memory._dump_snapshot(str(path))  # the model and optimizer still alive, as after a training loop
        torch.cuda.memory._record_memory_history(enabled=None)
        stats = torch.cuda.memory_stats(device)
        where = f"{torch.cuda.get_device_name(device)} cuda:{device.index}"
    else:
        from memviz.snapshots.sim_recording import SimRecording

        note = {"rank": rank, "world_size": world, "strategy": args.strategy, "backend": backend}
        recording = SimRecording(args.sim_device, index=local_rank, note=note).start()
        try:
            model = wrap(build_model(args.width, args.depth), args.strategy, device, mesh)
            optimizer = make_optimizer(model)
            train(model, optimizer, args, device, rank)
            recording.dump_snapshot(path)
        finally:
            recording.stop()
        stats = recording.allocator.memory_stats()
        where = f"{recording.device.name} cuda:{local_rank} on CPU (simulated)"
    peak_allocated, peak_reserved = stats["allocated_bytes.all.peak"], stats["reserved_bytes.all.peak"]
    print(f"rank {rank}/{world}: {where}, {args.strategy} over {backend}, {args.steps} steps: peak allocated "
          f"{peak_allocated:,} B, peak reserved {peak_reserved:,} B -> {path}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""memviz.predict of programs written for torchrun, as rank R of N (memviz/predictor/distributed.py), and streams
(memviz/predictor/streams.py): on the CPU torch, in a few seconds."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

import memviz
from memviz.predictor import RankPredictions
from memviz.predictor.distributed import ENV_KEYS
from memviz.predictor.patches import DISTRIBUTED_FLOOR

pytestmark = pytest.mark.skipif(tuple(int(v) for v in torch.__version__.split(".")[:2]) < DISTRIBUTED_FLOOR,
                                reason="distributed programs are predicted from torch 2.11 (a refusal below)")

MiB = 1 << 20


def _fsdp_program(width: int = 256, depth: int = 3, batch: int = 64, steps: int = 2,
                  reshard_after_forward: bool = True) -> None:
    """A torchrun-style FSDP2 script: env, nccl group, set_device, mesh, fully_shard per layer and root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    mesh = init_device_mesh("cuda", (int(os.environ["WORLD_SIZE"]),))
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)]).cuda()
    for layer in model:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(steps):
        model(torch.randn(batch, width, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


def _ddp_program(width: int = 256, depth: int = 3, batch: int = 64, bucket_cap_mb: float = 25.0) -> None:
    """A torchrun-style DDP script (init_method env://, device_ids)."""
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group(backend="nccl", init_method="env://")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DistributedDataParallel(nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)]).cuda(),
                                    device_ids=[local_rank], bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        model(torch.randn(batch, width, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.destroy_process_group()


@pytest.mark.parametrize("world_size", [2, 4])
def test_fsdp2_rank_predicted_with_its_streams_and_resize(world_size: int) -> None:
    p = memviz.predict(_fsdp_program, device="H200", world_size=world_size, rank=0)
    assert p.fits and (p.world_size, p.rank) == (world_size, 0)
    assert len(p.streams) >= 2  # the default stream and FSDP2's all-gather copy-in / reduce-scatter streams
    assert any(e.op == "UntypedStorage.resize_" and e.action == "alloc" for e in p.events)  # unsharded params
    moments = 2 * 3 * (256 * 256 + 256) * 4 // world_size  # AdamW's two moments of this rank's shards
    assert sum(e.nbytes for e in p.events if e.action == "alloc" and e.category == "optimizer state") == moments


def test_world_sizes_shard_the_optimizer_state() -> None:
    by_ws = {n: memviz.predict(_fsdp_program, device="H200", world_size=n, rank=0, width=512, depth=2)
             for n in (2, 4)}
    state = {n: sum(e.nbytes for e in p.events if e.action == "alloc" and e.category == "optimizer state")
             for n, p in by_ws.items()}
    assert state[4] == 2 * (512 * 512 + 512) * 4 // 4 * 2  # AdamW's two moments of 1/4 of both layers
    assert state[2] == 2 * state[4]


def test_ddp_rank_predicted_with_its_buckets_and_rebuild() -> None:
    p = memviz.predict(_ddp_program, device="H200", world_size=2, rank=1)
    assert p.fits and p.streams == (0,)
    params_bytes = 3 * (256 * 256 + 256) * 4
    setup = [e for e in p.events if e.action == "alloc" and e.phase == "setup"]
    assert sum(e.nbytes == params_bytes for e in setup) >= 2  # the init broadcast's flat buffer, the bucket
    rebuilt = [e for e in p.events if e.action == "alloc" and e.module == "DistributedDataParallel"
               and e.op == "empty.memory_format" and e.nbytes > 1024]
    assert rebuilt and sum(e.nbytes for e in rebuilt) == params_bytes  # rebuilt at the second forward


def _uneven_program() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("nccl")
    mesh = init_device_mesh("cuda", (int(os.environ["WORLD_SIZE"]),))

    class Tokens(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.token = nn.Parameter(torch.zeros(1, 4096))  # first dimension 1: only rank 0 holds it
            self.proj = nn.Linear(4096, 4096)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x + self.token)

    model = Tokens().cuda()
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters())
    for _ in range(2):  # the second step's peak holds the optimizer state
        model(torch.randn(8, 4096, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


def test_uneven_shards_predict_ranks_apart() -> None:
    ranks = memviz.predict(_uneven_program, device="H200", world_size=2, rank="all")
    assert isinstance(ranks, RankPredictions) and sorted(ranks) == [0, 1]
    state = {r: sum(e.nbytes for e in p.events if e.action == "alloc" and e.category == "optimizer state")
             for r, p in ranks.items()}
    assert state[0] - state[1] == 2 * 4096 * 4  # rank 0's token shard's two moments
    assert ranks[0].peak_allocated_bytes > ranks[1].peak_allocated_bytes
    assert len(ranks.groups()) == 2 and "rank 0" in ranks.summary()


def test_each_stream_allocates_from_its_own_pool() -> None:
    def program(same_stream: bool) -> None:
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        del x
        with torch.cuda.stream(side if same_stream else torch.cuda.current_stream()):
            torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")

    apart = memviz.predict(program, device="H200", same_stream=False)
    together = memviz.predict(program, device="H200", same_stream=True)
    assert apart.peak_reserved_bytes == 128 * MiB  # the side stream's cached block serves no default-stream request
    assert together.peak_reserved_bytes == 64 * MiB
    assert apart.streams == (0, 1) and together.streams == (1,)


def test_record_stream_holds_the_block_until_a_synchronize() -> None:
    seen: dict[str, int] = {}

    def program() -> None:
        side = torch.cuda.Stream()
        x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        x.record_stream(side)
        del x
        seen["pending"] = torch.cuda.memory_stats()["active_bytes.all.current"]
        torch.cuda.synchronize()
        torch.empty(1, device="cuda")  # the next malloc finishes the frees whose events completed (it dies at once)
        seen["after"] = torch.cuda.memory_stats()["active_bytes.all.current"]

    p = memviz.predict(program, device="H200")
    assert seen == {"pending": 64 * MiB, "after": 0}
    assert any("record_stream" in note for note in p.notes)


def test_everything_is_put_back_also_when_the_program_raises() -> None:
    import torch.distributed.distributed_c10d as c10d
    from torch.nn.parallel import DistributedDataParallel

    before = {k: os.environ.get(k) for k in ENV_KEYS}
    originals = (c10d.rendezvous, c10d._new_process_group_helper, DistributedDataParallel.__init__,
                 DistributedDataParallel.forward, torch.autograd._engine_run_backward, torch.cuda.Stream)
    storage_own = {name for name in ("resize_", "data_ptr") if name in vars(torch.UntypedStorage)}

    def failing() -> None:
        _ddp_program(width=64, depth=1, batch=4)
        raise RuntimeError("the program's own error")

    with pytest.raises(RuntimeError, match="the program's own error"):
        memviz.predict(failing, world_size=2, rank=1)
    assert {k: os.environ.get(k) for k in ENV_KEYS} == before
    assert not dist.is_initialized()
    assert (c10d.rendezvous, c10d._new_process_group_helper, DistributedDataParallel.__init__,
            DistributedDataParallel.forward, torch.autograd._engine_run_backward, torch.cuda.Stream) == originals
    assert {name for name in ("resize_", "data_ptr") if name in vars(torch.UntypedStorage)} == storage_own

    def left_open() -> None:  # raises before its destroy_process_group
        dist.init_process_group("nccl")
        raise ValueError("stopped")

    with pytest.raises(ValueError):
        memviz.predict(left_open, world_size=2, rank=0)
    assert not dist.is_initialized()


@pytest.mark.parametrize(("world_size", "rank"), [(0, 0), (2, 2), (2, -1), (True, 0), (2, "1")])
def test_a_rank_no_job_has_is_refused(world_size: object, rank: object) -> None:
    with pytest.raises(memviz.InputError):
        memviz.predict(_fsdp_program, world_size=world_size, rank=rank)
    with pytest.raises(memviz.InputError, match="needs world_size"):
        memviz.predict(_fsdp_program, rank=1)


def test_the_command_line_predicts_every_rank(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from memviz.fit import main

    assert main([f"{__file__}:_uneven_program", "--device", "H200", "--world-size", "2", "--rank", "all", "--json",
                 "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["world_size"] == 2 and [row["rank"] for row in out["ranks"]] == [0, 1]
    assert out["ranks"][0]["peak_allocated_bytes"] > out["ranks"][1]["peak_allocated_bytes"]
    assert main([f"{__file__}:_uneven_program", "--world-size", "2", "--rank", "2", "--no-progress"]) == 2

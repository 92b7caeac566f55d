"""Multi-GPU training programs written as ``torchrun`` users write them: the development set of issue 26.

Each function of ``PROGRAMS`` is the ``main()`` of a training script launched once per rank (``torchrun
--nproc-per-node N script.py``, or one task per GPU under SLURM): it reads ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` from the environment, calls ``dist.init_process_group("nccl")``, ``torch.cuda.set_device``,
``init_device_mesh`` where FSDP2 wants a mesh, builds its model, wraps it (FSDP2 ``fully_shard`` per block and
on the root, or ``DistributedDataParallel``), trains 3 steps with AdamW and calls
``dist.destroy_process_group()``. Nothing in them knows it is being recorded:
``evaluation/record_dist.py`` makes the process group fake from outside (see its docstring).

Keyword arguments are the sizes and options a script would take from its command line; every program also
has ``device: str = "cuda"``, the constant a script would hard-code, so the same code runs on CPU tensors with
the gloo backend (``"cpu"``: how the recorder checks its harness on a machine with no GPU).

The programs (shapes in elements, sizes in parameters):

- ``gpt_fsdp``: a GPT-2-style decoder of our own (pre-LayerNorm blocks, fused QKV projection, SDPA causal
  attention, 4x GELU MLP, learned positions, untied head; vocabulary 50257 by default, so the embedding and
  the head shard unevenly over 2/4/8 ranks), FSDP2 per block and on the root; options
  ``reshard_after_forward``, ``mixed_precision`` (``MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=fp32)``) and ``meta_init`` (built on ``meta``, sharded, ``to_empty(device="cuda")``, then
  ``init_weights()``).
- ``gpt_ddp``: the same model under DDP; options ``bucket_cap_mb`` (None: DDP's default), ``gradient_as_bucket_view``
  and ``amp`` (bf16 autocast).
- ``mlp_fsdp`` / ``mlp_ddp``: a deep MLP with widths that no world size divides (1000 -> 3001 -> ... -> 10):
  FSDP2 per linear layer; every rank holds a different shard size.
- ``llama_fsdp``: Hugging Face ``LlamaForCausalLM`` from a ``LlamaConfig`` (random weights, no download),
  built on the CPU and moved to the GPU by ``fully_shard`` (per decoder layer, then the root), loss from
  ``labels``.
- ``gpt2_ddp``: Hugging Face ``GPT2LMHeadModel`` from a ``GPT2Config`` (dropout on, tied embeddings) under DDP.

``RUNS`` is the recording plan (``python3 evaluation/record_dist.py --module evaluation.programs.dist``).
``CPU_SHRINK`` gives, per program, keyword arguments that shrink it for the CPU check of the harness.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

STEPS = 3


@dataclass(frozen=True)
class Rank:
    """Where this process stands in the job."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device


def _init_distributed(device: str) -> Rank:
    """What the top of a torchrun script does: read the environment, join the group, pick this rank's GPU."""
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if device == "cuda":
        dist.init_process_group("nccl")
        torch.cuda.set_device(local_rank)
        return Rank(rank, world_size, local_rank, torch.device("cuda", local_rank))
    dist.init_process_group("gloo")
    return Rank(rank, world_size, local_rank, torch.device("cpu"))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention (SDPA) and a 4x GELU MLP."""

    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.n_head, c // self.n_head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(y.transpose(1, 2).reshape(b, t, c))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Token and position embeddings, ``n_layer`` blocks, a final LayerNorm and an untied head."""

    def __init__(self, vocab: int, seq: int, d_model: int, n_layer: int, n_head: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def init_weights(self) -> None:
        """GPT-2's initialization (normal 0.02, zero biases, unit LayerNorms); also after ``to_empty``."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
            if isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def _train_lm(model: nn.Module, vocab: int, batch: int, seq: int, device: torch.device, amp: bool = False) -> None:
    """3 steps of next-token prediction on random tokens with AdamW."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    for _ in range(STEPS):
        idx = torch.randint(vocab, (batch, seq + 1), device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), idx[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def gpt_fsdp(batch: int = 8, seq: int = 512, d_model: int = 1024, n_layer: int = 8, n_head: int = 16,
             vocab: int = 50257, reshard_after_forward: bool = True, mixed_precision: bool = False,
             meta_init: bool = False, device: str = "cuda") -> None:
    """Our GPT under FSDP2: ``fully_shard`` on every block, then on the root."""
    env = _init_distributed(device)
    torch.manual_seed(env.rank)
    mesh = init_device_mesh(device, (env.world_size,))
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if mixed_precision else MixedPrecisionPolicy()
    with torch.device("meta" if meta_init else env.device):
        model = GPT(vocab, seq, d_model, n_layer, n_head)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)
    if meta_init:
        model.to_empty(device=env.device)
        model.init_weights()
    _train_lm(model, vocab, batch, seq, env.device)
    dist.destroy_process_group()


def _ddp(model: nn.Module, device: str, local_rank: int, bucket_cap_mb: float | None,
         gradient_as_bucket_view: bool) -> DistributedDataParallel:
    """``DistributedDataParallel(model, device_ids=[local_rank])``, DDP's defaults unless an option is given."""
    options: dict = {"gradient_as_bucket_view": True} if gradient_as_bucket_view else {}
    if bucket_cap_mb is not None:
        options["bucket_cap_mb"] = bucket_cap_mb
    return DistributedDataParallel(model, device_ids=[local_rank] if device == "cuda" else None, **options)


def gpt_ddp(batch: int = 8, seq: int = 512, d_model: int = 1024, n_layer: int = 8, n_head: int = 16,
            vocab: int = 50257, bucket_cap_mb: float | None = None, gradient_as_bucket_view: bool = False,
            amp: bool = False, device: str = "cuda") -> None:
    """Our GPT under DDP."""
    env = _init_distributed(device)
    torch.manual_seed(env.rank)
    model = GPT(vocab, seq, d_model, n_layer, n_head).to(env.device)
    model = _ddp(model, device, env.local_rank, bucket_cap_mb, gradient_as_bucket_view)
    _train_lm(model, vocab, batch, seq, env.device, amp=amp)
    dist.destroy_process_group()


def _mlp(d_in: int, hidden: int, depth: int, d_out: int) -> nn.Sequential:
    """``depth`` linear layers with GELU between them."""
    widths = [d_in] + [hidden] * (depth - 1) + [d_out]
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(a, b))
        if i < depth - 1:
            layers.append(nn.GELU())
    return nn.Sequential(*layers)


def _train_classifier(model: nn.Module, make_input: Callable[[], torch.Tensor], classes: int, batch: int,
                      device: torch.device, amp: bool = False) -> None:
    """3 steps of cross-entropy classification on random data with AdamW."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(STEPS):
        x = make_input()
        y = torch.randint(classes, (batch,), device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def mlp_fsdp(batch: int = 4096, d_in: int = 1000, hidden: int = 3001, depth: int = 6, classes: int = 10,
             reshard_after_forward: bool = True, device: str = "cuda") -> None:
    """An MLP whose widths no world size divides, under FSDP2: ``fully_shard`` per linear layer, then the root."""
    env = _init_distributed(device)
    torch.manual_seed(env.rank)
    mesh = init_device_mesh(device, (env.world_size,))
    model = _mlp(d_in, hidden, depth, classes).to(env.device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    _train_classifier(model, lambda: torch.randn(batch, d_in, device=env.device), classes, batch, env.device)
    dist.destroy_process_group()


def mlp_ddp(batch: int = 4096, d_in: int = 1000, hidden: int = 3001, depth: int = 6, classes: int = 10,
            bucket_cap_mb: float | None = None, gradient_as_bucket_view: bool = False, device: str = "cuda") -> None:
    """The same MLP under DDP."""
    env = _init_distributed(device)
    torch.manual_seed(env.rank)
    model = _ddp(_mlp(d_in, hidden, depth, classes).to(env.device), device, env.local_rank, bucket_cap_mb,
                 gradient_as_bucket_view)
    _train_classifier(model, lambda: torch.randn(batch, d_in, device=env.device), classes, batch, env.device)
    dist.destroy_process_group()


def llama_fsdp(batch: int = 4, seq: int = 1024, hidden: int = 1024, layers: int = 6, heads: int = 16,
               kv_heads: int = 4, intermediate: int = 2816, vocab: int = 32000, reshard_after_forward: bool = True,
               mixed_precision: bool = False, device: str = "cuda") -> None:
    """Hugging Face Llama from a config, built on the CPU, sharded onto the GPU by FSDP2 (per decoder layer)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    env = _init_distributed(device)
    torch.manual_seed(env.rank)
    mesh = init_device_mesh(device, (env.world_size,))
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=seq)
    model = LlamaForCausalLM(config)
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if mixed_precision else MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)
    _train_hf_lm(model, vocab, batch, seq, env.device)
    dist.destroy_process_group()


def _train_hf_lm(model: nn.Module, vocab: int, batch: int, seq: int, device: torch.device, amp: bool = False) -> None:
    """3 steps of a Hugging Face causal LM on random tokens (its loss from ``labels``) with AdamW."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(STEPS):
        input_ids = torch.randint(vocab, (batch, seq), device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def gpt2_ddp(batch: int = 8, seq: int = 512, n_embd: int = 768, n_layer: int = 6, n_head: int = 12,
             vocab: int = 50257, bucket_cap_mb: float | None = None, gradient_as_bucket_view: bool = False,
             amp: bool = False, device: str = "cuda") -> None:
    """Hugging Face GPT-2 from a config (dropout on, tied embeddings) under DDP."""
    from transformers import GPT2Config, GPT2LMHeadModel

    env = _init_distributed(device)
    torch.manual_seed(env.rank)
    config = GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=n_embd, n_layer=n_layer, n_head=n_head)
    model = GPT2LMHeadModel(config).to(env.device)
    model = _ddp(model, device, env.local_rank, bucket_cap_mb, gradient_as_bucket_view)
    _train_hf_lm(model, vocab, batch, seq, env.device, amp=amp)
    dist.destroy_process_group()


PROGRAMS: dict[str, Callable[..., None]] = {
    "gpt_fsdp": gpt_fsdp,
    "gpt_ddp": gpt_ddp,
    "mlp_fsdp": mlp_fsdp,
    "mlp_ddp": mlp_ddp,
    "llama_fsdp": llama_fsdp,
    "gpt2_ddp": gpt2_ddp,
}

#: Keyword arguments that shrink each program for the CPU check of the harness (``record_dist.py --device cpu``):
#: the same code paths, the same options, small enough for seconds on two cores.
CPU_SHRINK: dict[str, dict] = {
    "gpt_fsdp": {"batch": 2, "seq": 16, "d_model": 32, "n_layer": 2, "n_head": 2, "vocab": 1001},
    "gpt_ddp": {"batch": 2, "seq": 16, "d_model": 32, "n_layer": 2, "n_head": 2, "vocab": 1001},
    "mlp_fsdp": {"batch": 8, "d_in": 100, "hidden": 301, "depth": 3},
    "mlp_ddp": {"batch": 8, "d_in": 100, "hidden": 301, "depth": 3},
    "llama_fsdp": {"batch": 2, "seq": 16, "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 176,
                   "vocab": 1000},
    "gpt2_ddp": {"batch": 2, "seq": 16, "n_embd": 32, "n_layer": 2, "n_head": 2, "vocab": 1001},
}

EXP = "expandable_segments:True"


def _run(run_id: str, program: str, world_size: int, kwargs: dict | None = None, *, all_ranks: bool = False,
         alloc_conf: str = "", cap_gib: float | None = None) -> dict:
    """One entry of ``RUNS``: ranks 0 and world_size - 1, or every rank where shards are uneven."""
    ranks = list(range(world_size)) if all_ranks else [0, world_size - 1]
    return {"id": run_id, "program": program, "kwargs": kwargs or {}, "world_size": world_size, "ranks": ranks,
            "alloc_conf": alloc_conf, "cap_gib": cap_gib}


#: The recording plan: 21 runs, 52 (run, rank) processes. FSDP2 runs of models with uneven shards (the GPT's
#: vocabulary of 50257, the MLP's widths) record every rank; Llama's shapes divide by 8 (every rank holds equal
#: shards) and DDP replicates, so those record ranks 0 and N-1. ``cap_gib`` None: no cap (the runs need a few GiB
#: each, 8 share the 139 GiB H200). The one cap (``dist-gpt-ddp-ws2-cap6``) was chosen blind, below a rough
#: 20 bytes per parameter (weights, gradients, one bucket copy, AdamW's two moments) plus the logits: whether it
#: fits or runs out is the recording's to say.
RUNS: list[dict] = [
    # FSDP2, our GPT (vocabulary 50257: uneven shards on every world size)
    _run("dist-gpt-fsdp-ws2", "gpt_fsdp", 2, all_ranks=True),
    _run("dist-gpt-fsdp-ws2-noreshard", "gpt_fsdp", 2, {"reshard_after_forward": False}, all_ranks=True),
    _run("dist-gpt-fsdp-ws2-exp", "gpt_fsdp", 2, all_ranks=True, alloc_conf=EXP),
    _run("dist-gpt-fsdp-ws4-mp", "gpt_fsdp", 4, {"mixed_precision": True}, all_ranks=True),
    _run("dist-gpt-fsdp-ws8-meta-mp", "gpt_fsdp", 8, {"meta_init": True, "mixed_precision": True}, all_ranks=True),
    # FSDP2, the uneven MLP
    _run("dist-mlp-fsdp-ws4", "mlp_fsdp", 4, all_ranks=True),
    _run("dist-mlp-fsdp-ws2-noreshard", "mlp_fsdp", 2, {"reshard_after_forward": False}, all_ranks=True),
    # FSDP2, Hugging Face Llama (every shape divides by 8)
    _run("dist-llama-fsdp-ws2-mp", "llama_fsdp", 2, {"mixed_precision": True}),
    _run("dist-llama-fsdp-ws4", "llama_fsdp", 4),
    _run("dist-llama-fsdp-ws4-noreshard-mp", "llama_fsdp", 4, {"reshard_after_forward": False,
                                                                  "mixed_precision": True}),
    _run("dist-llama-fsdp-ws8-mp", "llama_fsdp", 8, {"mixed_precision": True}),
    # DDP, our GPT
    _run("dist-gpt-ddp-ws2", "gpt_ddp", 2),
    _run("dist-gpt-ddp-ws4-bucket100", "gpt_ddp", 4, {"bucket_cap_mb": 100}),
    _run("dist-gpt-ddp-ws8-gabv", "gpt_ddp", 8, {"gradient_as_bucket_view": True}),
    _run("dist-gpt-ddp-ws2-amp", "gpt_ddp", 2, {"amp": True}),
    _run("dist-gpt-ddp-ws4-exp", "gpt_ddp", 4, alloc_conf=EXP),
    _run("dist-gpt-ddp-ws2-cap6", "gpt_ddp", 2, cap_gib=6.0),
    # DDP, the MLP
    _run("dist-mlp-ddp-ws4", "mlp_ddp", 4),
    _run("dist-mlp-ddp-ws8-bucket5-gabv", "mlp_ddp", 8, {"bucket_cap_mb": 5, "gradient_as_bucket_view": True}),
    # DDP, Hugging Face GPT-2
    _run("dist-gpt2-ddp-ws2", "gpt2_ddp", 2),
    _run("dist-gpt2-ddp-ws8-bucket10-gabv", "gpt2_ddp", 8, {"bucket_cap_mb": 10, "gradient_as_bucket_view": True}),
]

"""HELD-OUT multi-GPU training programs of issue 26: the check of the per-rank predictor, never its material.

Nothing may be tuned on these programs or their recordings: no rule, constant, special case or threshold of the
predictor may be chosen, adjusted or confirmed by looking at them. Predict them blind (keep the blind
figures), record them (``python3 evaluation/record_dist.py --module evaluation.programs.dist_heldout``), compare,
and report the comparison as it is. A rule found wrong here is fixed from the sources (PyTorch's, the
allocator's, the library's) and checked on the development set (``evaluation/programs/dist.py``); this set
then stays a check of the fixed predictor only if the fix was not read off it (say so when it was, and add a
new held-out set).

Written as ``torchrun`` users write them, independently of the development set's code: different models (a
Vision Transformer on ``nn.TransformerEncoderLayer`` with a class token and position embedding, a ResNet with
BatchNorm, Hugging Face BERT, Qwen2 and T5), different sizes and options (``init_process_group(backend="nccl",
init_method="env://")`` imported with ``from torch.distributed import ...``, Hugging Face meta-device
initialization with ``init_weights()``, gradient checkpointing under FSDP2, DDP's buffer broadcast for
BatchNorm's running statistics, an encoder-decoder). Each ``PROGRAMS`` function is a script's ``main()``:
read ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK``, join the group, ``torch.cuda.set_device``, ``init_device_mesh``
for FSDP2, build, wrap, 3 AdamW steps, ``destroy_process_group()``; ``device: str = "cuda"`` is the constant a
script would hard-code (``"cpu"`` for the recorder's harness check, with the gloo backend).

- ``vit_fsdp`` / ``vit_ddp``: ViT (16x16 patchify convolution, class token, learned position embedding of shape
  (1, 197, d), pre-norm ``nn.TransformerEncoderLayer`` blocks, linear head) on random 224x224 images. Under
  FSDP2 (per encoder layer, then the root) the class token and position embedding have a first dimension of 1,
  so rank 0 holds them and the other ranks hold empty shards: ranks differ. Options ``reshard_after_forward``,
  ``mixed_precision``, ``meta_init`` (``to_empty`` then ``init_weights()``); under DDP ``amp``,
  ``bucket_cap_mb``, ``gradient_as_bucket_view``.
- ``resnet_ddp``: a ResNet-18-style network with BatchNorm (DDP broadcasts its buffers from rank 0 before
  every forward) on random images; options ``amp``, ``bucket_cap_mb``, ``gradient_as_bucket_view``.
- ``bert_fsdp``: Hugging Face ``BertForMaskedLM`` (vocabulary 30522: uneven over 4 and 8 ranks, tied decoder)
  with 15% of tokens as labels, FSDP2 per encoder layer and on the root.
- ``qwen2_fsdp``: Hugging Face ``Qwen2ForCausalLM`` (vocabulary 151936, tied embeddings) built on ``meta``,
  sharded, ``to_empty(device="cuda")``, ``init_weights()``; option ``gradient_checkpointing``
  (``gradient_checkpointing_enable(use_reentrant=False)``).
- ``t5_ddp``: Hugging Face ``T5ForConditionalGeneration`` (source 256, target 64 tokens) under DDP.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed import destroy_process_group, init_process_group
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 3


def setup(device: str) -> tuple[int, int, torch.device]:
    """(world size, local rank, device) after joining the job the launcher described in the environment."""
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    init_process_group(backend="nccl" if device == "cuda" else "gloo", init_method="env://")
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        return world_size, local_rank, torch.device(f"cuda:{local_rank}")
    return world_size, local_rank, torch.device("cpu")


class ViT(nn.Module):
    """Vision Transformer: patchify convolution, class token, position embedding, pre-norm encoder, linear head."""

    def __init__(self, image: int, patch: int, dim: int, depth: int, heads: int, classes: int) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, (image // patch) ** 2 + 1, dim))
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, activation="gelu", batch_first=True,
                                       norm_first=True)
            for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def init_weights(self) -> None:
        """Every module's own reset, then truncated-normal position embedding and class token."""
        for m in self.modules():
            if m is not self and hasattr(m, "reset_parameters"):
                m.reset_parameters()
            elif isinstance(m, nn.MultiheadAttention):
                m._reset_parameters()
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x[:, 0]))


def classify(model: nn.Module, batch: int, image: int, classes: int, device: torch.device, amp: bool) -> None:
    """3 AdamW steps of image classification on random images."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    for _ in range(STEPS):
        images = torch.randn(batch, 3, image, image, device=device)
        labels = torch.randint(classes, (batch,), device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def vit_fsdp(batch: int = 32, image: int = 224, patch: int = 16, dim: int = 768, depth: int = 8, heads: int = 12,
             classes: int = 1000, reshard_after_forward: bool = True, mixed_precision: bool = False,
             meta_init: bool = False, device: str = "cuda") -> None:
    """ViT under FSDP2: per encoder layer, then the root (patch embedding, tokens, norm, head)."""
    world_size, _local_rank, dev = setup(device)
    mesh = init_device_mesh(device, (world_size,))
    with torch.device("meta" if meta_init else dev):
        model = ViT(image, patch, dim, depth, heads, classes)
    options = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if mixed_precision:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, **options)
    fully_shard(model, **options)
    if meta_init:
        model.to_empty(device=device)
        model.init_weights()
    classify(model, batch, image, classes, dev, amp=False)
    destroy_process_group()


def ddp_wrap(model: nn.Module, device: str, local_rank: int, bucket_cap_mb: float | None,
             gradient_as_bucket_view: bool) -> DDP:
    """DDP with its defaults, and the options the command line gave."""
    kwargs = {}
    if bucket_cap_mb is not None:
        kwargs["bucket_cap_mb"] = bucket_cap_mb
    if gradient_as_bucket_view:
        kwargs["gradient_as_bucket_view"] = True
    return DDP(model, device_ids=[local_rank] if device == "cuda" else None, **kwargs)


def vit_ddp(batch: int = 48, image: int = 224, patch: int = 16, dim: int = 512, depth: int = 8, heads: int = 8,
            classes: int = 1000, amp: bool = False, bucket_cap_mb: float | None = None,
            gradient_as_bucket_view: bool = False, device: str = "cuda") -> None:
    """ViT under DDP."""
    _world_size, local_rank, dev = setup(device)
    model = ViT(image, patch, dim, depth, heads, classes).to(dev)
    model = ddp_wrap(model, device, local_rank, bucket_cap_mb, gradient_as_bucket_view)
    classify(model, batch, image, classes, dev, amp=amp)
    destroy_process_group()


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm and a residual (a 1x1 projection when the shape changes)."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


def resnet(width: int, blocks: tuple[int, ...], classes: int) -> nn.Sequential:
    """ResNet-18-style: 7x7/2 stem, max pool, stages of basic blocks doubling the width, average pool, linear."""
    layers: list[nn.Module] = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                               nn.MaxPool2d(3, 2, 1)]
    c = width
    for stage, n in enumerate(blocks):
        c_out = width * 2 ** stage
        for i in range(n):
            layers.append(BasicBlock(c, c_out, 2 if stage > 0 and i == 0 else 1))
            c = c_out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, classes)]
    return nn.Sequential(*layers)


def resnet_ddp(batch: int = 64, image: int = 160, width: int = 64, blocks: tuple[int, ...] = (2, 2, 2, 2),
               classes: int = 1000, amp: bool = False, bucket_cap_mb: float | None = None,
               gradient_as_bucket_view: bool = False, device: str = "cuda") -> None:
    """ResNet with BatchNorm under DDP (running statistics broadcast from rank 0 before each forward)."""
    _world_size, local_rank, dev = setup(device)
    model = ddp_wrap(resnet(width, tuple(blocks), classes).to(dev), device, local_rank, bucket_cap_mb,
                     gradient_as_bucket_view)
    classify(model, batch, image, classes, dev, amp=amp)
    destroy_process_group()


def lm_steps(model: nn.Module, make_batch: Callable[[], dict], amp: bool = False) -> None:
    """3 AdamW steps of a Hugging Face model whose loss comes from the batch's labels."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    for _ in range(STEPS):
        batch = make_batch()
        with torch.autocast(next(iter(batch.values())).device.type, dtype=torch.bfloat16, enabled=amp):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def bert_fsdp(batch: int = 16, seq: int = 256, hidden: int = 768, layers: int = 6, heads: int = 12,
              intermediate: int = 3072, vocab: int = 30522, reshard_after_forward: bool = True,
              mixed_precision: bool = False, device: str = "cuda") -> None:
    """Hugging Face BERT masked-LM pre-training under FSDP2 (per encoder layer, then the root)."""
    from transformers import BertConfig, BertForMaskedLM

    world_size, _local_rank, dev = setup(device)
    mesh = init_device_mesh(device, (world_size,))
    config = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=intermediate, max_position_embeddings=max(512, seq))
    with torch.device(dev):
        model = BertForMaskedLM(config)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed_precision else None
    for layer in model.bert.encoder.layer:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward, **({"mp_policy": mp} if mp else {}))
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, **({"mp_policy": mp} if mp else {}))

    def make_batch() -> dict:
        input_ids = torch.randint(vocab, (batch, seq), device=dev)
        masked = torch.rand(batch, seq, device=dev) < 0.15
        return {"input_ids": input_ids, "labels": input_ids.masked_fill(~masked, -100)}

    lm_steps(model, make_batch)
    destroy_process_group()


def qwen2_fsdp(batch: int = 4, seq: int = 1024, hidden: int = 896, layers: int = 6, heads: int = 14,
               kv_heads: int = 2, intermediate: int = 4864, vocab: int = 151936, mixed_precision: bool = True,
               gradient_checkpointing: bool = False, device: str = "cuda") -> None:
    """Hugging Face Qwen2 built on the meta device, sharded by FSDP2, materialized with to_empty + init_weights."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    world_size, _local_rank, dev = setup(device)
    mesh = init_device_mesh(device, (world_size,))
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, intermediate_size=intermediate, max_position_embeddings=seq,
                         tie_word_embeddings=True)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed_precision \
        else MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    model.to_empty(device=device)
    model.init_weights()

    def make_batch() -> dict:
        input_ids = torch.randint(vocab, (batch, seq), device=dev)
        return {"input_ids": input_ids, "labels": input_ids}

    lm_steps(model, make_batch)
    destroy_process_group()


def t5_ddp(batch: int = 16, source: int = 256, target: int = 64, d_model: int = 512, layers: int = 6,
           heads: int = 8, d_ff: int = 2048, vocab: int = 32128, amp: bool = False, bucket_cap_mb: float | None = None,
           gradient_as_bucket_view: bool = False, device: str = "cuda") -> None:
    """Hugging Face T5 (encoder-decoder) under DDP."""
    from transformers import T5Config, T5ForConditionalGeneration

    _world_size, local_rank, dev = setup(device)
    config = T5Config(vocab_size=vocab, d_model=d_model, d_kv=d_model // heads, d_ff=d_ff, num_layers=layers,
                      num_heads=heads, decoder_start_token_id=0, pad_token_id=0)
    model = ddp_wrap(T5ForConditionalGeneration(config).to(dev), device, local_rank, bucket_cap_mb,
                     gradient_as_bucket_view)

    def make_batch() -> dict:
        return {"input_ids": torch.randint(1, vocab, (batch, source), device=dev),
                "labels": torch.randint(1, vocab, (batch, target), device=dev)}

    lm_steps(model, make_batch, amp=amp)
    destroy_process_group()


PROGRAMS: dict[str, Callable[..., None]] = {
    "vit_fsdp": vit_fsdp,
    "vit_ddp": vit_ddp,
    "resnet_ddp": resnet_ddp,
    "bert_fsdp": bert_fsdp,
    "qwen2_fsdp": qwen2_fsdp,
    "t5_ddp": t5_ddp,
}

#: Keyword arguments that shrink each program for the recorder's CPU check of its harness (same code paths).
CPU_SHRINK: dict[str, dict] = {
    "vit_fsdp": {"batch": 2, "image": 32, "patch": 8, "dim": 32, "depth": 2, "heads": 2, "classes": 10},
    "vit_ddp": {"batch": 2, "image": 32, "patch": 8, "dim": 32, "depth": 2, "heads": 2, "classes": 10},
    "resnet_ddp": {"batch": 2, "image": 32, "width": 8, "blocks": (1, 1), "classes": 10},
    "bert_fsdp": {"batch": 2, "seq": 16, "hidden": 32, "layers": 2, "heads": 2, "intermediate": 64, "vocab": 1001},
    "qwen2_fsdp": {"batch": 2, "seq": 16, "hidden": 32, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate": 64,
                   "vocab": 1000},
    "t5_ddp": {"batch": 2, "source": 16, "target": 8, "d_model": 32, "layers": 2, "heads": 2, "d_ff": 64,
               "vocab": 1000},
}

EXPANDABLE = "expandable_segments:True"


def run(run_id: str, program: str, world_size: int, kwargs: dict | None = None, *, every_rank: bool = False,
        alloc_conf: str = "", cap_gib: float | None = None) -> dict:
    """A ``RUNS`` entry recording ranks 0 and N-1, or every rank (``every_rank``: shards differ between ranks)."""
    return {"id": run_id, "program": program, "kwargs": kwargs or {}, "world_size": world_size,
            "ranks": list(range(world_size)) if every_rank else [0, world_size - 1], "alloc_conf": alloc_conf,
            "cap_gib": cap_gib}


#: The held-out plan: 16 runs, 42 (run, rank) processes. Every rank where shards differ (the ViT's class token
#: and position embedding; BERT's vocabulary and token-type embedding over 4 ranks); ranks 0 and N-1 elsewhere
#: (Qwen2's shapes divide by 8; DDP replicates). The one cap (``distho-vit-ddp-ws4-cap3``) was chosen blind
#: before any prediction or recording of this set.
RUNS: list[dict] = [
    run("distho-vit-fsdp-ws2-mp", "vit_fsdp", 2, {"mixed_precision": True}, every_rank=True),
    run("distho-vit-fsdp-ws4-noreshard", "vit_fsdp", 4, {"reshard_after_forward": False}, every_rank=True),
    run("distho-vit-fsdp-ws8-meta-mp", "vit_fsdp", 8, {"meta_init": True, "mixed_precision": True},
        every_rank=True),
    run("distho-vit-fsdp-ws2-b64-exp", "vit_fsdp", 2, {"batch": 64}, every_rank=True, alloc_conf=EXPANDABLE),
    run("distho-bert-fsdp-ws4-mp-noreshard", "bert_fsdp", 4, {"mixed_precision": True,
                                                               "reshard_after_forward": False}, every_rank=True),
    run("distho-bert-fsdp-ws2", "bert_fsdp", 2, every_rank=True),
    run("distho-qwen2-fsdp-ws4", "qwen2_fsdp", 4),
    run("distho-qwen2-fsdp-ws8-ckpt", "qwen2_fsdp", 8, {"gradient_checkpointing": True, "batch": 8}),
    run("distho-resnet-ddp-ws2", "resnet_ddp", 2),
    run("distho-resnet-ddp-ws4-gabv-amp", "resnet_ddp", 4, {"gradient_as_bucket_view": True, "amp": True}),
    run("distho-resnet-ddp-ws8-bucket5", "resnet_ddp", 8, {"bucket_cap_mb": 5}),
    run("distho-resnet-ddp-ws2-exp", "resnet_ddp", 2, alloc_conf=EXPANDABLE),
    run("distho-t5-ddp-ws2-amp", "t5_ddp", 2, {"amp": True}),
    run("distho-t5-ddp-ws4-bucket50-gabv", "t5_ddp", 4, {"bucket_cap_mb": 50, "gradient_as_bucket_view": True}),
    run("distho-vit-ddp-ws8-amp", "vit_ddp", 8, {"amp": True}),
    run("distho-vit-ddp-ws4-cap3", "vit_ddp", 4, cap_gib=3.0),
]

"""Ordinary PyTorch CUDA programs: the predictor's examples and its recorded truth.

Each function is a user's training or inference script as they would write it for a GPU: it builds
its model, moves it with ``.cuda()`` / ``.to("cuda")`` or ``device="cuda"``, makes its inputs on
"cuda", and runs a few steps. Nothing in them knows about memviz. ``memviz.predict(fn, batch=...)``
runs them with no GPU; ``evaluation/record_runs.py`` runs the same functions on a real GPU (a fresh process
each, under ``torch.cuda.memory._record_memory_history``) and the recordings in ``evaluation/recordings/``
are what the predictor is checked against. Changing a program invalidates its recordings.

The ResNets are torchvision's ``resnet18`` / ``resnet50`` (v1.5, ``ReLU(inplace=True)``) written out in
plain torch so that the programs need no torchvision; the GPT is a decoder-only transformer with
``F.scaled_dot_product_attention(is_causal=True)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint as _checkpoint

__all__ = [
    "PROGRAMS",
    "causal_lm_finetune",
    "causal_lm_generate",
    "convnet_sgd_training",
    "gpt_inference",
    "gpt_training",
    "llama_config",
    "mlp_training",
    "resnet_inference",
    "resnet_training",
]


# ---- models ---------------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """torchvision's ResNet: the same modules in the same order, so the same allocations."""

    def __init__(self, depth: int = 18, num_classes: int = 1000):
        super().__init__()
        block, layers = {18: (BasicBlock, [2, 2, 2, 2]), 34: (BasicBlock, [3, 4, 6, 3]),
                         50: (Bottleneck, [3, 4, 6, 3]), 101: (Bottleneck, [3, 4, 23, 3])}[depth]
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], 2)
        self.layer3 = self._make_layer(block, 256, layers[2], 2)
        self.layer4 = self._make_layer(block, 512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

    def _make_layer(self, block: type, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class Attention(nn.Module):
    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, d))


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_head)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int = 32000, seq: int = 1024, d_model: int = 768, n_layer: int = 6,
                 n_head: int = 12, checkpoint: bool = False):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.checkpoint = checkpoint

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = _checkpoint(block, x, use_reentrant=False) if self.checkpoint and self.training else block(x)
        return self.head(self.ln(x))


# ---- programs -------------------------------------------------------------------------------------


def mlp_training(*, batch: int = 256, steps: int = 3, amp: bool = False) -> None:
    """An MLP on 3×64×64 inputs (12288 → 4096 → 4096 → 100), AdamW, ``steps`` steps."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 64 * 64, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                          nn.Linear(4096, 100)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(batch, 3, 64, 64, device="cuda")
    y = torch.randint(0, 100, (batch,), device="cuda")
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def resnet_training(*, batch: int = 64, depth: int = 18, image: int = 224, steps: int = 3, amp: bool = False) -> None:
    """torchvision's ResNet-``depth`` on ``image``² inputs, 1000 classes, AdamW, ``steps`` steps."""
    torch.manual_seed(0)
    model = ResNet(depth).to("cuda")
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(batch, 3, image, image, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def convnet_sgd_training(*, batch: int = 128, steps: int = 3, width: int = 64) -> None:
    """A small VGG-style CNN with BatchNorm on 3×64×64, SGD with momentum, ``zero_grad(set_to_none=False)``."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    c = 3
    for out in (width, 2 * width, 4 * width, 8 * width):
        layers += [nn.Conv2d(c, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU(), nn.MaxPool2d(2)]
        c = out
    model = nn.Sequential(*layers, nn.Flatten(), nn.Linear(c * 4 * 4, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(batch, 3, 64, 64, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
    torch.cuda.synchronize()


def gpt_training(*, batch: int = 8, seq: int = 512, d_model: int = 768, n_layer: int = 6, n_head: int = 12,
                 vocab: int = 32000, steps: int = 3, amp: bool = True, checkpoint: bool = False) -> None:
    """A GPT (SDPA, causal) on random tokens, AdamW, bf16 autocast when ``amp``, optional activation checkpointing."""
    torch.manual_seed(0)
    model = GPT(vocab, seq, d_model, n_layer, n_head, checkpoint).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    idx = torch.randint(0, vocab, (batch, seq), device="cuda")
    target = torch.randint(0, vocab, (batch, seq), device="cuda")
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            logits = model(idx)
            loss = F.cross_entropy(logits.view(-1, vocab), target.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def resnet_inference(*, batch: int = 64, depth: int = 50, image: int = 224, steps: int = 3) -> None:
    """torchvision's ResNet-``depth`` in eval mode under ``torch.inference_mode()``."""
    torch.manual_seed(0)
    model = ResNet(depth).cuda().eval()
    x = torch.randn(batch, 3, image, image, device="cuda")
    with torch.inference_mode():
        for _ in range(steps):
            model(x).argmax(dim=1)
    torch.cuda.synchronize()


def gpt_inference(*, batch: int = 16, seq: int = 1024, d_model: int = 768, n_layer: int = 6, n_head: int = 12,
                  vocab: int = 32000, steps: int = 3) -> None:
    """The GPT in eval mode under ``torch.no_grad()`` and bf16 autocast: full-sequence forward passes."""
    torch.manual_seed(0)
    model = GPT(vocab, seq, d_model, n_layer, n_head).cuda().eval()
    idx = torch.randint(0, vocab, (batch, seq), device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for _ in range(steps):
            model(idx)[:, -1].softmax(dim=-1)
    torch.cuda.synchronize()


#: name → program, for the recorder, the benchmarks and the tests.
# ---- language models (transformers, peft): lesson 13 -------------------------------------------------------


def llama_config(layers: int = 4, vocab: int = 32000) -> object:
    """A LLaMA-style ``transformers.LlamaConfig``: hidden size 768, 12 attention heads of which 4 key/value heads
    (grouped-query attention), SwiGLU width 2048, ``layers`` layers, a ``vocab``-token vocabulary (defaults 4 and
    32000); models built from it get random weights: nothing is downloaded."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=layers, num_attention_heads=12,
                       num_key_value_heads=4, vocab_size=vocab, max_position_embeddings=4096)


def causal_lm_finetune(*, batch: int = 8, seq: int = 512, layers: int = 4, vocab: int = 32000, lora: bool = False,
                       checkpointing: bool = False, steps: int = 2) -> None:
    """Fine-tune a LLaMA-style causal LM (:func:`llama_config`) with AdamW under bf16 autocast, on random token ids
    with an attention mask, logging the loss: in full (every weight trained, fp32 master weights) or with LoRA
    (``peft``, rank 16 on the attention projections, over a frozen bf16 base), with or without gradient
    checkpointing."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = llama_config(layers, vocab)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).cuda()
        if checkpointing:
            model.gradient_checkpointing_enable()
            model.enable_input_require_grads()
        attention = ["q_proj", "k_proj", "v_proj", "o_proj"]
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=attention))
    else:
        model = AutoModelForCausalLM.from_config(config).cuda()
        if checkpointing:
            model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    model.train()
    for step in range(steps):
        ids = torch.randint(0, vocab, (batch, seq), device="cuda")
        mask = torch.ones_like(ids)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step}: loss {loss.item():.3f}")


def causal_lm_generate(*, batch: int = 8, prompt: int = 128, new_tokens: int = 16, layers: int = 4,
                       vocab: int = 32000, cache: str = "dynamic") -> None:
    """Greedy ``generate()`` from the same LLaMA-style model in bf16: ``cache`` "dynamic" (grown token by token)
    or "static" (allocated for prompt + new tokens at the start)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(llama_config(layers, vocab), dtype=torch.bfloat16).cuda().eval()
    ids = torch.randint(1, vocab, (batch, prompt), device="cuda")
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, cache_implementation=cache, pad_token_id=0,
                         disable_compile=True)
    print(f"{out.shape[1] - prompt} tokens for each of {out.shape[0]} prompts")


PROGRAMS = {fn.__name__: fn for fn in (mlp_training, resnet_training, convnet_sgd_training, gpt_training,
                                       resnet_inference, gpt_inference, causal_lm_finetune, causal_lm_generate)}

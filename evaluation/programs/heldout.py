"""Held-out programs: ordinary CUDA PyTorch programs the predictor was never fitted on.

The workspace rules and the emulation of CUDA's decisions were fitted on :mod:`memviz.examples`'
recordings only. These programs are recorded on the H200 by ``evaluation/record_runs.py --parts heldout``
and predicted as they are, to say how the predictor does on code it has not seen: torchvision-style
VGG-11 (BatchNorm, dropout, SGD with Nesterov, gradient clipping) and MobileNetV2 (depthwise and
grouped convolutions, ReLU6); a ViT encoder (patch-embedding convolution, SDPA without a causal mask,
bf16 autocast, gradient clipping); a BERT-style encoder built from ``nn.TransformerEncoderLayer`` (torch's
own multi-head attention with a key-padding mask, gradient accumulation); a LLaMA-style decoder (RMSNorm,
rotary embeddings, SwiGLU, no biases, re-entrant activation checkpointing, fused AdamW); and inference
under ``torch.inference_mode()``, including token-by-token generation that grows a KV cache with
``torch.cat``. Nothing in them knows about memviz; changing one invalidates its recordings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint as _checkpoint

__all__ = [
    "PROGRAMS",
    "bert_training",
    "llama_generate",
    "llama_training",
    "mobilenet_inference",
    "mobilenet_training",
    "vgg_training",
    "vit_inference",
    "vit_training",
]


# ---- CNNs -----------------------------------------------------------------------------------------


def vgg11_bn(num_classes: int = 1000) -> nn.Module:
    """torchvision's ``vgg11_bn``: eight 3×3 convolutions with BatchNorm, five max-pools, a 7×7 adaptive
    average pool and the 25088 → 4096 → 4096 → classes classifier with dropout."""
    layers: list[nn.Module] = []
    c = 3
    for v in (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"):
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(c, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
            c = v
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d((7, 7)), nn.Flatten(),
                         nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(),
                         nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(), nn.Linear(4096, num_classes))


def _conv_bn(c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1, act: bool = True) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(c_out)]
    if act:
        layers.append(nn.ReLU6(inplace=True))
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, expand: int):
        super().__init__()
        hidden = c_in * expand
        self.residual = stride == 1 and c_in == c_out
        layers = [_conv_bn(c_in, hidden, 1)] if expand != 1 else []
        layers += [_conv_bn(hidden, hidden, 3, stride, groups=hidden), _conv_bn(hidden, c_out, 1, act=False)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2 (width 1.0): depthwise 3×3 convolutions between 1×1 expansions."""

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        c = 32
        layers: list[nn.Module] = [_conv_bn(3, c, 3, 2)]
        for t, out, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                             (6, 160, 3, 2), (6, 320, 1, 1)):
            for i in range(n):
                layers.append(InvertedResidual(c, out, s if i == 0 else 1, t))
                c = out
        layers.append(_conv_bn(c, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


# ---- transformers ---------------------------------------------------------------------------------


class ViTBlock(nn.Module):
    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.fc2 = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, t, 3, self.n_head, d // self.n_head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    """A ViT encoder: 16×16 patches by a strided convolution, a class token, pre-norm blocks."""

    def __init__(self, image: int = 224, patch: int = 16, d_model: int = 384, depth: int = 6, n_head: int = 6,
                 num_classes: int = 1000):
        super().__init__()
        self.patch = nn.Conv2d(3, d_model, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d_model))
        self.pos = nn.Parameter(torch.zeros(1, (image // patch) ** 2 + 1, d_model))
        self.blocks = nn.Sequential(*(ViTBlock(d_model, n_head) for _ in range(depth)))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


class Bert(nn.Module):
    """A BERT-style encoder from torch's own ``nn.TransformerEncoderLayer`` (post-norm, GELU, dropout)."""

    def __init__(self, vocab: int = 30522, seq: int = 256, d_model: int = 768, n_layer: int = 6, n_head: int = 12):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        self.norm = nn.LayerNorm(d_model)
        layer = nn.TransformerEncoderLayer(d_model, n_head, 4 * d_model, 0.1, "gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)
        self.mlm = nn.Linear(d_model, vocab)

    def forward(self, idx: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.norm(self.tok(idx) + self.pos(pos))
        return self.mlm(self.encoder(x, src_key_padding_mask=padding))


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, d_model: int, n_head: int, hidden: int):
        super().__init__()
        self.n_head = n_head
        self.attn_norm = RMSNorm(d_model)
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, d_model, bias=False)
        self.wv = nn.Linear(d_model, d_model, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)
        self.mlp_norm = RMSNorm(d_model)
        self.w1 = nn.Linear(d_model, hidden, bias=False)
        self.w3 = nn.Linear(d_model, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: list[torch.Tensor] | None = None) -> torch.Tensor:
        b, t, d = x.shape
        h = self.attn_norm(x)
        q, k, v = (w(h).view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if cache is not None:
            if cache:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
            cache[:] = [k, v]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        x = x + self.wo(y.transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    """A LLaMA-style decoder: RMSNorm, rotary position embeddings, SwiGLU, no biases, untied head."""

    def __init__(self, vocab: int = 32000, d_model: int = 1024, n_layer: int = 8, n_head: int = 16,
                 max_seq: int = 2048, checkpoint: bool = False):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(LlamaBlock(d_model, n_head, 8 * d_model // 3 // 64 * 64) for _ in range(n_layer))
        self.norm = RMSNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.checkpoint = checkpoint
        inv = 1.0 / (10000 ** (torch.arange(0, d_model // n_head, 2).float() / (d_model // n_head)))
        angles = torch.outer(torch.arange(max_seq).float(), inv)
        self.register_buffer("cos", torch.cat([angles.cos()] * 2, dim=-1), persistent=False)
        self.register_buffer("sin", torch.cat([angles.sin()] * 2, dim=-1), persistent=False)

    def forward(self, idx: torch.Tensor, start: int = 0, caches: list | None = None) -> torch.Tensor:
        t = idx.shape[1]
        cos, sin = self.cos[start:start + t], self.sin[start:start + t]
        x = self.tok(idx)
        for i, block in enumerate(self.blocks):
            if caches is not None:
                x = block(x, cos, sin, caches[i])
            elif self.checkpoint and self.training:
                x = _checkpoint(block, x, cos, sin, use_reentrant=True)
            else:
                x = block(x, cos, sin)
        return self.head(self.norm(x))


# ---- programs -------------------------------------------------------------------------------------


def vgg_training(*, batch: int = 32, image: int = 160, steps: int = 3, amp: bool = False) -> None:
    """VGG-11 with BatchNorm on ``image``² inputs, SGD (Nesterov, weight decay), gradient clipping."""
    torch.manual_seed(0)
    model = vgg11_bn().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=5e-4)
    x = torch.randn(batch, 3, image, image, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
    torch.cuda.synchronize()


def mobilenet_training(*, batch: int = 64, image: int = 224, steps: int = 3, amp: bool = False) -> None:
    """MobileNetV2 on ``image``² inputs, label smoothing, AdamW with weight decay."""
    torch.manual_seed(0)
    model = MobileNetV2().to("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    x = torch.randn(batch, 3, image, image, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def mobilenet_inference(*, batch: int = 128, image: int = 224, steps: int = 3) -> None:
    """MobileNetV2 in eval mode under ``torch.inference_mode()``, top-5 of the softmax."""
    torch.manual_seed(0)
    model = MobileNetV2().cuda().eval()
    x = torch.randn(batch, 3, image, image, device="cuda")
    with torch.inference_mode():
        for _ in range(steps):
            model(x).softmax(dim=1).topk(5)
    torch.cuda.synchronize()


def vit_training(*, batch: int = 64, image: int = 224, d_model: int = 384, depth: int = 6, n_head: int = 6,
                 steps: int = 3, amp: bool = True) -> None:
    """A ViT encoder, bf16 autocast when ``amp``, AdamW, gradient clipping."""
    torch.manual_seed(0)
    model = ViT(image, 16, d_model, depth, n_head).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(batch, 3, image, image, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def vit_inference(*, batch: int = 256, image: int = 224, d_model: int = 384, depth: int = 6, n_head: int = 6,
                  steps: int = 3) -> None:
    """The ViT in eval mode under ``torch.inference_mode()`` and bf16 autocast."""
    torch.manual_seed(0)
    model = ViT(image, 16, d_model, depth, n_head).cuda().eval()
    x = torch.randn(batch, 3, image, image, device="cuda")
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        for _ in range(steps):
            model(x).argmax(dim=-1)
    torch.cuda.synchronize()


def bert_training(*, batch: int = 16, seq: int = 256, d_model: int = 768, n_layer: int = 6, n_head: int = 12,
                  steps: int = 2, accumulate: int = 2, amp: bool = True) -> None:
    """A BERT-style masked-LM step with a key-padding mask (the last quarter of each sequence padded),
    bf16 autocast when ``amp``, Adam, ``accumulate`` micro-batches per optimizer step."""
    torch.manual_seed(0)
    model = Bert(30522, seq, d_model, n_layer, n_head).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    idx = torch.randint(0, 30522, (batch, seq), device="cuda")
    labels = torch.randint(0, 30522, (batch, seq), device="cuda")
    padding = torch.zeros(batch, seq, dtype=torch.bool, device="cuda")
    padding[:, seq * 3 // 4:] = True
    for _ in range(steps):
        for _ in range(accumulate):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                logits = model(idx, padding)
                loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1)) / accumulate
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def llama_training(*, batch: int = 4, seq: int = 1024, d_model: int = 1024, n_layer: int = 8, n_head: int = 16,
                   steps: int = 3, checkpoint: bool = True) -> None:
    """The LLaMA-style decoder, bf16 autocast, fused AdamW, re-entrant activation checkpointing per block."""
    torch.manual_seed(0)
    model = Llama(32000, d_model, n_layer, n_head, max(2048, seq), checkpoint).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    idx = torch.randint(0, 32000, (batch, seq), device="cuda")
    target = torch.randint(0, 32000, (batch, seq), device="cuda")
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(idx)
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), target.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def llama_generate(*, batch: int = 8, prompt: int = 512, new_tokens: int = 32, d_model: int = 1024,
                   n_layer: int = 8, n_head: int = 16) -> None:
    """Greedy generation with the LLaMA-style decoder in bf16 under ``torch.inference_mode()``: one forward
    pass over the prompt, then one token at a time, the KV cache grown by ``torch.cat`` every step."""
    torch.manual_seed(0)
    model = Llama(32000, d_model, n_layer, n_head, prompt + new_tokens).cuda().eval().to(torch.bfloat16)
    idx = torch.randint(0, 32000, (batch, prompt), device="cuda")
    with torch.inference_mode():
        caches: list[list[torch.Tensor]] = [[] for _ in model.blocks]
        logits = model(idx, 0, caches)
        tokens = [logits[:, -1].argmax(dim=-1, keepdim=True)]
        for i in range(new_tokens - 1):
            logits = model(tokens[-1], prompt + i, caches)
            tokens.append(logits[:, -1].argmax(dim=-1, keepdim=True))
        torch.cat(tokens, dim=1)
    torch.cuda.synchronize()


#: name → program, for the recorder and the comparison.
PROGRAMS = {fn.__name__: fn for fn in (vgg_training, mobilenet_training, mobilenet_inference, vit_training,
                                       vit_inference, bert_training, llama_training, llama_generate)}

"""A zoo of ordinary PyTorch CUDA programs run through ``memviz.predict``: does each predict, and are the
numbers sane?

Each program is what a user writes for a GPU (training steps or inference), small enough to predict in a few
seconds on a 2-core CPU. For each one the script prints: outcome (works / crash / refused), trace seconds,
peak allocated and reserved, and a floor computed independently of the prediction (the bytes of the
parameters, their gradients and the optimizer state the program makes, from the model's own parameter
count); a peak allocated below its floor is flagged ``SUSPICIOUS``.

    python benchmarks/predict_zoo.py                 # every program (torchvision ones if it imports)
    python benchmarks/predict_zoo.py resnet50 lstm   # names containing these words

torchvision's models need torchvision (any build: only its Python models are used).
"""

from __future__ import annotations

import sys
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import memviz

try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torchvision
except Exception:  # any failure to import means: no torchvision programs
    torchvision = None

ZOO: list[tuple[str, Callable[..., Any], dict[str, Any], int]] = []
"""(name, program, its keyword arguments, floor in bytes)."""


def _nbytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _floor(model_fn: Callable[[], nn.Module], copies: float) -> int:
    """``copies`` × the fp32 parameter bytes of the model ``model_fn`` builds (on meta: no memory)."""
    try:
        with torch.device("meta"):
            return int(_nbytes(model_fn()) * copies)
    except NotImplementedError:  # the builder computes on tensors (regnet's widths): build it on the host
        return int(_nbytes(model_fn()) * copies)


def add(name: str, fn: Callable[..., Any], floor: int = 0, **kwargs: Any) -> None:
    ZOO.append((name, fn, kwargs, floor))


# ---- generic training / inference loops ---------------------------------------------------------------


def train_classifier(make: Callable[[], nn.Module], batch: int, size: int = 64, classes: int = 10, steps: int = 2,
                     opt: str = "adamw", amp: str | None = None, channels_last: bool = False,
                     **opt_kwargs: Any) -> None:
    model = make().cuda()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD,
                 "rmsprop": torch.optim.RMSprop}[opt](model.parameters(), lr=1e-3, **opt_kwargs)
    scaler = torch.amp.GradScaler("cuda", enabled=amp == "fp16")
    dtype = torch.float16 if amp == "fp16" else torch.bfloat16
    for _ in range(steps):
        x = torch.randn(batch, 3, size, size, device="cuda")
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        y = torch.randint(0, classes, (batch,), device="cuda")
        with torch.autocast("cuda", dtype=dtype, enabled=amp is not None):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)


def infer_classifier(make: Callable[[], nn.Module], batch: int, size: int = 64, mode: str = "no_grad",
                     amp: bool = False) -> None:
    model = make().cuda().eval()
    ctx = torch.inference_mode if mode == "inference_mode" else torch.no_grad
    with ctx(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
        for _ in range(2):
            model(torch.randn(batch, 3, size, size, device="cuda"))


# ---- torchvision ----------------------------------------------------------------------------------------

if torchvision is not None:
    tvm = torchvision.models
    for _name, _make, _size in (("resnet50", lambda: tvm.resnet50(num_classes=10), 64),
                                ("efficientnet_b0", lambda: tvm.efficientnet_b0(num_classes=10), 64),
                                ("mobilenet_v3_small", lambda: tvm.mobilenet_v3_small(num_classes=10), 64),
                                ("convnext_tiny", lambda: tvm.convnext_tiny(num_classes=10), 64),
                                ("vit_b_16", lambda: tvm.vit_b_16(num_classes=10, image_size=64), 64),
                                ("swin_t", lambda: tvm.swin_t(num_classes=10), 64),
                                ("densenet121", lambda: tvm.densenet121(num_classes=10), 64),
                                ("regnet_y_400mf", lambda: tvm.regnet_y_400mf(num_classes=10), 64)):
        add(f"tv {_name} train adamw", train_classifier, _floor(_make, 4), make=_make, batch=8, size=_size, steps=2)
    add("tv resnet50 bf16 channels_last", train_classifier, _floor(lambda: tvm.resnet50(num_classes=10), 4),
        make=lambda: tvm.resnet50(num_classes=10), batch=8, amp="bf16", channels_last=True)
    add("tv convnext_tiny fp16 GradScaler", train_classifier, _floor(lambda: tvm.convnext_tiny(num_classes=10), 4),
        make=lambda: tvm.convnext_tiny(num_classes=10), batch=8, amp="fp16")
    add("tv vit_b_16 bf16 inference_mode", infer_classifier, _floor(lambda: tvm.vit_b_16(image_size=64), 1),
        make=lambda: tvm.vit_b_16(image_size=64), batch=8, mode="inference_mode", amp=True)
    add("tv swin_t no_grad", infer_classifier, _floor(tvm.swin_t, 1), make=tvm.swin_t, batch=4)
    add("tv densenet121 memory_efficient sgd", train_classifier,
        _floor(lambda: tvm.densenet121(num_classes=10), 3),
        make=lambda: tvm.densenet121(num_classes=10, memory_efficient=True), batch=8, opt="sgd", momentum=0.9)
    add("tv efficientnet_b0 fused adam", train_classifier, _floor(lambda: tvm.efficientnet_b0(num_classes=10), 4),
        make=lambda: tvm.efficientnet_b0(num_classes=10), batch=8, opt="adam", fused=True)


# ---- plain torch models ---------------------------------------------------------------------------------


class UNet(nn.Module):
    def __init__(self, c: int = 16) -> None:
        super().__init__()

        def block(i: int, o: int) -> nn.Module:
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(inplace=True),
                                 nn.Conv2d(o, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(inplace=True))

        self.d1, self.d2, self.d3 = block(3, c), block(c, 2 * c), block(2 * c, 4 * c)
        self.up2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2)
        self.u2 = block(4 * c, 2 * c)
        self.u1 = block(3 * c, c)
        self.head = nn.Conv2d(c, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.d1(x)
        x2 = self.d2(F.max_pool2d(x1, 2))
        x3 = self.d3(F.max_pool2d(x2, 2))
        y = self.u2(torch.cat([self.up2(x3), x2], 1))
        y = F.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False)
        return self.head(self.u1(torch.cat([y, x1], 1)))


def unet_training(batch: int, size: int = 64) -> None:
    model = UNet().cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(2):
        x = torch.randn(batch, 3, size, size, device="cuda")
        target = torch.randint(0, 2, (batch, size, size), device="cuda")
        loss = F.cross_entropy(model(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()


add("unet convtranspose interpolate adam", unet_training, _floor(UNet, 4), batch=4)


class RNNLM(nn.Module):
    def __init__(self, kind: str = "lstm", vocab: int = 1000, dim: int = 128, layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(dim, dim, layers, batch_first=True, dropout=0.1)
        self.out = nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.rnn(self.emb(x))[0])


def rnn_lm_training(batch: int, kind: str = "lstm", seq: int = 32) -> None:
    model = RNNLM(kind).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        x = torch.randint(0, 1000, (batch, seq), device="cuda")
        loss = F.cross_entropy(model(x).flatten(0, 1), x.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad()


add("lstm lm clip_grad_norm", rnn_lm_training, _floor(RNNLM, 2), batch=8)
add("gru lm clip_grad_norm", rnn_lm_training, _floor(lambda: RNNLM("gru"), 2), batch=8, kind="gru")


class BagModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(5000, 64, mode="mean")
        self.emb = nn.Embedding(5000, 64, padding_idx=0)
        self.fc = nn.Linear(128, 2)

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([self.bag(ids, offsets), self.emb(seq).mean(1)], 1))


def embedding_training(batch: int) -> None:
    model = BagModel().cuda()
    opt = torch.optim.Adagrad(model.parameters(), lr=0.01)
    for _ in range(2):
        ids = torch.randint(0, 5000, (batch * 10,), device="cuda")
        offsets = torch.arange(0, batch * 10, 10, device="cuda")
        seq = torch.randint(0, 5000, (batch, 12), device="cuda")
        loss = F.cross_entropy(model(ids, offsets, seq), torch.randint(0, 2, (batch,), device="cuda"))
        loss.backward()
        opt.step()
        opt.zero_grad()


add("embedding embeddingbag adagrad", embedding_training, _floor(BagModel, 3), batch=16)


def norms_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.SiLU(),
                         nn.Conv2d(32, 32, 3, padding=1), nn.InstanceNorm2d(32, affine=True), nn.GELU(),
                         nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.LayerNorm([64, 32, 32]), nn.Mish(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(64, 10))


add("groupnorm instancenorm rmsprop", train_classifier, _floor(norms_net, 4), make=norms_net, batch=8, opt="rmsprop")
add("groupnorm instancenorm sgd foreach=False", train_classifier, _floor(norms_net, 3), make=norms_net, batch=8,
    opt="sgd", momentum=0.9, foreach=False)


class MHAModel(nn.Module):
    def __init__(self, dim: int = 128, heads: int = 4) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True, dropout=0.1)
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = torch.zeros(x.shape[0], x.shape[1], dtype=torch.bool, device=x.device)
        a, _ = self.attn(x, x, x, key_padding_mask=pad)
        return self.fc(self.norm(x + a).mean(1))


def mha_training(batch: int, seq: int = 64) -> None:
    model = MHAModel().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=10)
    for _ in range(2):
        x = torch.randn(batch, seq, 128, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), torch.randint(0, 10, (batch,), device="cuda"))
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()


add("multiheadattention bf16 fused adamw onecycle", mha_training, _floor(MHAModel, 4), batch=8)


def seq2seq() -> nn.Module:
    return nn.Transformer(d_model=128, nhead=4, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=256,
                          batch_first=True)


def transformer_training(batch: int, seq: int = 32) -> None:
    model = seq2seq().cuda()
    emb = nn.Embedding(1000, 128).cuda()
    head = nn.Linear(128, 1000).cuda()
    params = [*model.parameters(), *emb.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=1e-4, foreach=True)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    mask = nn.Transformer.generate_square_subsequent_mask(seq, device="cuda")
    for _ in range(2):
        src = torch.randint(0, 1000, (batch, seq), device="cuda")
        tgt = torch.randint(0, 1000, (batch, seq), device="cuda")
        out = model(emb(src), emb(tgt), tgt_mask=mask, tgt_is_causal=True)
        loss = F.cross_entropy(head(out).flatten(0, 1), tgt.flatten())
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad():
        model(emb(src), emb(tgt), tgt_mask=mask)


add("nn.Transformer enc-dec adam foreach cosine", transformer_training,
    _floor(seq2seq, 4) + 2 * 1000 * 128 * 4 * 4, batch=8)


class GPT(nn.Module):
    def __init__(self, vocab: int = 1000, dim: int = 128, layers: int = 2, heads: int = 4, ckpt: str = "") -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, 256, dim))
        self.blocks = nn.ModuleList(nn.ModuleDict({"ln1": nn.LayerNorm(dim), "qkv": nn.Linear(dim, 3 * dim),
                                                   "proj": nn.Linear(dim, dim), "ln2": nn.LayerNorm(dim),
                                                   "mlp": nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(),
                                                                        nn.Linear(4 * dim, dim))})
                                    for _ in range(layers))
        self.heads = heads
        self.ckpt = ckpt
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def block(self, b: nn.ModuleDict, x: torch.Tensor) -> torch.Tensor:
        n, t, c = x.shape
        q, k, v = b["qkv"](b["ln1"](x)).split(c, 2)
        q, k, v = (z.view(n, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1 if self.training else 0.0)
        x = x + b["proj"](a.transpose(1, 2).reshape(n, t, c))
        return x + b["mlp"](b["ln2"](x))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx) + self.pos[:, :idx.shape[1]]
        for b in self.blocks:
            x = checkpoint(self.block, b, x, use_reentrant=self.ckpt == "reentrant") if self.ckpt else self.block(b, x)
        return self.head(x)


def gpt_training(batch: int, seq: int = 128, ckpt: str = "", accumulate: int = 1, amp: str = "bf16") -> None:
    model = GPT(ckpt=ckpt).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    scaler = torch.amp.GradScaler(enabled=amp == "fp16")
    dtype = torch.float16 if amp == "fp16" else torch.bfloat16
    torch.backends.cudnn.benchmark = True
    for step in range(2):
        for _ in range(accumulate):
            x = torch.randint(0, 1000, (batch, seq), device="cuda")
            with torch.autocast("cuda", dtype=dtype):
                logits = model(x)
                loss = F.cross_entropy(logits.flatten(0, 1), x.flatten()) / accumulate
            scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        if step == 0:
            model.eval()
            with torch.no_grad():
                model(torch.randint(0, 1000, (batch, seq), device="cuda"))
            model.train()


add("gpt sdpa causal bf16 clip", gpt_training, _floor(GPT, 4), batch=8)
add("gpt fp16 GradScaler unscale_ clip accumulate", gpt_training, _floor(GPT, 4), batch=8, amp="fp16", accumulate=2)
add("gpt checkpoint use_reentrant=False", gpt_training, _floor(GPT, 4), batch=8, ckpt="nonreentrant")
add("gpt checkpoint use_reentrant=True", gpt_training, _floor(GPT, 4), batch=8, ckpt="reentrant")


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def optimizer_zoo(batch: int) -> None:
    for make in (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
                 lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, fused=True),
                 lambda p: torch.optim.Adam(p, lr=1e-3, foreach=False),
                 lambda p: torch.optim.Adam(p, lr=1e-3, fused=True, amsgrad=True),
                 lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True),
                 lambda p: torch.optim.RMSprop(p, lr=1e-3, momentum=0.9, centered=True),
                 lambda p: torch.optim.Adagrad(p, lr=1e-2),
                 lambda p: torch.optim.Adamax(p), lambda p: torch.optim.NAdam(p), lambda p: torch.optim.RAdam(p),
                 lambda p: torch.optim.Adadelta(p)):
        model = mlp().cuda()
        opt = make(model.parameters())
        sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
        for _ in range(2):
            loss = F.cross_entropy(model(torch.randn(batch, 512, device="cuda")),
                                   torch.randint(0, 10, (batch,), device="cuda"))
            loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad()
        del model, opt, sched


add("optimizers sgd/adam/adamw/rmsprop/... foreach fused", optimizer_zoo, _floor(mlp, 5), batch=32)


def pinned_queries(batch: int) -> None:
    model = mlp().cuda()
    opt = torch.optim.Adam(model.parameters())
    host = torch.randn(batch, 512).pin_memory()
    labels = torch.randint(0, 10, (batch,)).pin_memory()
    seen = []
    for _ in range(2):
        x = host.to("cuda", non_blocking=True)
        y = labels.cuda(non_blocking=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        seen.append((torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(), torch.cuda.memory_reserved()))
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    params = _nbytes(model)
    assert seen[-1][0] >= 3 * params, (seen, params)  # params + Adam's two moments
    assert seen[-1][1] >= seen[-1][0] and seen[-1][2] >= seen[-1][0]
    print(f"    memory_allocated inside: {seen}")


add("pinned non_blocking memory queries empty_cache", pinned_queries, _floor(mlp, 3), batch=32)


def compiled_training(batch: int) -> None:
    model = torch.compile(mlp().cuda())
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        loss = F.cross_entropy(model(torch.randn(batch, 512, device="cuda")),
                               torch.randint(0, 10, (batch,), device="cuda"))
        loss.backward()
        opt.step()
        opt.zero_grad()


add("torch.compile(model)", compiled_training, _floor(mlp, 4), batch=32)


def eval_in_loop(batch: int) -> None:
    model = nn.Sequential(nn.Conv2d(3, 32, 3), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(32, 10)).to("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, [1])
    for _ in range(2):
        model.train()
        x = torch.randn(batch, 3, 32, 32).cuda()
        loss = F.cross_entropy(model(x), torch.randint(0, 10, (batch,)).cuda())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        model.eval()
        with torch.no_grad():
            correct = (model(x).argmax(1) == 0).sum()
            del correct
        with torch.inference_mode():
            model(x).softmax(-1)


add("eval in training loop (no_grad, inference_mode)", eval_in_loop, 0, batch=16)


# ---- round 2: the idioms around the model --------------------------------------------------------------


class VAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 64))
        self.dec = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 784))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mu, log_sigma = self.enc(x).chunk(2, -1)
        q = torch.distributions.Normal(mu, log_sigma.exp())
        z = q.rsample()
        prior = torch.distributions.Normal(torch.zeros_like(mu), torch.ones_like(mu))
        kl = torch.distributions.kl_divergence(q, prior).sum(-1)
        return self.dec(z), kl


def vae_training(batch: int) -> None:
    model = VAE().cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(2):
        x = torch.rand(batch, 784, device="cuda")
        recon, kl = model(x)
        loss = (F.binary_cross_entropy_with_logits(recon, x, reduction="none").sum(-1) + kl).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


add("vae torch.distributions Normal kl", vae_training, _floor(VAE, 4), batch=32)


def packed_lstm(batch: int) -> None:
    emb = nn.Embedding(100, 32).cuda()
    lstm = nn.LSTM(32, 64, batch_first=True, bidirectional=True).cuda()
    opt = torch.optim.Adam([*emb.parameters(), *lstm.parameters()])
    lengths = torch.randint(1, 20, (batch,))
    x = torch.randint(0, 100, (batch, 20), device="cuda")
    packed = nn.utils.rnn.pack_padded_sequence(emb(x), lengths, batch_first=True, enforce_sorted=False)
    out, _ = lstm(packed)
    padded, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
    padded.sum().backward()
    opt.step()


add("pack_padded_sequence bidirectional lstm", packed_lstm, 0, batch=8)


def ema_fused_scaler(batch: int) -> None:
    model = mlp().cuda()
    ema = torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.999))
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    scaler = torch.cuda.amp.GradScaler()
    for _ in range(2):
        with torch.cuda.amp.autocast():
            loss = F.cross_entropy(model(torch.randn(batch, 512, device="cuda")),
                                   torch.randint(0, 10, (batch,), device="cuda"))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scale = scaler.get_scale()
        scaler.update()
        skipped = scaler.get_scale() < scale
        del skipped
        opt.zero_grad()
        ema.update_parameters(model)
    state = scaler.state_dict()
    del state


add("EMA AveragedModel fused adamw cuda.amp GradScaler get_scale", ema_fused_scaler, _floor(mlp, 5), batch=32)


def misc_idioms(batch: int) -> None:
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Dropout2d(0.1), nn.Flatten(),
                          nn.Linear(16 * 16 * 16, 10))
    model = nn.utils.parametrizations.weight_norm(model[0]) and model
    model.to(device)
    dp = nn.DataParallel(model)
    opt = torch.optim.SGD(dp.parameters(), lr=0.1)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    import numpy as np
    x = torch.from_numpy(np.zeros((batch, 3, 16, 16), dtype=np.float32)).to(device, non_blocking=True)
    y = torch.as_tensor(np.zeros(batch, dtype=np.int64), device=device)
    start.record()
    logits = dp(x)
    onehot = F.one_hot(y, num_classes=10).float()
    loss = -(onehot * logits.log_softmax(-1)).sum(-1).mean()
    loss.backward(retain_graph=True)
    (logits.pow(2).mean()).backward()
    opt.step()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end)
    perm = torch.randperm(batch, device=device)
    top = logits[perm].topk(3, dim=-1).indices
    masked = logits.masked_fill(logits < 0, float("-inf")).softmax(-1).gather(1, top)
    del ms, masked
    print(f"    {torch.cuda.get_device_name()}: {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB, "
          f"max allocated {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB")


add("misc: tf32, DataParallel, weight_norm, numpy in, events, retain_graph", misc_idioms, 0, batch=8)


def gradient_penalty(batch: int) -> None:
    critic = nn.Sequential(nn.Linear(64, 256), nn.LeakyReLU(0.2), nn.Linear(256, 1)).cuda()
    opt = torch.optim.Adam(critic.parameters(), lr=1e-4, betas=(0.5, 0.9))
    real = torch.randn(batch, 64, device="cuda")
    fake = torch.randn(batch, 64, device="cuda")
    eps = torch.rand(batch, 1, device="cuda")
    mix = (eps * real + (1 - eps) * fake).requires_grad_(True)
    grad, = torch.autograd.grad(critic(mix).sum(), mix, create_graph=True)
    penalty = ((grad.norm(2, dim=1) - 1) ** 2).mean()
    loss = critic(fake).mean() - critic(real).mean() + 10 * penalty
    opt.zero_grad()
    loss.backward()
    opt.step()


add("wgan-gp autograd.grad create_graph", gradient_penalty, 0, batch=32)


def pure_half_inference(batch: int) -> None:
    model = nn.Sequential(nn.Conv2d(3, 32, 3), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(32, 10)).half().cuda().eval()
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(batch, 3, 64, 64, device="cuda", dtype=torch.half)).float().softmax(-1).argmax(-1)


add("model.half() inference", pure_half_inference, 0, batch=16)


def bf16_model_sdpa_math(batch: int) -> None:
    model = GPT().to(device="cuda", dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):
        x = torch.randint(0, 1000, (batch, 64), device="cuda")
        F.cross_entropy(model(x).float().flatten(0, 1), x.flatten()).backward()
    opt.step()


add("pure bf16 model, sdpa_kernel(MATH)", bf16_model_sdpa_math, _floor(GPT, 2), batch=8)


def checkpoint_sequential_training(batch: int) -> None:
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.GELU()) for _ in range(8)]).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(batch, 256, device="cuda", requires_grad=True)
    out = torch.utils.checkpoint.checkpoint_sequential(model, 4, x, use_reentrant=False)
    out.sum().backward()
    opt.step()


add("checkpoint_sequential", checkpoint_sequential_training, 0, batch=64)


def save_checkpoint(batch: int) -> None:
    import io
    model = mlp().cuda()
    opt = torch.optim.Adam(model.parameters())
    F.cross_entropy(model(torch.randn(batch, 512, device="cuda")), torch.randint(0, 10, (batch,), device="cuda")
                    ).backward()
    opt.step()
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)


add("torch.save(state_dict) to a buffer", save_checkpoint, _floor(mlp, 4), batch=32)


# ---- runner ---------------------------------------------------------------------------------------------


def run(name: str, fn: Callable[..., Any], kwargs: dict[str, Any], floor: int, device: str = "H200") -> str:
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            p = memviz.predict(fn, device=device, **kwargs)
    except memviz.DataDependentError as e:
        return f"REFUSED   {time.perf_counter() - start:5.1f}s  {e}"
    except Exception as e:  # a crash is an outcome to report
        tb = traceback.format_exception(e)
        return f"CRASH     {time.perf_counter() - start:5.1f}s  {type(e).__name__}: {e}\n" + "".join(tb[-6:])
    peak = p.peak_allocated_bytes
    verdict = "works" if peak >= floor else "SUSPICIOUS"
    notes = f"  notes: {'; '.join(p.notes)}" if p.notes else ""
    return (f"{verdict:10}{p.trace_seconds:5.1f}s  alloc {peak / 2**20:8.1f} MiB  reserved "
            f"{p.peak_reserved_bytes / 2**20:8.1f} MiB  floor {floor / 2**20:7.1f} MiB  events {len(p.events)}"
            f"  fits={p.fits}{notes}")


def main(argv: list[str]) -> None:
    print(f"torch {torch.__version__}, torchvision {getattr(torchvision, '__version__', None)}, memviz zoo")
    for name, fn, kwargs, floor in ZOO:
        if argv and not any(a in name for a in argv):
            continue
        print(f"{name:55} {run(name, fn, kwargs, floor)}", flush=True)
    if not argv or "max_batch" in argv:
        start = time.perf_counter()
        best = memviz.max_batch(lambda b: gpt_training(b, seq=64), device="H200", cap="1 GiB", hi=4096)
        print(f"{'max_batch gpt bf16 under 1 GiB':55} {best} in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main(sys.argv[1:])

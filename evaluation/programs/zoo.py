"""Small ordinary programs that exercise one PyTorch behaviour each (tests/test_predict_zoo.py predicts them and
compares with their H200 recordings): a GRU, nn.Transformer's causal-mask detection, tensors made on another
tensor's device and DataParallel, deepcopy/save/load, a VAE's distributions, SiLU's backward, LayerNorm on a
transposed input, channels-last convolutions. Nothing in them knows about memviz; changing one invalidates its
recordings. Record: ``python3 evaluation/record_programs.py --module evaluation.programs.zoo --out DIR``.
"""

from __future__ import annotations

import copy
import io

import torch
from torch import nn

__all__ = ["PROGRAMS", "RUNS"]


def gru_training(batch: int = 4, device: str = "cuda") -> None:
    gru = nn.GRU(16, 32, 2, batch_first=True).to(device)
    opt = torch.optim.SGD(gru.parameters(), lr=0.1, momentum=0.9)
    gru(torch.randn(batch, 5, 16, device=device))[0].sum().backward()
    opt.step()


def transformer_masks(where: str = "device", batch: int = 2, device: str = "cuda") -> None:
    model = nn.Transformer(64, 4, 1, 1, 128, batch_first=True).to(device)
    src = torch.randn(batch, 16, 64, device=device)
    if where == "device":
        mask = nn.Transformer.generate_square_subsequent_mask(16, device=device)
    elif where == "host":
        mask = nn.Transformer.generate_square_subsequent_mask(16).to(device)
    elif where == "zeros":
        mask = torch.zeros(16, 16, device=device)
    else:
        mask = nn.Linear(16, 16).to(device).weight * 0
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(src, src, tgt_mask=mask)
    out.float().sum().backward()


def device_of_tensors(batch: int = 8, device: str = "cuda") -> None:
    model = nn.DataParallel(nn.Linear(1024, 1024, bias=False).to(device))
    dev = next(model.parameters()).device
    pos = torch.zeros(1 << 20, device=dev) + 1
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        model(torch.randn(batch, 1024, device=dev)).float().sum().backward()
    del pos


def deepcopy_save_load(batch: int = 1, device: str = "cuda") -> None:
    lin = nn.Linear(1024, 1024, bias=False).to(device)
    ema = copy.deepcopy(lin)
    buf = io.BytesIO()
    torch.save({"model": lin.state_dict()}, buf)
    buf.seek(0)
    ema.load_state_dict(torch.load(buf)["model"])


def vae_step(batch: int = 16, log: bool = True, device: str = "cuda") -> None:
    enc = nn.Linear(64, 32).to(device)
    mu, log_sigma = enc(torch.randn(batch, 64, device=device)).chunk(2, -1)
    q = torch.distributions.Normal(mu, log_sigma.exp())
    z = q.rsample()
    loss = torch.distributions.kl_divergence(q, torch.distributions.Normal(0.0, 1.0)).sum() + z.sum()
    loss = loss - q.log_prob(z).sum()
    loss.backward()
    if log:
        print(f"loss {loss.item():.3f}")


def silu_backward(batch: int = 64, device: str = "cuda") -> None:
    x = torch.randn(batch, 1 << 14, device=device, requires_grad=True)
    torch.nn.functional.silu(x).sum().backward()


def layer_norm_transposed(batch: int = 512, transposed: bool = True, device: str = "cuda") -> None:
    ln = nn.LayerNorm(256).to(device)
    x = torch.randn(batch, 64, 256, device=device)
    ln(x.transpose(0, 1) if transposed else x)


def conv_channels_last(batch: int = 8, depthwise: bool = False, amp: bool = False, device: str = "cuda") -> None:
    conv = nn.Conv2d(64, 64, 7 if depthwise else 3, padding="same", groups=64 if depthwise else 1).to(device)
    x = torch.randn(batch, 64, 32, 32, device=device).to(memory_format=torch.channels_last).requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
        y = conv(x)
    y.float().sum().backward()


PROGRAMS = {f.__name__: f for f in (gru_training, transformer_masks, device_of_tensors, deepcopy_save_load, vae_step,
                                    silu_backward, layer_norm_transposed, conv_channels_last)}

RUNS: list[dict] = [
    {"id": "zoo-gru", "program": "gru_training", "kwargs": {}, "alloc_conf": "", "cap_gib": 4},
    *({"id": f"zoo-transformer-{w}", "program": "transformer_masks", "kwargs": {"where": w}, "alloc_conf": "",
       "cap_gib": 4} for w in ("device", "host", "zeros", "unknown")),
    {"id": "zoo-device-of", "program": "device_of_tensors", "kwargs": {}, "alloc_conf": "", "cap_gib": 4},
    {"id": "zoo-deepcopy", "program": "deepcopy_save_load", "kwargs": {}, "alloc_conf": "", "cap_gib": 4},
    {"id": "zoo-vae", "program": "vae_step", "kwargs": {}, "alloc_conf": "", "cap_gib": 4},
    {"id": "zoo-silu", "program": "silu_backward", "kwargs": {}, "alloc_conf": "", "cap_gib": 4},
    {"id": "zoo-ln-transposed", "program": "layer_norm_transposed", "kwargs": {}, "alloc_conf": "", "cap_gib": 4},
    {"id": "zoo-ln-contiguous", "program": "layer_norm_transposed", "kwargs": {"transposed": False}, "alloc_conf": "",
     "cap_gib": 4},
    {"id": "zoo-conv-cl", "program": "conv_channels_last", "kwargs": {}, "alloc_conf": "", "cap_gib": 4},
    {"id": "zoo-conv-cl-dw-amp", "program": "conv_channels_last", "kwargs": {"depthwise": True, "amp": True},
     "alloc_conf": "", "cap_gib": 4},
]
CHAINS: list[dict] = []
CPU_CHECK: dict = {"device": "cpu"}

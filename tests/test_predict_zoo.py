"""Ordinary PyTorch programs through memviz.predict (real torch, no mocks): each predicts, and its numbers hold
at least what the program provably keeps (parameters, gradients, optimizer state), computed from the model.

The programs are small (a few MiB of weights) so that the file runs in a few seconds; the larger zoo, with
torchvision's models, is ``benchmarks/predict_zoo.py``.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import memviz


def _param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_gru_batch_first_backward_transposes_its_gradient_in_place() -> None:
    """GRU's backward runs ``transpose_`` on a gradient: an in-place op that changes the shape (no shortcut)."""
    def prog() -> None:
        gru = nn.GRU(16, 32, 2, batch_first=True).cuda()
        opt = torch.optim.SGD(gru.parameters(), lr=0.1, momentum=0.9)
        gru(torch.randn(4, 5, 16, device="cuda"))[0].sum().backward()
        opt.step()

    p = memviz.predict(prog, device="H200")
    weights = _param_bytes(nn.GRU(16, 32, 2))
    assert p.fits and p.peak_allocated_bytes >= 3 * weights  # weights, gradients, momentum
    assert p.breakdown()["optimizer state"] == weights


def test_transformer_detects_a_causal_mask_as_torch_does() -> None:
    """``nn.Transformer`` with ``tgt_mask`` and no ``tgt_is_causal`` compares the mask with a causal one: answered
    from the mask's known values (torch's generator, or a host mask moved over), not refused."""
    def prog(where: str) -> None:
        model = nn.Transformer(64, 4, 1, 1, 128, batch_first=True).cuda()
        src = torch.randn(2, 16, 64, device="cuda")
        if where == "device":
            mask = nn.Transformer.generate_square_subsequent_mask(16, device="cuda")
        elif where == "host":
            mask = nn.Transformer.generate_square_subsequent_mask(16).to("cuda")
        else:
            mask = torch.zeros(16, 16, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(src, src, tgt_mask=mask)
        out.float().sum().backward()

    ops = {}
    for where in ("device", "host", "unknown"):
        p = memviz.predict(prog, where, device="H200")
        ops[where] = sum("flash" in e.op for e in p.events if e.action == "alloc" and e.phase == "forward")
        assert p.fits and p.peak_allocated_bytes >= 2 * _param_bytes(nn.Transformer(64, 4, 1, 1, 128))
        assert any("not causal" in n for n in p.notes) == (where == "unknown")
    # causal: the decoder's self-attention drops the mask and runs flash attention (bf16, no mask);
    # a mask of unknown values is used as given (memory-efficient attention with a bias)
    assert ops["device"] == ops["host"] > ops["unknown"]

"""Ordinary PyTorch programs through memviz.predict (real torch, no mocks): the behaviour each exercises (a GRU's
in-place transpose, nn.Transformer's causal-mask detection, tensors made on another tensor's device, deepcopy,
distributions, SiLU's kernel, LayerNorm's copies, channels-last convolutions). Their peaks against the H200's
recordings of the same programs: tests/test_predict_zoo_recorded.py.

The programs are small (a few MiB of weights) so that the file runs in a few seconds; the larger zoo, with
torchvision's models, is ``benchmarks/predict_zoo.py``.
"""

from __future__ import annotations

import torch
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
    assert p.fits and p.breakdown()["optimizer state"] == _param_bytes(nn.GRU(16, 32, 2))  # the momentum


def test_transformer_detects_a_causal_mask_as_torch_does() -> None:
    """``nn.Transformer`` with ``tgt_mask`` and no ``tgt_is_causal`` compares the mask with a causal one, from the
    mask's values: torch's generator's, a host mask moved over, zeros made on the device — all known; a mask
    computed from a parameter is not, and reads as zeros (not causal), said in the notes."""
    def prog(where: str) -> None:
        model = nn.Transformer(64, 4, 1, 1, 128, batch_first=True).cuda()
        src = torch.randn(2, 16, 64, device="cuda")
        if where == "device":
            mask = nn.Transformer.generate_square_subsequent_mask(16, device="cuda")
        elif where == "host":
            mask = nn.Transformer.generate_square_subsequent_mask(16).to("cuda")
        elif where == "zeros":
            mask = torch.zeros(16, 16, device="cuda")
        else:
            mask = nn.Linear(16, 16).cuda().weight * 0
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(src, src, tgt_mask=mask)
        out.float().sum().backward()

    ops = {}
    for where in ("device", "host", "zeros", "unknown"):
        p = memviz.predict(prog, where, device="H200")
        ops[where] = sum("flash" in e.op for e in p.events if e.action == "alloc" and e.phase == "forward")
        assert p.fits
        assert any("read as zeros" in n for n in p.notes) == (where == "unknown")
    # causal: the decoder's self-attention drops the mask and runs flash attention (bf16, no mask);
    # a mask that is not causal is used as given (memory-efficient attention with a bias)
    assert ops["device"] == ops["host"] > ops["zeros"] == ops["unknown"]


def test_tensors_made_on_another_tensors_device_are_device_memory() -> None:
    """``device=x.device`` / ``next(model.parameters()).device`` (nanoGPT's positions, HF's masks) is the GPU:
    those tensors count, ``is_cuda`` is true, and DataParallel on the one GPU runs its module."""
    def prog() -> None:
        model = nn.DataParallel(nn.Linear(1024, 1024, bias=False).cuda())
        device = next(model.parameters()).device
        assert device == torch.device("cuda", 0) and next(model.parameters()).is_cuda
        pos = torch.zeros(1 << 20, device=device) + 1  # 4 MiB of zeros, their 4 MiB sum; the zeros go
        assert torch.cuda.memory_allocated() == 2 * 4 * 2**20  # the weight and pos
        with torch.autocast(device.type, dtype=torch.bfloat16):
            model(torch.randn(8, 1024, device=device)).float().sum().backward()
        del pos

    p = memviz.predict(prog, device="H200")
    assert p.fits and p.breakdown()["gradients"] == 1024 * 1024 * 4


def test_deepcopy_save_and_load_of_device_tensors() -> None:
    """``copy.deepcopy(model)`` (an EMA) copies on the device; ``torch.save`` writes no values, ``torch.load``
    reads them back as host tensors that ``load_state_dict`` copies in place."""
    import copy
    import io

    def prog() -> None:
        lin = nn.Linear(1024, 1024, bias=False).cuda()
        ema = copy.deepcopy(lin)
        assert torch.cuda.memory_allocated() == 2 * 1024 * 1024 * 4 and ema.weight.is_cuda
        buf = io.BytesIO()
        torch.save({"model": lin.state_dict()}, buf)
        buf.seek(0)
        ema.load_state_dict(torch.load(buf)["model"])
        assert torch.cuda.memory_allocated() == 2 * 1024 * 1024 * 4

    assert memviz.predict(prog, device="H200").fits


def test_distributions_validate_their_arguments_and_the_program_logs_its_loss() -> None:
    """A VAE's ``Normal(mu, sigma)`` checks ``sigma > 0`` (validate_args): the assertion holds, as in a healthy
    run; the program's own ``.item()`` reads a loss the prediction does not compute: zeros, said in the notes."""
    def prog(log: bool) -> None:
        enc = nn.Linear(64, 32).cuda()
        mu, log_sigma = enc(torch.randn(16, 64, device="cuda")).chunk(2, -1)
        q = torch.distributions.Normal(mu, log_sigma.exp())
        z = q.rsample()
        loss = torch.distributions.kl_divergence(q, torch.distributions.Normal(0.0, 1.0)).sum() + z.sum()
        loss = loss - q.log_prob(z).sum()
        loss.backward()
        if log:
            print(loss.item())

    assert memviz.predict(prog, False, device="H200").breakdown()["gradients"] == (64 * 32 + 32) * 4
    logged = memviz.predict(prog, True, device="H200")
    assert logged.fits and any("read as zeros" in n and "test_predict_zoo.py" in n for n in logged.notes)


def test_silu_backward_is_one_kernel_as_on_the_gpu() -> None:
    """``silu_backward`` also has a composite kernel (``math_silu_backward``: a sigmoid and five more
    temporaries) that CUDA does not use: on the GPU the gradient is the one allocation (EfficientNet-B0's
    bf16 training step: reserved +34.98% with the composite)."""
    def prog() -> None:
        x = torch.randn(64, 1 << 14, device="cuda", requires_grad=True)  # 4 MiB
        torch.nn.functional.silu(x).sum().backward()

    backward = [e.op for e in memviz.predict(prog, device="H200").events
                if e.action == "alloc" and e.phase == "backward"]
    assert [op for op in backward if op.startswith(("sigmoid", "mul", "add", "empty_like"))] == []
    assert backward.count("silu_backward.default") == 1


def test_layer_norm_copies_a_non_contiguous_input_as_the_cuda_kernel_does() -> None:
    """``layer_norm_cuda`` reads ``input.expect_contiguous()``: a transposed input costs one input-sized copy
    while the kernel runs, a contiguous one none (torchvision ViT's ``ln_2`` after batch-first attention)."""
    def prog(transposed: bool) -> None:
        ln = nn.LayerNorm(256).cuda()
        x = torch.randn(512, 64, 256, device="cuda")  # 32 MiB
        ln(x.transpose(0, 1) if transposed else x)

    sizes = {t: [e.nbytes for e in memviz.predict(prog, t, device="H200").events
                 if e.action == "alloc" and e.op.startswith("native_layer_norm")] for t in (False, True)}
    assert sizes[False].count(32 << 20) == 1 and sizes[True].count(32 << 20) == 2


def test_convolutions_keep_channels_last_as_cudnn_does() -> None:
    """cuDNN gives a channels-last input channels-last outputs and gradients (meta kernels give contiguous
    ones): ConvNeXt's depthwise output, permuted to NHWC, is then contiguous and its LayerNorm copies nothing."""
    def prog() -> None:
        conv = nn.Conv2d(64, 64, 7, padding=3, groups=64).cuda()
        x = torch.randn(8, 64, 32, 32, device="cuda").to(memory_format=torch.channels_last).requires_grad_()
        y = conv(x)
        assert y.is_contiguous(memory_format=torch.channels_last)
        nn.functional.layer_norm(y.permute(0, 2, 3, 1), (64,)).sum().backward()
        assert x.grad.is_contiguous(memory_format=torch.channels_last)

    events = memviz.predict(prog, device="H200").events
    assert [e.nbytes for e in events if e.action == "alloc" and e.op == "native_layer_norm.default"
            and e.nbytes == 8 * 64 * 32 * 32 * 4] == [8 * 64 * 32 * 32 * 4]  # the output, no copy


def test_channels_last_convolutions_ask_the_channels_last_workspaces() -> None:
    """A channels-last convolution needs no layout transform: its only cuDNN workspace is backward-weight's
    split-K partials (dense 3×3: 14 fp32 weights; depthwise in bf16: 8 fp32 weights per image), where the
    NCHW rules would add a copy of each operand."""
    def prog(depthwise: bool) -> None:
        conv = nn.Conv2d(64, 64, 7 if depthwise else 3, padding="same", groups=64 if depthwise else 1).cuda()
        x = torch.randn(8, 64, 32, 32, device="cuda").to(memory_format=torch.channels_last).requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=depthwise):
            y = conv(x)
        y.float().sum().backward()

    def workspaces(depthwise: bool) -> list[int]:
        return [e.nbytes for e in memviz.predict(prog, depthwise, device="H200").events
                if e.action == "alloc" and e.op.startswith("cudnn_convolution")]

    assert workspaces(False) == [14 * 64 * 64 * 9 * 4]
    assert workspaces(True) == [8 * 8 * 64 * 49 * 4]

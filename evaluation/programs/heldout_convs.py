"""Second held-out set: convolution families the predictor had no measurement of when these were written.

Written on 2026-12-02 before the depthwise / grouped / patchify probe (``h200_probe4.json.gz``) was
recorded and before any rule was fitted on it, and recorded on the H200 by ``evaluation/record_runs.py
--parts heldout2``: a ConvNeXt-style network (a 4×4 stride-4 patchify stem, 7×7 depthwise convolutions,
channels-last LayerNorm and GELU MLPs through ``permute``, layer scale, 2×2 stride-2 downsampling) and a
ResNeXt-style network (3×3 convolutions in 32 groups inside bottlenecks). The probe's geometries are
deliberately not these networks' own, so the runs check the fitted rules on convolutions they were not
fitted on. Nothing in them knows about memviz; changing one invalidates its recordings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PROGRAMS", "convnext_inference", "convnext_training", "resnext_training"]


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor (through a channels-last permute)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.fc2(F.gelu(self.fc1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """A ConvNeXt at half ConvNeXt-T's widths (48/96/192/384) and depths (2, 2, 4, 2)."""

    def __init__(self, dims: tuple[int, ...] = (48, 96, 192, 384), depths: tuple[int, ...] = (2, 2, 4, 2),
                 num_classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0])]
        for i, (dim, depth) in enumerate(zip(dims, depths, strict=True)):
            if i:
                layers += [LayerNorm2d(dims[i - 1]), nn.Conv2d(dims[i - 1], dim, 2, 2)]
            layers += [ConvNeXtBlock(dim) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(dims[-1])
        self.head = nn.Linear(dims[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.features(x).mean(dim=(2, 3))))


class ResNeXtBottleneck(nn.Module):
    def __init__(self, c_in: int, width: int, stride: int, groups: int = 32):
        super().__init__()
        c_out = 2 * width
        self.conv1 = nn.Conv2d(c_in, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, c_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.down = (nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
                     if stride != 1 or c_in != c_out else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(self.bn3(self.conv3(y)) + self.down(x))


class ResNeXt(nn.Module):
    """A ResNeXt-26 (32×4d widths 128/256/512/1024, two bottlenecks a stage) after a 7×7/2 stem and a max-pool."""

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                                   nn.MaxPool2d(3, 2, 1)]
        c = 64
        for i, width in enumerate((128, 256, 512, 1024)):
            for j in range(2):
                layers.append(ResNeXtBottleneck(c, width, 2 if i and not j else 1))
                c = 2 * width
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(c, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


def convnext_training(*, batch: int = 32, image: int = 224, steps: int = 3, amp: bool = True) -> None:
    """The ConvNeXt on ``image``² inputs, bf16 autocast when ``amp``, AdamW, gradient clipping."""
    torch.manual_seed(0)
    model = ConvNeXt().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
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


def convnext_inference(*, batch: int = 128, image: int = 224, steps: int = 3, amp: bool = True) -> None:
    """The ConvNeXt in eval mode under ``torch.inference_mode()``, bf16 autocast when ``amp``."""
    torch.manual_seed(0)
    model = ConvNeXt().cuda().eval()
    x = torch.randn(batch, 3, image, image, device="cuda")
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
        for _ in range(steps):
            model(x).softmax(dim=-1).topk(5)
    torch.cuda.synchronize()


def resnext_training(*, batch: int = 32, image: int = 224, steps: int = 3, amp: bool = False) -> None:
    """The ResNeXt on ``image``² inputs, bf16 autocast when ``amp``, SGD with momentum."""
    torch.manual_seed(0)
    model = ResNeXt().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(batch, 3, image, image, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()


#: name → program, for the recorder and the comparison.
PROGRAMS = {fn.__name__: fn for fn in (convnext_training, convnext_inference, resnext_training)}

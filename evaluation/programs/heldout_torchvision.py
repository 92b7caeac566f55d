"""Third held-out set: torchvision's own models, as a user would train and run them.

Written on 2026-12-02 and recorded on the H200 by ``evaluation/record_runs.py --parts heldout3`` with the
machine's torchvision, before any prediction of them was compared. These programs need torchvision
(not a memviz dependency): ``python -m evaluation.recorded --only ho-tv`` compares them where it is
installed, and CI, which has none, does not run them. Nothing in them knows about memviz; changing one
invalidates its recordings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["PROGRAMS", "torchvision_inference", "torchvision_training"]


def _model(name: str) -> torch.nn.Module:
    import torchvision

    return torchvision.models.get_model(name, weights=None)


def torchvision_training(*, model: str = "resnet50", batch: int = 32, image: int = 224, steps: int = 3,
                         amp: bool = False, channels_last: bool = False) -> None:
    """``torchvision.models.get_model(model)`` trained on ``image``² inputs: bf16 autocast when ``amp``,
    channels-last memory format when ``channels_last``, AdamW (foreach, torch's default on CUDA)."""
    torch.manual_seed(0)
    net = _model(model).cuda()
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    net = net.to(memory_format=fmt)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x = torch.randn(batch, 3, image, image, device="cuda").to(memory_format=fmt)
    y = torch.randint(0, 1000, (batch,), device="cuda")
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            out = net(x)
            loss = F.cross_entropy(out if isinstance(out, torch.Tensor) else out[0], y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def torchvision_inference(*, model: str = "resnet50", batch: int = 64, image: int = 224, steps: int = 3,
                          amp: bool = True) -> None:
    """``torchvision.models.get_model(model)`` in eval mode under ``torch.inference_mode()``, bf16 autocast when
    ``amp``."""
    torch.manual_seed(0)
    net = _model(model).cuda().eval()
    x = torch.randn(batch, 3, image, image, device="cuda")
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
        for _ in range(steps):
            net(x).argmax(dim=-1)
    torch.cuda.synchronize()


#: name → program, for the recorder and the comparison.
PROGRAMS = {fn.__name__: fn for fn in (torchvision_training, torchvision_inference)}

"""The fit panel's refresh time: a changed control to a redrawn panel, per program (kernel side, no browser).

    .venv/bin/python benchmarks/bench_fit_panel.py [--changes 6]

For each program a :class:`memviz.widgets.fit_panel.FitPanel` is built (the first prediction, which also pays
the predictor's one-time start, is reported apart), then its batch control is set ``--changes`` times,
alternating two values; each change runs one :func:`memviz.predict` and redraws every view (gauges, banner,
stacked area, segment map). ``panel.refresh_seconds`` times each refresh from the control's change to the
last view sent. Prints every sample, the median and the prediction's share (``trace_seconds``). In a browser
the page shows the result about 50-100 ms after the kernel is done (tests/browser/test_fit_panel_browser.py prints
its typed-batch-to-gauges time).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from memviz.examples import gpt_training, mlp_training, resnet_training
from memviz.widgets.fit_panel import FitPanel


class _Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.ln(x))))


def lesson10_train(batch: int = 8, seq: int = 512, d_model: int = 512, n_layer: int = 4, steps: int = 2) -> None:
    """Lesson 10's program: four transformer MLP blocks, AdamW, two steps."""
    blocks = nn.ModuleList(_Block(d_model) for _ in range(n_layer)).cuda()
    opt = torch.optim.AdamW(blocks.parameters())
    x = torch.randn(batch, seq, d_model, device="cuda")
    for _ in range(steps):
        h = x
        for block in blocks:
            h = block(h)
        h.square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


PROGRAMS = {  # name -> (program, two batch sizes to alternate)
    "lesson 10 train": (lesson10_train, (8, 16)),
    "mlp_training": (mlp_training, (256, 512)),
    "resnet18 training": (resnet_training, (64, 32)),
    "gpt_training": (gpt_training, (8, 16)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=6, help="control changes per program (default 6)")
    args = parser.parse_args()
    for name, (program, batches) in PROGRAMS.items():
        start = time.perf_counter()
        panel = FitPanel(program, device="A100-80GB")
        first = time.perf_counter() - start
        traces = []
        for i in range(args.changes):
            panel.args.widgets["batch"].value = batches[(i + 1) % 2]
            traces.append(panel.prediction.trace_seconds)
        samples = panel.refresh_seconds[1:]
        assert len(samples) == args.changes and not panel.error_text, panel.error_text
        print(f"{name:18} first {first * 1000:6.0f} ms | refresh after a change: median "
              f"{statistics.median(samples) * 1000:6.0f} ms (prediction {statistics.median(traces) * 1000:6.0f} ms, "
              f"{len(panel.prediction.events):,} events) | samples "
              + " ".join(f"{s * 1000:.0f}" for s in samples))  # fmt: skip
        panel.close()


if __name__ == "__main__":
    main()

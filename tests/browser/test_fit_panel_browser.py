"""The fit panel in a real JupyterLab + Chromium: a typed batch size and a picked GPU redraw the panel, and the
bytes the page shows must equal what ``memviz.predict`` gives for the same program here, in the test process.

plotly's front end imports 2.5 s late here (``jlab.late_large_modules``), past anywidget's 2 s deadline for a
model to get ready: the figures must still show their data (``memviz.widgets.figure`` loads it once a page)."""

from __future__ import annotations

import time

import pytest
from jlab import ARTIFACTS_DIR, console_errors, late_large_modules, notebook_locator

from memviz.examples import mlp_training  # a user's training script: (batch=256, steps=3, amp=False)
from memviz.predictor import predict
from memviz.widgets._common import exact_bytes

pytestmark = pytest.mark.browser
FRESH_PAGE = True  # plotly's module must be imported late, so it must not have been imported in the page yet

GAUGE = ".memviz-fit-gauges .memviz-gauge-{} .memviz-gauge-value"

# plotly.js's own data for the stacked area: what is drawn, not what was sent
JS_AREA = """() => {
  const g = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .memviz-fit-area .js-plotly-plot')
         || document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .memviz-fit-area.js-plotly-plot');
  return g && g.data ? g.data.map(t => ({name: t.name, n: (t.x || []).length, y: Array.from(t.y || [])})) : null;
}"""


def expected(**kwargs):
    return predict(mlp_training, **kwargs)


def stack_at(area: list[dict] | None, n_events: int, index: int) -> int | None:
    """Bytes the drawn stack holds at event ``index`` (None until the area has ``n_events`` points)."""
    if not area or area[0]["n"] != n_events:
        return None
    return round(sum(t["y"][index] for t in area if t["name"] not in ("reserved", "peak") and t["y"]) * 2**20)


def test_fit_panel_follows_typed_and_picked_controls(lab):
    cells = ["import memviz\nfrom memviz.examples import mlp_training",
             "panel = memviz.fit_panel(mlp_training, device='T4')\npanel"]
    page = lab.page
    late_large_modules(page)
    lab.open("fit.ipynb", cells, run=True)
    first = expected(device="T4")
    lab.wait_text(GAUGE.format("allocated"), exact_bytes(first.peak_allocated_bytes), timeout=30)
    lab.wait_text(GAUGE.format("reserved"), exact_bytes(first.peak_reserved_bytes), timeout=30)
    assert "fits" in lab.text(".memviz-fit-banner")

    # type a batch size, as a user does (the box sends its value on Enter)
    bigger = expected(device="T4", batch=1024)
    box = notebook_locator(page, ".memviz-fit-arg-batch input")
    box.fill("1024")
    start = time.perf_counter()
    box.press("Enter")
    lab.wait_text(GAUGE.format("allocated"), exact_bytes(bigger.peak_allocated_bytes), timeout=30)
    typed_s = time.perf_counter() - start
    lab.wait_text(GAUGE.format("reserved"), exact_bytes(bigger.peak_reserved_bytes), timeout=30)

    # pick another GPU: the gauges' title and the numbers follow
    h200 = expected(device="H200", batch=1024)
    notebook_locator(page, ".memviz-fit-device select").select_option("H200")
    lab.wait_js("(t) => document.querySelector('.memviz-fit-gauges .memviz-gauge-title')?.textContent.startsWith(t)",
                "NVIDIA H200", timeout=30)  # fmt: skip
    lab.wait_text(GAUGE.format("reserved"), exact_bytes(h200.peak_reserved_bytes), timeout=30)

    ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
    # the stacked area plotly.js drew: one point per predicted event, and its top at the peak is the peak (waited
    # for: the T4 prediction before it has as many events, so the count alone does not say the redraw is done)
    want, drawn, deadline = sum(h200.breakdown().values()), None, time.monotonic() + 30
    while drawn != want and time.monotonic() < deadline:
        drawn = stack_at(lab.js(JS_AREA), len(h200.events), h200.peak_event_index)
        time.sleep(0.1)
    assert drawn == want, f"the area's stack at the peak is {drawn}, the H200 prediction's {want}"

    page.set_viewport_size({"width": 1400, "height": 2000})  # the whole panel in one picture
    notebook_locator(page, ".memviz-fit-panel").screenshot(path=str(ARTIFACTS_DIR / "fit_panel_fits.png"))

    # a cap too small: the banner names the failing request
    capped = expected(device="H200", batch=1024, cap="24 MiB")
    notebook_locator(page, ".memviz-fit-cap input").fill("24 MiB")
    notebook_locator(page, ".memviz-fit-cap input").press("Enter")
    lab.wait_js("() => !!document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .memviz-fit-oom')", timeout=30)
    lab.wait_js("() => document.querySelector('.memviz-fit-status')?.textContent.startsWith('predicted in')",
                timeout=30)
    banner = lab.text(".memviz-fit-oom")
    assert "OUT OF MEMORY" in banner and f"{capped.oom.requested_bytes:,} B" in banner and capped.oom.op in banner

    path = ARTIFACTS_DIR / "fit_panel.png"
    notebook_locator(page, ".memviz-fit-panel").screenshot(path=str(path))
    assert path.stat().st_size > 10_000
    assert "Traceback" not in lab.text(".memviz-fit-panel")
    assert lab.js("() => window.memvizLargeModules") == 1  # plotly's module, once for both figures
    assert not [e for e in console_errors(page) if "memviz" in e.lower() or "anywidget" in e.lower()]
    print(f"typed batch -> gauges redrawn: {typed_s * 1000:.0f} ms")


# a torchrun script's main() under FSDP2, the same source in the kernel and here: 1001 rows shard as 501 and 500
SHARDED = """
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def sharded(batch: int = 64, width: int = 1001) -> None:
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    mesh = init_device_mesh("cuda", (int(os.environ["WORLD_SIZE"]),))
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)).cuda()
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        model(torch.randn(batch, width, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()
"""


def test_fit_panel_predicts_every_rank_and_shows_the_picked_one(lab):
    namespace: dict = {}
    exec(SHARDED, namespace)
    want = predict(namespace["sharded"], device="H200", world_size=2, rank="all")
    assert want.groups() == [[0], [1]]  # the ranks differ: the page must show which is which
    cells = ["import memviz\n" + SHARDED, "panel = memviz.fit_panel(sharded, device='H200', world_size=2)\npanel"]
    page = lab.page
    lab.open("ranks.ipynb", cells, run=True)
    for r in (0, 1):  # the per-rank table: each rank's peaks, exactly
        lab.wait_js("(t) => document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .memviz-fit-ranks')"
                    "?.textContent.includes(t)", exact_bytes(want[r].peak_allocated_bytes), timeout=60)
    assert "every rank fits" in lab.text(".memviz-fit-banner")
    assert "outside the allocator, per rank" in lab.text(".memviz-fit-outside")
    lab.wait_text(GAUGE.format("allocated"), exact_bytes(want[0].peak_allocated_bytes), timeout=30)

    notebook_locator(page, ".memviz-fit-rank select").select_option("1")  # show rank 1: a redraw, no prediction
    lab.wait_js("(t) => document.querySelector('.memviz-fit-gauges .memviz-gauge-title')?.textContent.startsWith(t)",
                "rank 1 of 2", timeout=30)  # fmt: skip
    lab.wait_text(GAUGE.format("allocated"), exact_bytes(want[1].peak_allocated_bytes), timeout=30)
    assert lab.kernel("print(len(panel.refresh_seconds), panel.prediction.rank)").split() == ["1", "1"]
    notebook_locator(page, ".memviz-fit-panel").screenshot(path=str(ARTIFACTS_DIR / "fit_panel_ranks.png"))
    assert "Traceback" not in lab.text(".memviz-fit-panel")
    assert not [e for e in console_errors(page) if "memviz" in e.lower() or "anywidget" in e.lower()]

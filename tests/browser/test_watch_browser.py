"""``memviz.watch`` in a real JupyterLab + Chromium: the live view grows while ONE cell is still running.

A lab program on the simulator runs in one cell for about 1.7 s (14 steps of 64 MiB, 0.12 s each) inside
``with memviz.watch(lab):``. The test starts the cell and, without waiting for it, reads the page every 0.1 s:
the number of samples the timeline holds (``data-points``, kept by the page's widget model as comm messages
arrive) and the allocated gauge's text, together with the cell's prompt (``[*]`` while the kernel runs it).
Several different, growing readings must come while the prompt is ``[*]``: the sampler's thread sends, and the
page draws, during the cell. After the cell: the timeline has every sample the kernel took, the summary names
the peak (the exact bytes of 14 steps), and the segment map of the snapshot viewer is drawn at the peak. A
screenshot goes to ``test-artifacts/watch-live.png``.
"""

from __future__ import annotations

import time

import pytest
from jlab import _panel_js, console_errors, notebook_locator

from memviz.widgets._common import exact_bytes

pytestmark = pytest.mark.browser

STEPS, STEP_BYTES = 14, 64 << 20
CELLS = [
    "import time\nimport memviz\n\nlab = memviz.Lab('sim', device='T4', cap='2 GiB')",
    "with memviz.watch(lab, interval_s=0.05) as w:\n"
    f"    for i in range({STEPS}):\n"
    f"        lab.allocate({STEP_BYTES}, name=f'act{{i}}')\n"
    "        memviz.step()\n"
    "        time.sleep(0.12)",
]

# start cell i running and return at once (run_cell would wait for the kernel to finish it)
JS_START_CELL = _panel_js("(i)", """
  if (!ok) throw new Error('no notebook is shown');
  app.shell.activateById(panel.id);
  panel.content.activeCellIndex = i;
  panel.content.deselectAll();
  app.commands.execute('notebook:run-cell');
  return true;
""")

# what the page shows now: the timeline's samples, the allocated gauge, and whether cell i's prompt says [*]
JS_READ = _panel_js("(i)", """
  if (!ok) return null;
  const live = panel.node.querySelector('.memviz-live');
  const gauge = panel.node.querySelector('.memviz-gauge-allocated .memviz-gauge-value');
  const prompt = panel.content.widgets[i].node.querySelector('.jp-InputPrompt');
  return {points: live ? Number(live.dataset.points) : null, state: live ? live.dataset.state : null,
          gauge: gauge ? gauge.textContent : null, running: prompt ? prompt.textContent.includes('*') : null};
""")

JS_MAP_BLOCKS = """() => {
  const g = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .memviz-segment-map .js-plotly-plot')
         || document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .memviz-segment-map.js-plotly-plot');
  return g && g.data ? g.data[0].x.length / 3 : null;
}"""


def test_the_timeline_and_gauges_grow_while_one_cell_runs(lab):
    lab.open("watch.ipynb", CELLS)
    lab.run_cell(0)
    page = lab.page
    page.evaluate(JS_START_CELL, 1)
    readings = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = page.evaluate(JS_READ, 1)
        if r and r["points"] is not None:
            readings.append(r)
            if r["state"] == "done" and not r["running"]:
                break
        time.sleep(0.1)
    during = [r for r in readings if r["running"] and r["state"] == "running"]
    points = [r["points"] for r in during]
    assert len(set(points)) >= 4 and points == sorted(points), readings  # grew, sample by sample, during the cell
    assert len({r["gauge"] for r in during}) >= 3, during  # the gauge moved too
    lab.wait_js("(i) => { const p = document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) "
                ".jp-InputPrompt')[i]; return p && !p.textContent.includes('*'); }", 1, timeout=30)
    offered, peak = lab.kernel("print(w.samples.offered, w.peak_allocated_bytes)").split()
    assert int(peak) == STEPS * STEP_BYTES
    live = notebook_locator(page, ".memviz-live")
    live.scroll_into_view_if_needed()
    lab.wait_js("(n) => { const e = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .memviz-live');"
                " return e && e.dataset.state === 'done' && Number(e.dataset.points) >= n; }", int(offered))
    summary = lab.text(".memviz-watch-summary")
    assert f"peak allocated {exact_bytes(STEPS * STEP_BYTES)}" in summary and f"{STEPS} steps" in summary
    notebook_locator(page, ".memviz-segment-map").scroll_into_view_if_needed()
    blocks = lab.wait_js(JS_MAP_BLOCKS, timeout=20)
    assert blocks == STEPS  # the map at the peak: one live block per step
    lab.screenshot("watch-live")
    assert not [e for e in console_errors(page) if "memviz" in e.lower()]

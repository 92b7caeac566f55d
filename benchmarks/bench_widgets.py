"""The dashboard's speed in a real JupyterLab + headless Chromium, the segment map's with 10,000 blocks, and a
click's kernel-side cost after 0, 2,000 and 10,000 events.

    .venv/bin/python benchmarks/bench_widgets.py [--clicks 20] [--gap 0.3] [--blocks 10000] [--json out.json]
    .venv/bin/python benchmarks/bench_widgets.py --kernel-only [--events 0,2000,10000]

1. **Click to rendered** (target <= 0.1 s): opens a notebook with the whole dashboard on a simulated T4
   capped at 2 GiB (gauges + timeline + segment map + controls + log), then alternates Allocate / Free.
   Timed in the page from the trusted click event to the moment everything the click changed is drawn: the
   gauge's exact-bytes text updated, and a ``plotly_afterplot`` from the timeline and from the segment map
   ("drawn"), then two animation frames ("painted"). Two series: clicks ``--gap`` seconds apart (a person's
   pace; a click's after-traffic, plotly.js reporting the drawn figure back to Python, takes ~0.15 s), and
   clicks back to back (each the moment the previous one is painted, over that traffic).
2. **Segment map with N blocks** (target <= 0.5 s): one click allocates ``--blocks`` tensors of 100 KiB
   (about 20 per 2 MiB segment, so N blocks plus a free tail per segment); timed from the click to the map's
   ``plotly_afterplot`` with every block drawn (Python builds the bars, the kernel sends them, plotly.js
   draws them); then a redraw of that map alone in the browser (``Plotly.react`` on the same data).
   The kernel's own refresh time (``dash.last_refresh_s``) is reported too.

3. **Kernel-side click cost against history** (target: flat in the number of events): in a real IPython
   kernel (``jupyter_client``; the widgets' messages really are serialised and sent, no browser needed), a
   dashboard whose lab has already logged N events (1 MiB allocate/free pairs, an ``empty_cache()`` every
   25, a ``gc`` every 100, an OOM every 250), then ``button.click()`` timed in the kernel: ``empty_cache()``,
   Allocate/Free of 4 MiB, and an Allocate that runs out of memory. ``--kernel-only`` runs this part alone.

Prints every sample and the median and p90 in ms. Parts 1 and 2 need /usr/bin/chromium.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "browser"))
import jlab  # lives in tests/browser, shared with the browser tests

SETUP_CELLS = [
    'import memviz.widgets as mw\n\ndash = mw.dashboard(backend="sim", device="T4", cap="2 GiB")\ndash',
    'dash.lab.allocate("64 MiB", name="weights")',
]
GAUGE = ".memviz-gauge-allocated .memviz-gauge-value"

# Arm a probe: resolves when the gauge text changed and every figure listed has drawn since the click. Each moment
# is taken when it happens: the gauge by a MutationObserver (it runs right after the script that changed the text),
# a figure by its plotly_afterplot event; "painted" is two animation frames after the last of them.
JS_ARM = """
([gaugeSel, figs, minBars, timeoutMs]) => {
  const root = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  const gd = (cls) => root.querySelector('.' + cls + ' .js-plotly-plot')
                   || root.querySelector('.' + cls + '.js-plotly-plot');
  const gaugeEl = root.querySelector(gaugeSel);
  const read = () => gaugeEl.textContent.trim();
  const state = {t0: null, before: read(), gauge: null, plotted: {}, done: false,
                 minBars: Object.fromEntries(figs.map((c, i) => [c, minBars[i]]))};
  window.__mvState = state;
  let resolveProbe;
  window.__mvProbe = new Promise((resolve) => { resolveProbe = resolve; });
  const timer = setTimeout(() => resolveProbe({ok: false, state}), timeoutMs);
  const check = () => {
    if (state.done || state.gauge === null || !figs.every(c => state.plotted[c] != null)) return;
    state.done = true;
    clearTimeout(timer);
    const tDrawn = Math.max(state.gauge, ...figs.map(c => state.plotted[c]));
    requestAnimationFrame(() => requestAnimationFrame(() => resolveProbe({ok: true,
      gauge_ms: state.gauge - state.t0, drawn_ms: tDrawn - state.t0, painted_ms: performance.now() - state.t0,
      figs_ms: Object.fromEntries(figs.map(c => [c, state.plotted[c] - state.t0]))})));
  };
  if (window.__mvGaugeObserver) window.__mvGaugeObserver.disconnect();
  window.__mvGaugeObserver = new MutationObserver(() => {
    if (state.t0 === null || state.gauge !== null || read() === state.before) return;
    state.gauge = performance.now();
    check();
  });
  window.__mvGaugeObserver.observe(gaugeEl, {childList: true, characterData: true, subtree: true});
  for (const cls of figs) {
    const g = gd(cls);
    if (!g.__mvHooked) {
      g.__mvHooked = true;
      g.on('plotly_afterplot', () => {
        const s = window.__mvState;
        const bars = (g.data || []).reduce((n, t) => n + (t.x ? t.x.length : 0), 0);
        if (s && s.t0 !== null && s.plotted[g.__mvCls] == null && bars >= s.minBars[g.__mvCls]) {
          s.plotted[g.__mvCls] = performance.now();
          s.check();
        }
      });
    }
    g.__mvCls = cls;
  }
  state.check = check;
  document.addEventListener('click', () => { if (state.t0 === null) state.t0 = performance.now(); },
                            {capture: true, once: true});
  return state.before;
}
"""

# Redraw the segment map alone from the data it holds (browser-side render cost only): Plotly.react with a new
# datarevision forces a full recalc and replot of the same traces.
JS_REDRAW_MAP = """
async () => {
  const g = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .memviz-segment-map .js-plotly-plot')
         || document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .memviz-segment-map.js-plotly-plot');
  const P = window.Plotly;
  if (!P) return {bars: 0, ms: null, why: 'no window.Plotly'};
  const bars = g.data.reduce((n, t) => n + t.x.length, 0);
  const t0 = performance.now();
  await P.react(g, g.data, Object.assign({}, g.layout, {datarevision: Math.random()}));
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  return {bars, ms: performance.now() - t0};
}
"""


def click_and_time(lab: jlab.Lab, button: str, figs: list[str], min_bars: list[int], timeout: float = 30) -> dict:
    lab.page.evaluate(JS_ARM, [GAUGE, figs, min_bars, int(timeout * 1000)])
    lab.click(button)
    res = lab.page.evaluate("() => window.__mvProbe")
    if not res.get("ok"):
        raise jlab.HarnessError(f"{button}: the dashboard never showed the update: {res}")
    return res


KERNEL_SETUP = r"""
import json, statistics, time
import memviz.widgets as mw

def _dashboard_after(n):
    d = mw.dashboard(backend="sim", device="T4", cap="2 GiB", live=False)
    lab = d.lab
    lab.allocate("64 MiB", name="weights")
    k = 0
    while len(lab.events) < n:
        k += 1
        lab.allocate("1 MiB", name=f"a{k}")
        lab.free(f"a{k}")
        if k % 25 == 0:
            lab.empty_cache()
        if k % 100 == 0:
            lab.gc()
        if k % 250 == 0:
            lab.allocate("3 GiB", name=f"big{k}")
    d.refresh()
    return d

def _median_click_ms(d, labels, reps, size):
    d.controls.size.value = size
    times = []
    for _ in range(reps):
        for label in labels:
            d.controls.name.value = ""
            t = time.perf_counter()
            d.controls.buttons[label].click()
            times.append(time.perf_counter() - t)
            assert not d.out.outputs, d.out.outputs
    return round(1000 * statistics.median(times), 2)
"""

KERNEL_RUN = """
d = _dashboard_after({n})
res = {{"events": len(d.lab.events),
        "empty_cache_ms": _median_click_ms(d, ["empty_cache()"], 15, "4 MiB"),
        "allocate_free_ms": _median_click_ms(d, ["Allocate", "Free"], 10, "4 MiB"),
        "oom_ms": _median_click_ms(d, ["Allocate"], 5, "3 GiB")}}
d.close()
print(json.dumps(res))
"""


def kernel_clicks(event_counts: list[int]) -> list[dict]:
    """Part 3: median kernel-side click times (ms) on a dashboard after each number of events."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    out: list[str] = []

    def hook(msg: dict) -> None:
        content = msg["content"]
        if msg["msg_type"] == "stream" and content.get("name") == "stdout":
            out.append(content["text"])
        elif msg["msg_type"] == "error":
            raise RuntimeError(f"{content['ename']}: {content['evalue']}")

    results = []
    try:
        kc.execute_interactive(KERNEL_SETUP, output_hook=hook, timeout=120)
        for n in event_counts:
            out.clear()
            kc.execute_interactive(KERNEL_RUN.format(n=n), output_hook=hook, timeout=600)
            res = json.loads("".join(out).strip().splitlines()[-1])
            print(f"after {res['events']:6,} events: empty_cache() {res['empty_cache_ms']:7.2f} ms, "
                  f"Allocate/Free {res['allocate_free_ms']:7.2f} ms, OOM {res['oom_ms']:7.2f} ms (kernel medians)")
            results.append(res)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return results


def summary(samples: list[float]) -> dict:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return {"median_ms": round(statistics.median(ordered), 1), "p90_ms": round(p90, 1), "n": len(ordered)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clicks", type=int, default=20, help="Allocate/Free clicks to time (default 20)")
    ap.add_argument("--blocks", type=int, default=10_000, help="tensors for the segment-map run (default 10000)")
    ap.add_argument("--gap", type=float, default=0.3, help="seconds between clicks in the first series (default 0.3)")
    ap.add_argument("--map-reps", type=int, default=3, help="segment-map runs (default 3)")
    ap.add_argument("--events", default="0,2000,10000", help="event counts for part 3 (default 0,2000,10000)")
    ap.add_argument("--kernel-only", action="store_true", help="run part 3 (kernel-side click cost) alone")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    t_start = time.perf_counter()
    event_counts = [int(n) for n in args.events.split(",")]
    if args.kernel_only:
        results = {"kernel_clicks": kernel_clicks(event_counts), "wall_s": round(time.perf_counter() - t_start, 1)}
        print(json.dumps(results, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
        return 0
    server = jlab.start_server(wait=False)
    pw, ctx = jlab.launch_browser()
    results: dict = {}
    try:
        server.wait_ready()
        lab = jlab.Lab(server, jlab.new_page(ctx))
        lab.open("bench.ipynb", SETUP_CELLS, run=True)
        lab.wait_text(GAUGE, "64.00 MiB (67,108,864 B)", timeout=30)
        loc = jlab.notebook_locator(lab.page, ".memviz-size input")
        loc.fill("32 MiB")
        figs = ["memviz-timeline", "memviz-segment-map"]
        for series, gap in (("click_to_rendered", args.gap), ("click_to_rendered_back_to_back", 0.0)):
            clicks = []
            for i in range(args.clicks + 2):  # the first two are warm-up
                time.sleep(gap)
                label = "Allocate" if i % 2 == 0 else "Free"
                res = click_and_time(lab, label, figs, [0, 0])
                if i >= 2:
                    clicks.append(res)
                print(f"{series} {i:2d} {label:8s} gauge {res['gauge_ms']:6.1f} ms, all drawn "
                      f"{res['drawn_ms']:6.1f} ms, painted {res['painted_ms']:6.1f} ms  {res['figs_ms']}")  # fmt: skip
            results[series] = {
                "gap_s": gap,
                "gauge": summary([r["gauge_ms"] for r in clicks]),
                "drawn": summary([r["drawn_ms"] for r in clicks]),
                "painted": summary([r["painted_ms"] for r in clicks]),
            }
        lab.kernel("dash.lab.free_all(); dash.lab.empty_cache(); dash.refresh()")
        map_runs, redraws, py = [], [], []
        loc.fill("100 KiB")
        jlab.notebook_locator(lab.page, ".memviz-count input").fill(str(args.blocks))
        jlab.notebook_locator(lab.page, ".memviz-count input").press("Enter")
        for rep in range(args.map_reps):
            jlab.notebook_locator(lab.page, ".memviz-name input").fill(f"many{rep}")
            res = click_and_time(lab, "Allocate", ["memviz-segment-map"], [args.blocks], timeout=60)
            n_blocks = int(lab.kernel("print(sum(len(s['blocks']) for s in dash.lab.snapshot()['segments']))"))
            kernel_s = float(lab.kernel("print(dash.last_refresh_s)"))
            redraw = lab.page.evaluate(JS_REDRAW_MAP)
            map_runs.append(res["figs_ms"]["memviz-segment-map"])
            redraws.append(redraw["ms"])
            py.append(kernel_s * 1000)
            print(f"map run {rep}: {n_blocks:,} blocks, click -> map drawn {map_runs[-1]:.1f} ms "
                  f"(kernel refresh {py[-1]:.1f} ms); browser redraw alone {redraw['ms']:.1f} ms "
                  f"({redraw['bars']:,} points)")  # fmt: skip
            lab.kernel(f"dash.lab.free('many{rep}'); dash.lab.empty_cache(); dash.refresh()")
        results["segment_map"] = {"blocks": n_blocks, "click_to_drawn": summary(map_runs),
                                  "browser_redraw": summary(redraws), "kernel_refresh": summary(py)}  # fmt: skip
    finally:
        jlab.close_browser(pw, ctx)
        server.stop()
    results["kernel_clicks"] = kernel_clicks(event_counts)
    results["wall_s"] = round(time.perf_counter() - t_start, 1)
    print(json.dumps(results, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

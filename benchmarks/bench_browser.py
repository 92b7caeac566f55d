"""Click-to-render latency of a widget in a real JupyterLab + headless Chromium.

Starts the same JupyterLab server and Chromium as the browser tests (``tests/browser/jlab.py``), opens
a notebook, runs all cells, then clicks an ipywidgets Button ``--reps`` times and measures, in the page,
the time from the trusted click event to the DOM showing the new value (``dom``) and to two animation
frames later, i.e. painted (``frame``). Prints every sample and the median and p90 in ms.

Default: a Button that increments a plotly ``FigureWidget`` bar whose value is drawn as text::

    .venv/bin/python benchmarks/bench_browser.py

Any notebook or cell setup (e.g. the dashboard later)::

    .venv/bin/python benchmarks/bench_browser.py --notebook notebooks/02_dashboard.ipynb \\
        --button "Step" --selector ".mv-peak" [--expect REGEX]
    .venv/bin/python benchmarks/bench_browser.py --cells my_setup.py --button Go --selector .out

``--cells`` takes a Python file split into cells by ``# %%`` lines. A repetition is done when the text
of ``--selector`` (first match in the notebook, SVG text too) matches ``--expect``, or, without it,
differs from its text before the click: so each click must change what the selector shows.
Needs /usr/bin/chromium (apt-get install -y --no-install-recommends chromium fonts-dejavu-core).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "browser"))
import jlab  # lives in tests/browser, shared with the browser tests

DEFAULT_CELLS = [
    """\
import ipywidgets as w
import plotly.graph_objects as go

fig = go.FigureWidget(data=[go.Bar(x=["a"], y=[0], texttemplate="%{y}", textposition="inside")])
fig.update_layout(width=500, height=300, margin=dict(l=30, r=10, t=10, b=30))
bump = w.Button(description="Bump")


def on_bump(_):
    fig.data[0].y = [fig.data[0].y[0] + 1]


bump.on_click(on_bump)
display(bump, fig)""",
]
DEFAULT_BUTTON = "Bump"
DEFAULT_SELECTOR = ".js-plotly-plot text.bartext"


def cells_from_py(path: str | Path) -> list[str]:
    """Split a Python file into cell sources at ``# %%`` lines (percent format); empty cells dropped."""
    text = Path(path).read_text()
    parts = re.split(r"^# %%.*$", text, flags=re.MULTILINE)
    return [p.strip("\n") for p in parts if p.strip()]


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` (0-100) of ``xs``."""
    s = sorted(xs)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "p90": percentile(xs, 90), "min": min(xs), "max": max(xs)}


def bench(
    *,
    cells: list[str] | None = None,
    notebook: str | Path | None = None,
    button: str = DEFAULT_BUTTON,
    selector: str = DEFAULT_SELECTOR,
    expect: str | None = None,
    reps: int = 20,
    warmup: int = 2,
    screenshot: str | None = "bench-browser",
    verbose: bool = True,
) -> dict:
    """Run the benchmark; returns ``{"dom": {...}, "frame": {...}, "samples": [...], ...}`` (ms)."""
    say = print if verbose else (lambda *a, **k: None)
    t0 = time.monotonic()
    server = jlab.start_server(wait=False)
    pw = ctx = None
    try:
        pw, ctx = jlab.launch_browser()
        server.wait_ready()
        if notebook is not None:
            name = server.copy_notebook(notebook).name
        else:
            name = "bench.ipynb"
            server.write_notebook(name, cells or DEFAULT_CELLS)
        page = jlab.new_page(ctx)
        jlab.open_notebook(page, server, name)
        jlab.run_all(page, server)
        say(f"setup: server + Chromium + {name} ran in {time.monotonic() - t0:.1f} s")
        for _ in range(warmup):
            jlab.measure_click(page, button, selector, expect=expect)
        samples = []
        for i in range(reps):
            jlab.wait_kernel_idle(page, server, steady_s=0.05)
            r = jlab.measure_click(page, button, selector, expect=expect)
            samples.append(r)
            say(f"  click {i + 1:2d}: dom {r['dom_ms']:7.1f} ms  frame {r['frame_ms']:7.1f} ms  "
                f"{r['before']!r} -> {r['text']!r}")  # fmt: skip
        shot = jlab.screenshot(page, screenshot) if screenshot else None
        errors = jlab.console_errors(page)
    finally:
        if ctx is not None:
            jlab.close_browser(pw, ctx)
        server.stop()
    dom = summarize([r["dom_ms"] for r in samples])
    frame = summarize([r["frame_ms"] for r in samples])
    say(f"click-to-DOM    ({reps} clicks): median {dom['median']:.1f} ms, p90 {dom['p90']:.1f} ms "
        f"(min {dom['min']:.1f}, max {dom['max']:.1f})")  # fmt: skip
    say(f"click-to-paint  ({reps} clicks): median {frame['median']:.1f} ms, p90 {frame['p90']:.1f} ms "
        f"(min {frame['min']:.1f}, max {frame['max']:.1f})")  # fmt: skip
    if shot:
        say(f"screenshot: {shot}")
    if errors:
        say("browser console errors:\n  " + "\n  ".join(errors))
    return {"notebook": str(notebook or "built-in"), "button": button, "selector": selector, "reps": reps,
            "dom": dom, "frame": frame, "samples": samples, "console_errors": errors}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--notebook", help="an .ipynb to copy into the server and Run All (default: built-in)")
    src.add_argument("--cells", help="a .py file of cells separated by '# %%' lines")
    ap.add_argument("--button", default=DEFAULT_BUTTON, help="description of the ipywidgets Button to click")
    ap.add_argument("--selector", default=DEFAULT_SELECTOR, help="CSS of the element whose text updates")
    ap.add_argument("--expect", help="regex the updated text must match (default: any change)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2, help="clicks before measuring (default 2)")
    ap.add_argument("--screenshot", default="bench-browser", help="test-artifacts/<name>.png ('' for none)")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    if not jlab.chromium_available():
        print(f"bench_browser: {jlab.CHROMIUM} is missing (apt-get install chromium)", file=sys.stderr)
        return 2
    res = bench(
        cells=cells_from_py(args.cells) if args.cells else None,
        notebook=args.notebook,
        button=args.button,
        selector=args.selector,
        expect=args.expect,
        reps=args.reps,
        warmup=args.warmup,
        screenshot=args.screenshot or None,
    )
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

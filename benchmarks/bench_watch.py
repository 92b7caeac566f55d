"""What watching costs a training step: the step time with and without ``memviz.watch``, in a real IPython kernel.

    .venv/bin/python benchmarks/bench_watch.py [--blocks 12] [--steps 40] [--json out.json]

A real ``ipykernel`` (``jupyter_client``; the view's comm messages really are serialised and sent over ZeroMQ,
no browser needed) trains a small MLP with torch on the CPU (4 x Linear(512, 512), batch 256, AdamW, one torch
thread: a short step, the case where a sampler thread's GIL time shows most) and times blocks of ``--steps``
steps, alternately without a watch and inside ``with memviz.watch(lab):`` (a simulated lab: each tick the
sampler reads its stats and builds a sample; at most five times a second the gauges' rows and the timeline's new
rows go to the page), ABBA-ordered so that drift cancels. Prints each block's ms/step, the medians and the
overhead (median watched / median plain - 1), at 10 Hz and at 100 Hz, and the sampler's own CPU per tick.
Also ``memviz.step()``'s cost with and without a running watch (in this process).

What this cannot show: torch's ``memory_stats`` read on a GPU (about 170 µs flattened; the watch reads the
unflattened dict) and the memory history's cost per allocation. scripts/gpu_watch_check.py measures both on the
H200, on a GPU-bound and a launch-bound step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

KERNEL_SETUP = """
import json, statistics, time
import torch
import memviz
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(512, 512), torch.nn.ReLU())])
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(256, 512)
lab = memviz.Lab("sim", device="T4")

def train(steps):
    t = time.perf_counter()
    for _ in range(steps):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        memviz.step()
    return (time.perf_counter() - t) / steps

train(50)
"""

KERNEL_RUN = """
plain, watched, cpu_per_tick, pushes = [], [], [], 0
for b in range({blocks}):
    for watch_it in ((False, True) if b % 2 == 0 else (True, False)):
        if watch_it:
            with memviz.watch(lab, interval_s={interval}, history=False) as w:
                watched.append(train({steps}))
            cpu_per_tick.append(w.sampler_cpu_s / max(1, w._sampler.ticks))
            pushes += w.view.pushes
            w.view.close()
        else:
            plain.append(train({steps}))
print(json.dumps({{"plain": plain, "watched": watched, "cpu_per_tick": cpu_per_tick, "pushes": pushes}}))
"""


def run_kernel(blocks: int, steps: int, intervals: list[float]) -> dict:
    from jupyter_client.manager import start_new_kernel

    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    km, kc = start_new_kernel(kernel_name="python3", env=env)
    try:
        _execute(kc, KERNEL_SETUP)
        return {str(i): json.loads(_execute(kc, KERNEL_RUN.format(blocks=blocks, steps=steps, interval=i)))
                for i in intervals}  # fmt: skip
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _execute(kc, code: str) -> str:
    reply = kc.execute_interactive(code, timeout=600, output_hook=_collect(out := []))
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"the kernel raised: {reply['content'].get('ename')}: {reply['content'].get('evalue')}")
    return "".join(out)


def _collect(out: list[str]):
    def hook(msg):
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            print("\n".join(msg["content"]["traceback"]), file=sys.stderr)
    return hook


def step_cost_ns(n: int = 200_000) -> dict:
    """``memviz.step()``'s cost in this process: no watch running, and one running (the lab's sampler idle)."""
    sys.path.insert(0, str(ROOT))
    import memviz

    def per_call() -> float:
        t = time.perf_counter()
        for _ in range(n):
            memviz.step()
        return (time.perf_counter() - t) / n * 1e9

    idle = statistics.median(per_call() for _ in range(5))
    with memviz.watch(memviz.Lab("sim", device="T4"), interval_s=1.0, show=False):
        running = statistics.median(per_call() for _ in range(5))
    return {"no_watch_ns": idle, "watch_running_ns": running}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=12, help="ABBA pairs of blocks per rate (default 12)")
    parser.add_argument("--steps", type=int, default=40, help="steps per block (default 40)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    results = {"load": load, "kernel": run_kernel(args.blocks, args.steps, [0.1, 0.01]), "step": step_cost_ns()}
    for interval, r in results["kernel"].items():
        plain, watched = statistics.median(r["plain"]), statistics.median(r["watched"])
        r["median_plain_ms"], r["median_watched_ms"] = 1e3 * plain, 1e3 * watched
        r["overhead"] = watched / plain - 1
        print(f"\nwatch at {1 / float(interval):.0f} Hz ({args.blocks} blocks each of {args.steps} steps, ABBA):")
        print("  plain   ms/step: " + " ".join(f"{1e3 * v:.2f}" for v in r["plain"]))
        print("  watched ms/step: " + " ".join(f"{1e3 * v:.2f}" for v in r["watched"]))
        print(f"  median plain {1e3 * plain:.3f} ms, watched {1e3 * watched:.3f} ms: "
              f"overhead {100 * r['overhead']:+.2f}%")
        print(f"  sampler CPU per tick (read, sample, two comm messages): median "
              f"{1e6 * statistics.median(r['cpu_per_tick']):.0f} µs; {r['pushes']} view updates sent")
    s = results["step"]
    print(f"\nmemviz.step(): {s['no_watch_ns']:.0f} ns with no watch, {s['watch_running_ns']:.0f} ns with one running")
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

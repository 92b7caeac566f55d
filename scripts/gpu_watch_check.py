"""Check ``memviz.watch`` / ``record`` on a real GPU (issue 29): live samples, exact peaks, the map at an OOM,
nothing pinned after it, a job followed from another process, and what watching costs a training step.

    python3 scripts/gpu_watch_check.py --out DIR [--parts peaks,overhead,oom,follow] [--budget-s 85]

Each part runs in a fresh process (``--part NAME``) and writes ``DIR/<part>.json``; ``DIR/summary.json`` has
every part's return code, seconds and pass/fail checks, and the figures the report needs. ``peaks`` and
``overhead`` run alone (they time things); ``oom`` and ``follow`` then run side by side, each under a
``set_per_process_memory_fraction`` cap so that their OOMs come in seconds. About 60-75 s on an H200; every
part is killed at the budget's end and keeps what it wrote. The views (ipywidgets, anywidget, plotly) are
built when they import (without a kernel: nothing is displayed, their messages go nowhere) and skipped, saying
so, when they do not.

- ``peaks``: a GPU-bound training step (4 residual MLP blocks, d=2048, 8192 rows, TF32, AdamW; about 20 ms)
  watched for 300 steps at 10 Hz with the memory history on and no ``memviz.step()`` (the optimizer's steps
  are counted). The watch's peaks must equal ``max_memory_allocated()`` / ``max_memory_reserved()``; the
  highest *current* value any sample saw is kept too (what a sampler that reads only the current values would
  report); the history's highest allocated equals the peak; the map opens at it, and some of the largest live
  tensors there have stacks into this file (the activations; parameters and optimizer state were made before
  the recording, gradients on autograd's device thread, which has no Python stack); the samples came every
  ~0.1 s while the loop ran.
- ``overhead``: ms per step, ABBA blocks of about a second, plain / watched (history off) / watched with
  history, on the GPU-bound step and on a launch-bound one (d=256, 64 rows: the CPU is the bottleneck, where a
  sampler thread can show); each block timed once its watch runs; the overhead is the median of the rounds'
  watched / plain ratios (and the ratio of medians beside it, and the plain blocks' spread); the sampler's CPU
  per tick; what one read of the allocator costs (the
  watch's, the driver's through NVML, and ``torch.cuda.memory_stats()`` for comparison).
- ``oom``: under a 4 GiB cap, ``total = total + loss`` inside a function until CUDA runs out of memory, inside
  ``with memviz.watch():``. The OOM ends the block and is kept (``w.oom``); the map opens at the ``oom`` event
  of the history (the snapshot the allocator's OOM observer took at that moment); the largest live tensors
  there were made under ``leaky_train`` (their recorded stack); allocated is back to the model + optimizer after
  the block (the failed frames were cleared: nothing pinned, no ``gc.collect()``); then again with
  ``raise_oom=True``: the error is raised and, while it is still alive in the ``except`` block, allocated is
  back too; then 5 more steps run.
- ``follow``: a child process (``--part job``) trains with ``memviz.record(DIR/stats.jsonl)`` and a leak until
  it dies of an OOM under a 3 GiB cap; this process follows the file with ``memviz.watch(path)`` while it runs:
  the samples it has must grow while the child runs, the child's OOM line must come, and the map must open at
  the OOM from the snapshot the child dumped.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1]))
MiB, GiB = 1 << 20, 1 << 30
PARTS = ("peaks", "overhead", "oom", "follow")


# -- the programs ------------------------------------------------------------------------------------


def make_model(d: int, blocks: int):
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(d)
            self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    model = torch.nn.Sequential(*[Block() for _ in range(blocks)]).cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def train_step(model, optimizer, x) -> None:
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def leaky_train(model, optimizer, x, steps: int, *, mark: bool = True) -> int:
    """``total = total + loss``: every step's graph (its activations) stays alive, until CUDA runs out."""
    import memviz

    total = 0
    for _ in range(steps):
        loss = model(x).square().mean()
        total = total + loss  # the leak: the tensor, not loss.item()
        optimizer.zero_grad(set_to_none=True)
        if mark:
            memviz.step()
    return int(total.item())


def gpu_bound():
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model, optimizer = make_model(2048, 4)
    return model, optimizer, torch.randn(8192, 2048, device="cuda")


def launch_bound():
    import torch

    model, optimizer = make_model(256, 4)
    return model, optimizer, torch.randn(64, 256, device="cuda")


def widgets_available() -> str | None:
    """None when the views can be built here, else why not."""
    try:
        import anywidget  # noqa: F401
        import ipywidgets  # noqa: F401
        import plotly  # noqa: F401
    except ImportError as error:
        return f"not built: {error} (carry the wheels to check them here; the browser test checks them on CPU)"
    return None


def blocks_timed(step, steps: int) -> float:
    """Seconds per step over ``steps`` steps, synchronized at both ends."""
    import torch

    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / steps


# -- the parts ---------------------------------------------------------------------------------------


def part_peaks(out: dict) -> None:
    import numpy as np
    import torch

    import memviz

    model, optimizer, x = gpu_bound()
    for _ in range(5):
        train_step(model, optimizer, x)
    torch.cuda.synchronize()
    views = widgets_available()
    out["views"] = views or "built"
    steps = 300
    t = time.perf_counter()
    with memviz.watch(interval_s=0.1, show=views is None) as w:
        loop_start = time.perf_counter()
        for _ in range(steps):
            train_step(model, optimizer, x)  # no memviz.step(): the optimizer's steps are counted
        torch.cuda.synchronize()
        loop_s = time.perf_counter() - loop_start
        stop_at = time.perf_counter()
    out["stop_s"] = time.perf_counter() - stop_at  # the end: snapshot, history, results (views if built)
    out["loop_s"], out["watch_wall_s"] = loop_s, time.perf_counter() - t
    max_alloc, max_res = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    t_s = w.samples.t_s
    during = t_s[(t_s > 0) & (t_s <= loop_s)]
    gaps = np.diff(during)
    current_max = int(w.samples.column("allocated_bytes").max())
    history = w.history
    hist_max = int(max(history.timeline.allocated_bytes)) if history is not None else None
    live = [g.line() for g in w.live]
    out.update(
        steps_counted=w.steps, steps_run=steps, median_step_ms=1e3 * (w.median_step_s or 0),
        samples=w.samples.offered, samples_during_loop=len(during),
        sample_gap_median_s=float(np.median(gaps)) if len(gaps) else None,
        sample_gap_max_s=float(gaps.max()) if len(gaps) else None,
        peak_allocated_bytes=w.peak_allocated_bytes, max_memory_allocated=max_alloc,
        peak_reserved_bytes=w.peak_reserved_bytes, max_memory_reserved=max_res,
        highest_current_allocated_sampled=current_max, missed_by_current_only_bytes=max_alloc - current_max,
        history_events=len(history) if history is not None else 0, history_max_allocated=hist_max,
        focus=w.focus, live_at_peak=live, live_stacks=[list(g.stack) for g in w.live[:3]], notes=w.notes,
        sampler_cpu_s=w.sampler_cpu_s, sampler_error=w.error, summary=w.summary(),
        view_pushes=w.view.pushes if w.view else None,
        viewer_at_focus=(w.view.viewer.index == w.focus_index) if w.view and w.view.viewer else None,
    )  # fmt: skip
    out["checks"] = {
        "peak_allocated_equals_max_memory_allocated": w.peak_allocated_bytes == max_alloc,
        "peak_reserved_equals_max_memory_reserved": w.peak_reserved_bytes == max_res,
        "steps_detected_from_the_optimizer": w.steps == steps,
        "history_peak_equals_max_memory_allocated": hist_max == max_alloc,
        "map_at_the_peak": w.focus == "peak" and history is not None
        and history.timeline.allocated_bytes[w.focus_index] == max_alloc,
        "live_tensors_have_stacks_into_this_script": any("gpu_watch_check.py" in g.where for g in w.live),
        "sampled_live_every_0.1s": len(during) >= 0.8 * loop_s / 0.1 and bool(len(gaps)) and float(gaps.max()) < 0.5,
        "sampler_ran_without_error": w.error is None,
    }  # fmt: skip
    if views is None:
        out["checks"]["views_updated_while_running"] = w.view.pushes >= 0.8 * loop_s / 0.2
        out["checks"]["viewer_opened_at_the_peak"] = w.view.viewer is not None and w.view.viewer.index == w.focus_index


def part_overhead(out: dict) -> None:
    import torch

    import memviz

    conditions = {"plain": None, "watch": False, "watch+history": True}
    # blocks of about a second (ten sampler ticks or more), timed once the watch runs: its start (a thread, the
    # history's switch-on) is not a step's cost; the overhead is the median over rounds of each round's
    # watched / plain ratio (ABBA order), which drift and the machine's noise between rounds do not bias
    for name, build, steps, rounds in (("gpu_bound", gpu_bound, 40, 8), ("launch_bound", launch_bound, 400, 10)):
        model, optimizer, x = build()

        def step(model=model, optimizer=optimizer, x=x) -> None:
            train_step(model, optimizer, x)
            memviz.step()

        for _ in range(10):
            step()
        times: dict[str, list[float]] = {c: [] for c in conditions}
        cpu_per_tick: list[float] = []
        order = list(conditions)
        for r in range(rounds):
            for cond in order if r % 2 == 0 else order[::-1]:
                history = conditions[cond]
                if history is None:
                    times[cond].append(blocks_timed(step, steps))
                    continue
                with memviz.watch(interval_s=0.1, history=history, show=False) as w:
                    blocks_timed(step, 10)
                    times[cond].append(blocks_timed(step, steps))
                cpu_per_tick.append(w.sampler_cpu_s / max(1, w._sampler.ticks))
        medians = {c: statistics.median(v) for c, v in times.items()}
        ratios = {c: [t / p for t, p in zip(times[c], times["plain"], strict=True)] for c in conditions if c != "plain"}
        out[name] = {
            "ms_per_step": {c: [1e3 * v for v in vs] for c, vs in times.items()},
            "median_ms": {c: 1e3 * m for c, m in medians.items()},
            "overhead": {c: statistics.median(r) - 1 for c, r in ratios.items()},
            "overhead_of_medians": {c: medians[c] / medians["plain"] - 1 for c in conditions if c != "plain"},
            "plain_spread": (max(times["plain"]) - min(times["plain"])) / medians["plain"],
            "sampler_cpu_per_tick_us": 1e6 * statistics.median(cpu_per_tick),
        }
        del model, optimizer, x
        gc.collect()
        torch.cuda.empty_cache()
    from memviz.watching.sources import CudaSource

    source = CudaSource()
    for name, read in (("read_us", source.read), ("driver_used_us", source.driver_used),
                       ("torch_memory_stats_us", torch.cuda.memory_stats)):  # fmt: skip
        t = time.perf_counter()
        for _ in range(1000):
            read()
        out[name] = (time.perf_counter() - t) / 1000 * 1e6
    out["checks"] = {
        "gpu_bound_watch_under_2_percent": out["gpu_bound"]["overhead"]["watch"] < 0.02,
        "gpu_bound_watch_with_history_under_2_percent": out["gpu_bound"]["overhead"]["watch+history"] < 0.02,
        "launch_bound_watch_under_2_percent": out["launch_bound"]["overhead"]["watch"] < 0.02,
    }  # fmt: skip
    out["launch_bound_history_overhead"] = out["launch_bound"]["overhead"]["watch+history"]  # stated, not a check


def part_oom(out: dict) -> None:
    import torch

    import memviz

    cap = 4 * GiB
    torch.cuda.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(0).total_memory)
    model, optimizer = make_model(1024, 4)
    x = torch.randn(4096, 1024, device="cuda")
    train_step(model, optimizer, x)  # the optimizer's state exists from here on
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    views = widgets_available()
    out["views"] = views or "built"
    t = time.perf_counter()
    with memviz.watch(interval_s=0.1, show=views is None) as w:
        leaky_train(model, optimizer, x, 1000)
    out["block_to_views_s"] = time.perf_counter() - t - (w.oom.t_s if w.oom else 0)
    after = torch.cuda.memory_allocated()  # before any gc.collect(): what the cleared frames gave back
    history = w.history
    oom_segments = w._oom_snapshot["segments"] if w._oom_snapshot else []
    live_at_oom_snapshot = sum(b["size"] for s in oom_segments for b in s["blocks"] if b["state"] == "active_allocated")
    focus_allocated = int(history.timeline.allocated_bytes[w.focus_index]) if history is not None else None
    out.update(baseline_allocated=baseline, allocated_after_block=after, oom=w.oom and w.oom.message[:300],
               steps_before_oom=w.steps, focus=w.focus, live_at_oom=[g.line() for g in w.live],
               live_stacks=[list(g.stack) for g in w.live[:3]], history_events=len(history) if history else 0,
               allocated_at_focus=focus_allocated, allocated_in_the_observers_snapshot=live_at_oom_snapshot,
               summary=w.summary(), notes=w.notes)  # fmt: skip
    checks = {
        "oom_ended_the_block_and_was_kept": w.oom is not None and w.oom.ended_block
        and "CUDA out of memory" in w.oom.message,
        "map_at_the_oom_event": w.focus == "oom" and history is not None
        and history.events[w.focus_index]["action"] == "oom",
        "map_state_equals_the_observers_snapshot": focus_allocated == live_at_oom_snapshot,
        "largest_live_made_in_leaky_train": bool(w.live) and any("leaky_train" in f for f in w.live[0].stack),
        "nothing_pinned_after_the_block": after == baseline,
        "end_sample_shows_memory_back": w.end_allocated_bytes == baseline,
    }  # fmt: skip
    if views is None:
        checks["viewer_opened_at_the_oom"] = w.view.viewer is not None and w.view.viewer.index == w.focus_index
    raised = None
    try:
        with memviz.watch(interval_s=0.1, show=False, raise_oom=True):
            leaky_train(model, optimizer, x, 1000)
    except torch.OutOfMemoryError as error:
        raised = torch.cuda.memory_allocated()  # the error is alive here: its frames were cleared all the same
        out["raised"] = str(error)[:120]
    checks["raise_oom_raises_and_pins_nothing"] = raised == baseline
    for _ in range(5):
        train_step(model, optimizer, x)
    torch.cuda.synchronize()
    checks["training_goes_on_after"] = torch.cuda.memory_allocated() == baseline
    out["checks"] = checks


JOB_STEPS = 10_000
JOB_TIMEOUT_S = 45.0  # the job's OOM comes after about 3 s of training under its 3 GiB cap


def part_job(out_dir: Path) -> None:
    """The child of ``follow``: a training script that records its memory, leaks, and dies of an OOM."""
    import torch

    import memviz

    torch.cuda.set_per_process_memory_fraction(3 * GiB / torch.cuda.get_device_properties(0).total_memory)
    model, optimizer = make_model(1024, 2)
    x = torch.randn(2048, 1024, device="cuda")
    train_step(model, optimizer, x)
    with memviz.record(out_dir / "stats.jsonl", interval_s=0.1):
        for _ in range(20):  # a while of healthy steps, then the leak
            train_step(model, optimizer, x)
            memviz.step()
            time.sleep(0.05)
        leaky_job(model, optimizer, x)


def leaky_job(model, optimizer, x) -> None:
    import memviz

    total = 0
    for _ in range(JOB_STEPS):
        total = total + model(x).square().mean()
        memviz.step()
        time.sleep(0.05)


def part_follow(out: dict, out_dir: Path) -> None:
    import memviz

    path = out_dir / "stats.jsonl"
    path.unlink(missing_ok=True)
    w = memviz.watch(path, interval_s=0.1, show=widgets_available() is None)
    child = subprocess.Popen([sys.executable, str(HERE), "--part", "job", "--out", str(out_dir)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    counts = []
    deadline = time.perf_counter() + JOB_TIMEOUT_S
    while child.poll() is None:
        if time.perf_counter() > deadline:  # a job that never runs out of memory must not outlive the check
            child.kill()
            child.wait()
            break
        counts.append(w.samples.n)
        time.sleep(0.5)
    for _ in range(100):
        if w.source.ended:
            break
        time.sleep(0.1)
    w.stop()
    tail = child.stdout.read()[-2000:] if child.stdout else ""
    out.update(child_returncode=child.returncode, child_tail=tail, counts_while_running=counts,
               samples=w.samples.n, steps=w.steps, ooms=[o.message for o in w.ooms], focus=w.focus,
               live_at_oom=[g.line() for g in w.live], summary=w.summary(), error=w.error, notes=w.notes)  # fmt: skip
    grew = sorted(set(counts) - {0})
    out["checks"] = {
        "job_died_of_its_oom": child.returncode != 0 and "OutOfMemoryError" in tail,
        "samples_grew_while_the_job_ran": len(grew) >= 3,
        "oom_line_seen": len(w.ooms) == 1,
        "end_line_seen": w.source.ended,
        "map_at_the_oom_from_the_jobs_snapshot": w.focus == "oom" and w.history is not None
        and w.history.events[w.focus_index]["action"] == "oom",
        "largest_live_made_in_leaky_job": bool(w.live) and any("leaky_job" in f for f in w.live[0].stack),
    }  # fmt: skip


# -- running ------------------------------------------------------------------------------------------


def run_part(name: str, out_dir: Path) -> int:
    out: dict = {"part": name, "error": None}
    t = time.perf_counter()
    try:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("CUDA is not available: this script checks the real GPU path")
        out["torch"], out["device"] = torch.__version__, torch.cuda.get_device_name(0)
        if name == "job":
            part_job(out_dir)
            return 0
        parts = {"peaks": part_peaks, "overhead": part_overhead, "oom": part_oom}
        parts.get(name, lambda o: part_follow(o, out_dir))(out)
    except BaseException as error:
        if name == "job":
            raise
        out["error"] = f"{type(error).__name__}: {error}"
        out["traceback"] = traceback.format_exc()[-4000:]
    finally:
        if name != "job":
            out["seconds"] = time.perf_counter() - t
            (out_dir / f"{name}.json").write_text(json.dumps(out, indent=1, default=str))
    return 1 if out["error"] else 0


def spawn(name: str, out_dir: Path) -> subprocess.Popen:
    log = open(out_dir / f"{name}.log", "w")  # noqa: SIM115 - the child writes it until it exits
    return subprocess.Popen([sys.executable, str(HERE), "--part", name, "--out", str(out_dir)],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON results")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"which parts (default {','.join(PARTS)})")
    parser.add_argument("--part", help=argparse.SUPPRESS)  # one part, in this process (what the runner spawns)
    parser.add_argument("--budget-s", type=float, default=85.0, help="kill what still runs after this (default 85)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.part:
        return run_part(args.part, args.out)
    start = time.perf_counter()
    wanted = [p for p in args.parts.split(",") if p]
    unknown = set(wanted) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}; the parts are {', '.join(PARTS)}")
    stages = [[p] for p in wanted if p in ("peaks", "overhead")] + [[p for p in wanted if p in ("oom", "follow")]]
    codes: dict[str, int | None] = {}
    for stage in (s for s in stages if s):
        running = {name: spawn(name, args.out) for name in stage}
        for name, proc in running.items():
            left = args.budget_s - (time.perf_counter() - start)
            try:
                codes[name] = proc.wait(timeout=max(1.0, left))
            except subprocess.TimeoutExpired:  # the part and its own children (follow's job): its process group
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                codes[name] = None
    summary: dict = {"seconds": time.perf_counter() - start, "parts": {}}
    for name in wanted:
        path = args.out / f"{name}.json"
        result = json.loads(path.read_text()) if path.exists() else {"error": "no result (killed at the budget?)"}
        summary["parts"][name] = {"returncode": codes.get(name), "seconds": result.get("seconds"),
                                  "error": result.get("error"), "checks": result.get("checks", {})}  # fmt: skip
    figures = {}
    with contextlib.suppress(Exception):
        peaks = json.loads((args.out / "peaks.json").read_text())
        figures["peaks"] = {k: peaks[k] for k in ("peak_allocated_bytes", "max_memory_allocated", "peak_reserved_bytes",
                                                  "max_memory_reserved", "missed_by_current_only_bytes",
                                                  "samples_during_loop", "sample_gap_median_s", "median_step_ms",
                                                  "stop_s", "history_events")}  # fmt: skip
    with contextlib.suppress(Exception):
        overhead = json.loads((args.out / "overhead.json").read_text())
        figures["overhead"] = {k: {"median_ms": v["median_ms"], "overhead": v["overhead"]}
                               for k, v in overhead.items() if isinstance(v, dict) and "overhead" in v}  # fmt: skip
        figures["read_us"] = {k: overhead[k] for k in ("read_us", "driver_used_us", "torch_memory_stats_us")}
    summary["figures"] = figures
    summary["all_passed"] = all(p["error"] is None and p["checks"] and all(p["checks"].values())
                                for p in summary["parts"].values())  # fmt: skip
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps(summary, indent=1, default=str))
    return 0 if summary["all_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

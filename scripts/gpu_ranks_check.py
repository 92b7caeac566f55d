"""Per-rank snapshots on the real GPU (issue 26): the torchrun example's ranks on the one GPU, opened in the RankViewer.

    python3 scripts/gpu_ranks_check.py --out DIR [--deadline-s 45]
    python3 scripts/gpu_ranks_check.py --view DIR      # the viewer part alone, on DIR's snapshots (any machine)

Every job runs ``examples/torchrun_snapshots.py`` (2 ranks, an MLP of 4 x 1024 features, batch 64, 3 steps, AdamW),
each job in its own processes, all jobs at once, each killed at ``--deadline-s`` (default 45 s):

- ``ddp-gloo``, ``fsdp2-gloo``: ``torchrun --nproc-per-node 2 ... --strategy S`` on CUDA. Both ranks get cuda:0 (one
  GPU), so ``--backend auto`` takes gloo (NCCL refuses two ranks on one GPU); each rank's snapshot is its own
  process's caching allocator, recorded by torch. FSDP2 needs gloo's ``all_gather_into_tensor`` and
  ``reduce_scatter_tensor`` on CUDA tensors: if this torch lacks them, the job's error is recorded, not hidden.
- ``ddp-fake``, ``fsdp2-fake``: ``RANK=r WORLD_SIZE=2 python ... --backend fake``, the two ranks as two processes at
  once, each alone in torch's fake process group (collectives do nothing; every buffer is real).
- ``ddp-sim``, ``fsdp2-sim``: ``torchrun ... --sim``: the CPU stand-in (gloo on CPU, memviz's simulated H200), beside
  the real runs: ``DIR/results.json["sim_vs_real"]`` gives each rank's peaks both ways.

Then each job that wrote both ranks' snapshots is loaded (``memviz.snapshots.load_ranks``) and opened in
``memviz.widgets.RankViewer`` without a browser: the widget's state is checked (two ranks on one scale, each rank's
segment map at the end holding its final allocated bytes, the table's peaks equal to the traces'), which needs
ipywidgets, plotly and anywidget (``.whl/`` in scripts/gpu-run.sh); without them the viewer part is skipped and
``--view DIR`` runs it later anywhere. Also checked on this machine: ``Lab(device=...)`` (index 0, ``"cuda:0"``, the
current device; an index the machine lacks refused) and the dashboard's GPU picker (hidden with one GPU).

Writes ``DIR/results.json``, ``DIR/summary.txt`` and ``DIR/<job>/`` (``snapshot_rank{0,1}.pickle``, ``log*.txt``).
Expected run time on the H200: about 30-40 s (each rank's torch and CUDA start dominate).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "torchrun_snapshots.py"
JOBS = {  # name -> (strategy, how)
    "ddp-gloo": ("ddp", "torchrun"), "fsdp2-gloo": ("fsdp2", "torchrun"),
    "ddp-fake": ("ddp", "fake"), "fsdp2-fake": ("fsdp2", "fake"),
    "ddp-sim": ("ddp", "sim"), "fsdp2-sim": ("fsdp2", "sim"),
}  # fmt: skip


def run_job(name: str, out: Path, deadline_s: float) -> dict[str, Any]:
    """Run one job; return its return codes, seconds and the tail of its output (all of it in ``log*.txt``)."""
    strategy, how = JOBS[name]
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
           "OMP_NUM_THREADS": "2"}  # fmt: skip
    common = [str(EXAMPLE), "--out", str(folder), "--strategy", strategy]
    if how == "fake":
        alone = [sys.executable, *common, "--backend", "fake"]
        commands = [(alone, {"RANK": str(r), "WORLD_SIZE": "2"}) for r in (0, 1)]
    else:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        commands = [([*torchrun, *common, *(["--sim"] if how == "sim" else [])], {})]
    start = time.monotonic()
    logs = [folder / f"log{i}.txt" for i in range(len(commands))]
    procs = []
    for (cmd, extra), log_path in zip(commands, logs, strict=True):
        with open(log_path, "w") as log_file:  # a file, not a pipe: a rank left behind cannot block the reading
            procs.append(subprocess.Popen(cmd, env={**env, **extra}, stdout=log_file, stderr=subprocess.STDOUT,
                                          cwd=ROOT, start_new_session=True))  # fmt: skip
    codes = []
    for proc in procs:
        codes.append(_wait(proc, deadline_s - (time.monotonic() - start)))
    log = "\n".join(p.read_text(errors="replace") for p in logs)
    lines = [line for line in log.splitlines() if line.startswith("rank ")]
    seconds = time.monotonic() - start
    return {"strategy": strategy, "how": how, "returncodes": codes, "seconds": round(seconds, 1),
            "stopped_at_deadline": seconds >= deadline_s, "rank_lines": lines,
            "tail": log[-1500:] if any(codes) else ""}  # fmt: skip


def _wait(proc: subprocess.Popen, timeout_s: float) -> int:
    """``proc``'s return code; past ``timeout_s``, SIGTERM (torchrun's agent then stops the ranks it started, each in
    a session of its own), and 10 s later SIGKILL to ``proc``'s session; -9 or -15 says it was stopped."""
    try:
        return proc.wait(timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        proc.terminate()
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def read_job(folder: Path) -> dict[str, Any]:
    """Each rank's snapshot as the viewer's data layer reads it (no widgets)."""
    from memviz.snapshots import load_ranks

    job = load_ranks(folder)
    ranks = []
    for r in job:
        tl = r.history.timeline
        ranks.append({"rank": r.rank, "device": r.device, "events": len(r.history), **r.peaks(),
                      "simulated": r.simulated is not None, "compare_final": r.history.compare_final()[:5],
                      "anomalies": r.history.anomalies[:5], "initial_blocks": len(r.history.initial_blocks),
                      "first_time_us": tl.time_us[0] if tl.time_us else None,
                      "last_time_us": tl.time_us[-1] if tl.time_us else None})  # fmt: skip
    return {"scale": job.scale.kind, "positions": job.scale.length, "ranks": ranks}


def view_job(folder: Path) -> dict[str, Any]:
    """Open the job in the RankViewer without a browser and check its state."""
    from memviz.widgets import RankViewer

    start = time.perf_counter()
    viewer = RankViewer(folder)
    opened_s = time.perf_counter() - start
    try:
        viewer.goto(viewer.scale.length // 2)
        middle = list(viewer.indices)
        viewer.goto(-1)
        checks = {"two_ranks": [r.rank for r in viewer.shown] == [0, 1],
                  "at_the_end": viewer.indices == [len(r.history) - 1 for r in viewer.job],
                  "simulated_label": ("simulated" in viewer.header.value) == viewer.job.simulated}  # fmt: skip
        for k, r in enumerate(viewer.job):
            live = sum(viewer.maps[k].bars["live"]["size"])
            checks[f"rank{r.rank}_map_holds_final_allocated"] = live == r.peaks()["final_allocated"]
        return {"opened_s": round(opened_s, 3), "middle_indices": middle, "update_s": round(viewer.last_update_s, 4),
                "texts": list(viewer.texts), "checks": checks, "ok": all(checks.values())}  # fmt: skip
    finally:
        viewer.close()


def lab_device_checks() -> dict[str, Any]:
    """``Lab(device=...)`` and the dashboard's GPU picker on this machine."""
    import torch

    from memviz.errors import InputError
    from memviz.lab import Lab

    out: dict[str, Any] = {"device_count": torch.cuda.device_count()}
    out["index_0"] = Lab("cuda", device=0).describe()
    out["cuda_0"] = Lab("cuda", device="cuda:0").backend.index
    out["current"] = Lab("cuda").backend.index
    for bad in (torch.cuda.device_count(), -1, "cuda:x"):
        try:
            Lab("cuda", device=bad)
            out[f"refused {bad!r}"] = "NOT REFUSED"
        except InputError as error:
            out[f"refused {bad!r}"] = str(error)
    try:
        from memviz.widgets import dashboard

        d = dashboard(Lab("cuda", cap="1 GiB"), live=False)
        out["picker_options"] = [label for label, _ in d.controls.gpu.options]
        out["picker_shown"] = d.controls.gpu.layout.display != "none"
        d.close()
    except ImportError as error:
        out["picker"] = f"skipped: {error}"
    return out


def sim_vs_real(jobs: dict[str, Any]) -> list[dict[str, Any]]:
    """Each rank's peaks recorded on the GPU (gloo, fake) and by the CPU stand-in (sim)."""
    rows = []
    for strategy in ("ddp", "fsdp2"):
        for rank in (0, 1):
            row: dict[str, Any] = {"strategy": strategy, "rank": rank}
            for how in ("gloo", "fake", "sim"):
                ranks = jobs.get(f"{strategy}-{how}", {}).get("snapshots", {}).get("ranks", [])
                for r in (r for r in ranks if r["rank"] == rank):
                    row[f"{how}_peak_allocated"], row[f"{how}_peak_reserved"] = r["peak_allocated"], r["peak_reserved"]
                    row[f"{how}_simulated"] = r["simulated"]  # without CUDA every job is the CPU stand-in
            real = next((row[f"{how}_peak_reserved"] for how in ("gloo", "fake")
                         if f"{how}_peak_reserved" in row and not row[f"{how}_simulated"]), None)
            if real and row.get("sim_peak_reserved"):
                row["sim_reserved_error_pct"] = round(100 * (row["sim_peak_reserved"] - real) / real, 2)
            rows.append(row)
    return rows


def viewer_part(out: Path, results: dict[str, Any]) -> None:
    for name, job in results["jobs"].items():
        folder = out / name
        if not (folder / "snapshot_rank0.pickle").exists() or not (folder / "snapshot_rank1.pickle").exists():
            continue
        try:
            job["snapshots"] = read_job(folder)
        except Exception:
            job["snapshots"] = {"error": traceback.format_exc()[-2000:]}
            continue
        try:
            job["viewer"] = view_job(folder)
        except ImportError as error:
            job["viewer"] = {"skipped": f"{error}: run `python3 scripts/gpu_ranks_check.py --view {out}` where "
                                        "ipywidgets, plotly and anywidget are installed"}
        except Exception:
            job["viewer"] = {"error": traceback.format_exc()[-2000:]}
    results["sim_vs_real"] = sim_vs_real(results["jobs"])


def summary(results: dict[str, Any]) -> str:
    lines = [f"torch {results.get('torch')} on {results.get('device')}; {results.get('seconds')} s"]
    for name, job in results["jobs"].items():
        snaps = job.get("snapshots", {})
        viewer = job.get("viewer", {})
        state = "ok" if viewer.get("ok") else viewer.get("skipped") or ("error" if viewer else "no viewer")
        lines.append(f"{name}: rc={job.get('returncodes')} {job.get('seconds')} s; scale {snaps.get('scale')}; "
                     f"viewer {state}")  # fmt: skip
        for r in snaps.get("ranks", []):
            lines.append(f"  rank {r['rank']} cuda:{r['device']}: {r['events']:,} events, peak allocated "
                         f"{r['peak_allocated']:,} B, peak reserved {r['peak_reserved']:,} B, final allocated "
                         f"{r['final_allocated']:,} B; replay ends at the recorded segments: {not r['compare_final']}")
    for row in results.get("sim_vs_real", []):
        lines.append(f"sim vs real {row}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, help="where the jobs write (required unless --view)")
    p.add_argument("--view", type=Path, help="only open DIR's jobs in the viewer (results.json updated)")
    p.add_argument("--deadline-s", type=float, default=45.0, help="each job's wall-clock limit (default 45)")
    args = p.parse_args(argv)
    if args.view is not None:
        out = args.view
        results = json.loads((out / "results.json").read_text())
        viewer_part(out, results)
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
        (out / "summary.txt").write_text(summary(results))
        print(summary(results), end="")
        return 0
    if args.out is None:
        p.error("--out DIR is required (or --view DIR)")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    import torch

    start = time.monotonic()
    results: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.cuda.is_available(),
                               "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU",
                               "jobs": {}}  # fmt: skip
    names = [n for n in JOBS if torch.cuda.is_available() or JOBS[n][1] != "torchrun"]
    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        futures = {n: pool.submit(run_job, n, out, args.deadline_s) for n in names}
        results["jobs"] = {n: f.result() for n, f in futures.items()}
    if torch.cuda.is_available():
        try:
            results["lab_device"] = lab_device_checks()
        except Exception:
            results["lab_device"] = {"error": traceback.format_exc()[-2000:]}
    viewer_part(out, results)
    results["seconds"] = round(time.monotonic() - start, 1)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "summary.txt").write_text(summary(results))
    print(summary(results), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

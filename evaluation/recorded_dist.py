"""The per-rank predictor against the fake-group recordings of ``evaluation/record_dist.py`` (issue 26).

    python -m evaluation.recorded_dist --blind [--module evaluation.programs.dist] [--only PATTERN] [--out FILE]
    python -m evaluation.recorded_dist [--module evaluation.programs.dist] [--data DIR] [--only PATTERN]

``--blind`` predicts every recorded (run, rank) of the plan's ``RUNS`` (``memviz.predict(..., world_size=N,
rank=R)`` on the H200 preset, the run's cap and allocator config) and writes the figures with the date and the
commit: what docs/predict-blind-dist*.txt keep, made before any recording was seen. Without it, the same predictions
are compared with the recordings in ``--data`` (default ``evaluation/recordings/<plan>/``, as record_dist.py writes
them: ``runs/<run id>-r<rank>.json.gz``), one row per rank, errors (predicted - real) / real, and the targets of
issue 26: peak reserved within 3% median and 5% worst, per rank.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import gzip
import importlib
import json
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GiB = 1 << 30
MiB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent
TARGET_MEDIAN, TARGET_WORST = 0.03, 0.05


@dataclass(frozen=True)
class RankPrediction:
    """One (run, rank) predicted: peaks in bytes, fits, and the error that stopped it ("" when none)."""

    run_id: str
    rank: int
    world_size: int
    fits: bool | None
    allocated_bytes: int
    reserved_bytes: int
    seconds: float
    error: str = ""

    @property
    def id(self) -> str:
        return f"{self.run_id}-r{self.rank}"


def plan(module_name: str, only: str | None = None) -> tuple[Any, list[dict]]:
    """The plan's module and its runs (those matching ``only``'s comma-separated fnmatch patterns)."""
    module = importlib.import_module(module_name)
    runs = list(module.RUNS)
    if only:
        patterns = [p for p in only.split(",") if p]
        runs = [r for r in runs if any(fnmatch.fnmatchcase(r["id"], p) for p in patterns)]
    return module, runs


def predict_rank(module: Any, run: dict, rank: int, device: str = "H200") -> RankPrediction:
    """Predict one recorded (run, rank) as it was recorded (the run's kwargs, cap and allocator config)."""
    import memviz

    fn = module.PROGRAMS[run["program"]]
    cap = None if run["cap_gib"] is None else int(run["cap_gib"] * GiB)
    start = time.perf_counter()
    try:
        p = memviz.predict(fn, device=device, cap=cap, alloc_conf=run["alloc_conf"] or None,
                           world_size=run["world_size"], rank=rank, **run["kwargs"])
    except Exception as e:  # a failure is a result: kept with the figures
        line = traceback.format_exception_only(type(e), e)[-1].strip()
        return RankPrediction(run["id"], rank, run["world_size"], None, 0, 0, time.perf_counter() - start, line[:300])
    return RankPrediction(run["id"], rank, run["world_size"], p.fits, p.peak_allocated_bytes, p.peak_reserved_bytes,
                          time.perf_counter() - start)


def predict_plan(module: Any, runs: list[dict], progress: bool = True) -> list[RankPrediction]:
    """Every recorded rank of ``runs``, in order."""
    out = []
    for run in runs:
        for rank in run["ranks"]:
            row = predict_rank(module, run, rank)
            out.append(row)
            if progress:
                print(f"{row.id}: {_verdict(row)} {row.allocated_bytes / MiB:.1f} / {row.reserved_bytes / MiB:.1f} MiB"
                      f" ({row.seconds:.1f} s){' ' + row.error if row.error else ''}", file=sys.stderr, flush=True)
    return out


def _verdict(row: RankPrediction) -> str:
    return "ERROR" if row.fits is None else ("fits" if row.fits else "OOM")


def _commit() -> str:
    try:
        sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "memviz", "evaluation"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + (" (with uncommitted changes)" if dirty else "")


def blind_table(module_name: str, rows: list[RankPrediction]) -> str:
    """The blind figures as text: a header (date, commit, torch) and one line per (run, rank)."""
    import torch

    lines = [f"# Blind per-rank predictions of {module_name} (issue 26), made before any recording was seen",
             f"# date: {datetime.date.today().isoformat()}; predictor commit: {_commit()}",
             f"# torch {torch.__version__} (no GPU); device preset H200; memviz.predict(..., world_size=N, rank=R)",
             "# columns: run-rank, world size, predicted fits (ERROR: the prediction failed), peak allocated MiB, "
             "peak reserved MiB, peak allocated bytes, peak reserved bytes, seconds, error",
             "# regenerate the comparison once recorded: python -m evaluation.recorded_dist --module " + module_name]
    for r in rows:
        lines.append(f"{r.id}\tws{r.world_size}\t{_verdict(r)}\t{r.allocated_bytes / MiB:.1f}\t"
                     f"{r.reserved_bytes / MiB:.1f}\t{r.allocated_bytes}\t{r.reserved_bytes}\t{r.seconds:.1f}\t"
                     f"{r.error}")
    return "\n".join(lines) + "\n"


# ---- comparison with recordings


def load_record(data_dir: Path, run_id: str, rank: int) -> dict | None:
    """``data_dir/runs/<run id>-r<rank>.json.gz``, or None when that rank was not recorded."""
    path = data_dir / "runs" / f"{run_id}-r{rank}.json.gz"
    if not path.exists():
        return None
    with gzip.open(path, "rt") as f:
        return json.load(f)


def compare(rows: list[RankPrediction], data_dir: Path) -> tuple[str, dict[str, float]]:
    """The Markdown table of predictions against recordings, and the summary (median / worst |error| of peak
    reserved over the ranks both have, fits agreement)."""
    header = ("| run-rank | real fits | predicted | peak allocated MiB (real) | error | peak reserved MiB (real) | "
              "error |\n|---|---|---|---|---|---|---|")
    lines, errors, agree, compared = [header], [], 0, 0
    for r in rows:
        rec = load_record(data_dir, r.run_id, r.rank)
        if rec is None or "peaks" not in rec:
            continue
        compared += 1
        real_alloc, real_res = rec["peaks"]["allocated_bytes"], rec["peaks"]["reserved_bytes"]
        if r.fits is None:
            lines.append(f"| {r.id} | {'fits' if rec['fits'] else 'OOM'} | ERROR | {real_alloc / MiB:.1f} | - | "
                         f"{real_res / MiB:.0f} | - |")
            continue
        e_alloc = (r.allocated_bytes - real_alloc) / real_alloc
        e_res = (r.reserved_bytes - real_res) / real_res
        errors.append(abs(e_res))
        agree += r.fits == rec["fits"]
        lines.append(f"| {r.id} | {'fits' if rec['fits'] else 'OOM'} | {_verdict(r)} | {real_alloc / MiB:.1f} | "
                     f"{e_alloc:+.2%} | {real_res / MiB:.0f} | {e_res:+.2%} |")
    summary = {"ranks_compared": compared, "predicted": len(errors), "fits_agree": agree,
               "median_abs_reserved_error": statistics.median(errors) if errors else float("nan"),
               "worst_abs_reserved_error": max(errors) if errors else float("nan")}
    summary["within_targets"] = bool(errors) and len(errors) == compared and \
        summary["median_abs_reserved_error"] <= TARGET_MEDIAN and summary["worst_abs_reserved_error"] <= TARGET_WORST
    return "\n".join(lines), summary


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module", default="evaluation.programs.dist")
    ap.add_argument("--only", help="comma-separated fnmatch patterns of run ids")
    ap.add_argument("--blind", action="store_true", help="write the blind figures (no recording read)")
    ap.add_argument("--out", type=Path, help="--blind: the file to write (default: stdout)")
    ap.add_argument("--data", type=Path, help="the recordings (default evaluation/recordings/<plan>/)")
    args = ap.parse_args(argv)
    module, runs = plan(args.module, args.only)
    rows = predict_plan(module, runs)
    if args.blind:
        text = blind_table(args.module, rows)
        if args.out:
            args.out.write_text(text)
        else:
            print(text, end="")
        return
    data = args.data or Path(__file__).resolve().parent / "recordings" / args.module.rsplit(".", 1)[-1]
    table, summary = compare(rows, data)
    print(table)
    print()
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

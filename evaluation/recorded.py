"""The predictor against the real H200 runs in ``evaluation/recordings/`` (see its README).

``python -m evaluation.recorded`` predicts every recorded run and every recorded largest batch and
prints the comparison as the Markdown tables of ``docs/predict.md``; ``compare_run`` / ``compare_max_batch``
do one each (the tests use them).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .programs import PROGRAMS, runnable

HELDOUT_PREFIX = "ho-"
"""Ids of held-out runs and searches (programs or sizes the predictor was never fitted on) start so."""

__all__ = ["DATA_DIR", "HELDOUT_PREFIX", "PROGRAMS", "MaxBatchRow", "RunRow", "compare_max_batch", "compare_run",
           "load_max_batch", "load_run", "load_runs", "runnable", "summarize"]

DATA_DIR = Path(__file__).resolve().parent / "recordings"
"""Where the recordings are (``evaluation/recordings``)."""

CLIFF = 0.015
"""Runs within 1.5% of the cliff may miss (the issue's target): a capped run counts as near the cliff when
its real peak reserved is within this fraction of the cap."""


SETS = ("hf", "hf_heldout", "hf_heldout2", "zoo")
"""Recorded sets of :mod:`evaluation.record_programs` (``recordings/<set>/runs/<id>.json.gz``, ``chains.json``);
the first recordings (``recordings/h200/``) are the set ``"h200"``."""


def program_of(entry: dict[str, Any]) -> Any:
    """The program a recorded run or search ran: by its ``module`` where it names one, else from :data:`PROGRAMS`."""
    import importlib

    if entry.get("module"):
        return importlib.import_module(entry["module"]).PROGRAMS[entry["program"]]
    return PROGRAMS[entry["program"]]


def load_set(name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The runs (sorted by id) and the largest-batch searches of a recorded set (:data:`SETS`)."""
    folder = DATA_DIR / name
    runs = [json.loads(gzip.decompress(path.read_bytes())) for path in sorted((folder / "runs").glob("*.json.gz"))]
    chains_file = folder / "chains.json"
    chains = json.loads(chains_file.read_text()) if chains_file.exists() else []
    for c in chains:
        c.setdefault("max_batch", c.get("max_batch"))
    return runs, chains


def load_run(run_id: str, data_dir: Path = DATA_DIR) -> dict[str, Any]:
    """One recorded run by id (``h200/<run_id>.json.gz``)."""
    with gzip.open(data_dir / "h200" / f"{run_id}.json.gz", "rt") as f:
        return json.load(f)


def load_runs(data_dir: Path = DATA_DIR) -> list[dict[str, Any]]:
    """Every recorded run (``h200/<id>.json.gz``) whose program is :func:`runnable` here, sorted by id."""
    runs = (load_run(path.name.removesuffix(".json.gz"), data_dir)
            for path in sorted((data_dir / "h200").glob("*.json.gz")))
    return [run for run in runs if runnable(run["program"])]


def load_max_batch(data_dir: Path = DATA_DIR) -> list[dict[str, Any]]:
    """Every recorded largest-batch search (``h200_max_batch.json``) whose program is :func:`runnable` here."""
    return [s for s in json.loads((data_dir / "h200_max_batch.json").read_text()) if runnable(s["program"])]


@dataclass(frozen=True)
class RunRow:
    """One recorded run and its prediction (bytes; errors are (predicted − real) / real)."""

    run_id: str
    cap_bytes: int
    alloc_conf: str
    real_fits: bool
    predicted_fits: bool
    real_allocated_bytes: int
    predicted_allocated_bytes: int
    real_reserved_bytes: int
    predicted_reserved_bytes: int
    seconds: float

    @property
    def allocated_error(self) -> float:
        return (self.predicted_allocated_bytes - self.real_allocated_bytes) / self.real_allocated_bytes

    @property
    def reserved_error(self) -> float:
        return (self.predicted_reserved_bytes - self.real_reserved_bytes) / self.real_reserved_bytes

    @property
    def capped(self) -> bool:
        """The cap was binding: the run ran out of memory, or its peak came near the cap."""
        return not self.real_fits or self.real_reserved_bytes > (1 - 0.25) * self.cap_bytes

    @property
    def near_cliff(self) -> bool:
        return abs(self.real_reserved_bytes - self.cap_bytes) <= CLIFF * self.cap_bytes


def fresh_process_state() -> None:
    """What a fresh process would not have: every recording ran alone in its process, and accelerate keeps its
    ``AcceleratorState`` (mixed precision included) for the process, refusing another."""
    import sys

    state = sys.modules.get("accelerate.state")
    if state is not None:
        state.AcceleratorState._reset_state(reset_partial_state=True)


def compare_run(run: dict[str, Any], device: str = "H200") -> RunRow:
    """Predict one recorded run as it was run (program, keyword arguments, config, cap), as in a fresh process."""
    fresh_process_state()
    from memviz.predictor import predict

    start = time.perf_counter()
    p = predict(program_of(run), device=device, cap=run["cap_bytes"], alloc_conf=run["alloc_conf"] or None,
                **run["kwargs"])
    peaks = run["peaks"]
    return RunRow(run["id"], run["cap_bytes"], run["alloc_conf"], run["fits"], p.fits, peaks["allocated_bytes"],
                  p.peak_allocated_bytes, peaks["reserved_bytes"], p.peak_reserved_bytes,
                  time.perf_counter() - start)


@dataclass(frozen=True)
class MaxBatchRow:
    """One recorded largest-batch search and the predicted largest batch."""

    search_id: str
    real: int
    predicted: int
    seconds: float

    @property
    def error(self) -> float:
        return (self.predicted - self.real) / self.real


def compare_max_batch(search: dict[str, Any], device: str = "H200") -> MaxBatchRow:
    """Predict one recorded search's largest batch (bisection with :func:`memviz.max_batch`)."""
    from memviz.predictor import max_batch

    program, kwargs = program_of(search), search["kwargs"]
    start = time.perf_counter()
    best = max_batch(lambda b: program(batch=b, **kwargs), device=device, cap=search["cap_bytes"],
                     alloc_conf=search["alloc_conf"], lo=max(1, search["max_batch"] // 4))
    return MaxBatchRow(search["id"], search["max_batch"], best, time.perf_counter() - start)


def _pct(x: float) -> str:
    return f"{x * 100:+.2f}%"


def summarize(rows: list[RunRow], searches: list[MaxBatchRow]) -> dict[str, float]:
    """The figures the targets are stated in."""
    abs_res = [abs(r.reserved_error) for r in rows]
    abs_all = [abs(r.allocated_error) for r in rows]
    capped = [r for r in rows if r.capped]
    decisive = [r for r in capped if not r.near_cliff]
    out = {
        "runs": len(rows),
        "reserved_median": statistics.median(abs_res), "reserved_worst": max(abs_res),
        "allocated_median": statistics.median(abs_all), "allocated_worst": max(abs_all),
        "capped_runs": len(capped),
        "fits_hit_rate": sum(r.real_fits == r.predicted_fits for r in capped) / max(1, len(capped)),
        "fits_hit_rate_off_cliff": sum(r.real_fits == r.predicted_fits for r in decisive) / max(1, len(decisive)),
    }
    if searches:
        errors = [abs(s.error) for s in searches]
        out.update(max_batch_median=statistics.median(errors), max_batch_worst=max(errors))
    return out


def markdown(rows: list[RunRow], searches: list[MaxBatchRow]) -> str:
    """The tables of docs/predict.md: every run and search, then the figures per standing (fitted, blind,
    refined-after: :mod:`evaluation.standing`)."""
    lines = ["| run | cap | config | real fits | predicted | peak allocated MiB (real) | error | "
             "peak reserved MiB (real) | error | seconds |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cap = f"{r.cap_bytes >> 30} GiB" if r.cap_bytes % 2**30 == 0 else f"{r.cap_bytes / 2**20:.0f} MiB"
        lines.append(f"| {r.run_id} | {cap} | {r.alloc_conf or 'default'} | "
                     f"{'fits' if r.real_fits else 'OOM'} | {'fits' if r.predicted_fits else 'OOM'} | "
                     f"{r.real_allocated_bytes / 2**20:.1f} | {_pct(r.allocated_error)} | "
                     f"{r.real_reserved_bytes / 2**20:.0f} | {_pct(r.reserved_error)} | {r.seconds:.1f} |")
    if searches:
        lines += ["", "| search | real largest batch | predicted | error | seconds |", "|---|---|---|---|---|"]
        for s in searches:
            lines.append(f"| {s.search_id} | {s.real} | {s.predicted} | {_pct(s.error)} | {s.seconds:.0f} |")
    standing = _standings()
    groups = {"all": (rows, searches)}
    for name in ("fitted", "blind", "refined-after"):
        groups[name] = ([r for r in rows if standing.get(r.run_id) == name],
                        [s for s in searches if standing.get(s.search_id) == name])
    groups = {k: v for k, v in groups.items() if v[0]}
    figures = {k: summarize(*v) for k, v in groups.items()}
    lines += ["", "| figure | " + " | ".join(figures) + " |", "|---" * (len(figures) + 1) + "|"]
    for key in figures["all"]:
        cells = [figures[g].get(key) for g in figures]
        lines.append(f"| {key} | " + " | ".join("" if v is None else f"{v * 100:.2f}%" if isinstance(v, float)
                                               else str(v) for v in cells) + " |")
    return "\n".join(lines)


def _held(run_id: str) -> bool:
    return run_id.startswith(HELDOUT_PREFIX)


def _standings() -> dict[str, str]:
    """Run or search id → fitted / blind / refined-after (:mod:`evaluation.standing`)."""
    from .standing import load

    return load()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="run ids containing any of these")
    parser.add_argument("--no-max-batch", action="store_true", help="skip the largest-batch searches")
    parser.add_argument("--heldout", choices=("with", "only", "without"), default="with",
                        help="the held-out runs (ids starting 'ho-') too, only, or not")
    args = parser.parse_args(argv)
    def wanted(run_id: str) -> bool:
        if args.heldout != "with" and _held(run_id) != (args.heldout == "only"):
            return False
        return not args.only or any(o in run_id for o in args.only)

    runs = [r for r in load_runs() if wanted(r["id"])]
    rows = []
    for run in runs:
        rows.append(compare_run(run))
        r = rows[-1]
        print(f"{r.run_id}: reserved {_pct(r.reserved_error)}, allocated {_pct(r.allocated_error)}, "
              f"fits {r.real_fits}/{r.predicted_fits}", flush=True)
    searches = []
    if not args.no_max_batch:
        for s in load_max_batch():
            if wanted(s["id"]):
                searches.append(compare_max_batch(s))
                print(f"{s['id']}: {searches[-1].real} real, {searches[-1].predicted} predicted", flush=True)
    print()
    print(markdown(rows, searches))


if __name__ == "__main__":
    main()

"""The predictor against a recorded set of :mod:`evaluation.record_programs` (the HF sets, the zoo), beside its blind
prediction.

    python -m evaluation.recorded_sets hf [--only ID ...] [--no-max-batch]

Predicts every run of ``evaluation/recordings/<set>/runs/`` as it was run (program, keyword arguments, config,
cap; no cap: the whole H200) and every largest-batch search of ``chains.json``, and prints per run the recorded
peaks, the error of the blind prediction (``docs/predict-blind-<set>.txt``, made before the recordings were
read) and of today's, then the figures per program and per standing: *blind* (today's prediction is the blind
one), *refined-after* (it changed after the recordings were read: no longer a check of generalization) — and
for a development set, whose misses rules may be read from, *fitted*.
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path
from typing import Any

from .recorded import _pct, compare_max_batch, compare_run, load_set

__all__ = ["blind_lines", "main"]

DOCS = Path(__file__).resolve().parents[1] / "docs"
DEVELOPMENT = {"hf": True, "hf_heldout": False, "hf_heldout2": False, "zoo": True}
"""Whether a set is a development set (its misses may shape rules) or held out."""

_RUN = re.compile(r"^(\S+): fits (\w+), allocated (\d+) B, reserved (\d+) B")
_SEARCH = re.compile(r"^(\S+): largest batch (\d+)")
_FAILED = re.compile(r"^(\S+): cannot predict: (.*)")


def blind_lines(name: str) -> dict[str, Any]:
    """Run id → ``(fits, allocated, reserved)``, search id → largest batch, or id → ``"failed: ..."``."""
    path = DOCS / f"predict-blind-{name.replace('_', '-')}.txt"
    out: dict[str, Any] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        if m := _RUN.match(line):
            out[m.group(1)] = (m.group(2) == "True", int(m.group(3)), int(m.group(4)))
        elif m := _SEARCH.match(line):
            out[m.group(1)] = int(m.group(2))
        elif m := _FAILED.match(line):
            out.setdefault(m.group(1), f"failed: {m.group(2)[:80]}")
    return out


def _error(predicted: int, real: int) -> float:
    return (predicted - real) / real


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("set", help="hf, hf_heldout, hf_heldout2 or zoo")
    parser.add_argument("--only", nargs="*", default=None, help="ids containing any of these")
    parser.add_argument("--no-max-batch", action="store_true")
    args = parser.parse_args(argv)
    if args.set not in DEVELOPMENT:
        parser.error(f"unknown set {args.set!r}: {', '.join(DEVELOPMENT)}")
    runs, chains = load_set(args.set)
    if not runs and not chains:
        print(f"no recordings of {args.set} yet (evaluation/recordings/{args.set}/runs/ is empty or missing): record "
              "it on a GPU first (evaluation/README-hf.md)")
        return
    blind = blind_lines(args.set)

    def wanted(i: str) -> bool:
        return not args.only or any(o in i for o in args.only)

    plan_ids = set(blind)
    rows = []
    print("| run | program | cap | real fits | blind | today | peak reserved MiB (real) | blind error | error | "
          "allocated error | standing |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        if not wanted(run["id"]) or (plan_ids and run["id"] not in plan_ids and "-b" in run["id"].rsplit("-", 1)[-1]):
            continue  # a search's try: counted in its search
        row = compare_run(run)
        b = blind.get(run["id"])
        if isinstance(b, tuple):
            blind_fits, blind_error = b[0], _error(b[2], row.real_reserved_bytes)
            same = b == (row.predicted_fits, row.predicted_allocated_bytes, row.predicted_reserved_bytes)
            standing = "blind" if same else ("fitted" if DEVELOPMENT[args.set] else "refined-after")
        else:
            blind_fits, blind_error, standing = None, None, "no blind figure" if b is None else str(b)
        rows.append((run, row, blind_fits, blind_error, standing))
        cap = "none" if row.cap_bytes is None else f"{row.cap_bytes / 2**30:.2f} GiB"
        print(f"| {row.run_id} | {run['program']} | {cap} | {'fits' if row.real_fits else 'OOM'} | "
              f"{'' if blind_fits is None else 'fits' if blind_fits else 'OOM'} | "
              f"{'fits' if row.predicted_fits else 'OOM'} | {row.real_reserved_bytes / 2**20:.0f} | "
              f"{'' if blind_error is None else _pct(blind_error)} | {_pct(row.reserved_error)} | "
              f"{_pct(row.allocated_error)} | {standing} |", flush=True)
    searches = []
    if not args.no_max_batch:
        print("\n| search | real largest batch | blind | today |\n|---|---|---|---|")
        for search in chains:
            if wanted(search["id"]) and search.get("max_batch"):
                s = compare_max_batch(search)
                searches.append((s, blind.get(search["id"])))
                print(f"| {s.search_id} | {s.real} | {blind.get(search['id'], '')} | {s.predicted} |", flush=True)
    print("\n| group | runs | blind: reserved median | worst | today: median | worst | fits/OOM right (capped) |")
    print("|---|---|---|---|---|---|---|")
    groups: dict[str, list] = {"all": rows}
    for r in rows:
        groups.setdefault(f"program {r[0]['program']}", []).append(r)
        groups.setdefault(f"standing {r[4]}", []).append(r)
    for name, group in groups.items():
        blind_errors = [abs(r[3]) for r in group if r[3] is not None]
        today = [abs(r[1].reserved_error) for r in group]
        capped = [r for r in group if r[1].cap_bytes is not None]
        right = sum(r[1].predicted_fits == r[1].real_fits for r in capped)
        print(f"| {name} | {len(group)} | "
              + (f"{statistics.median(blind_errors) * 100:.2f}% | {max(blind_errors) * 100:.2f}% | "
                 if blind_errors else " | | ")
              + f"{statistics.median(today) * 100:.2f}% | {max(today) * 100:.2f}% | {right}/{len(capped)} |")
    if searches:
        errors = [abs(s.error) for s, _ in searches]
        print(f"\nlargest batch: median error {statistics.median(errors) * 100:.2f}%, worst {max(errors) * 100:.2f}%")


if __name__ == "__main__":
    main()

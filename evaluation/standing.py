"""Which recorded runs still say how the predictor does on code it has not seen.

Every recorded run has one standing:

- ``fitted``: a run of :mod:`memviz.examples`, the programs the rules were developed against;
- ``blind``: a held-out run (id ``ho-...``) whose prediction today is the one made blind, before anything was
  changed after seeing the set (``docs/predict-blind-*.txt``);
- ``refined-after``: a held-out run whose prediction changed since, because a rule was added or refined after the
  held-out misses were seen. It is no longer held out: its error says how well the rules fit it, not how they
  generalize.

``python -m evaluation.standing`` compares today's predictions with the blind files and writes
``evaluation/recordings/standing.json`` (the torchvision set only where torchvision is installed; its entries are
kept otherwise). The tests and docs/predict.md name runs by it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .recorded import DATA_DIR, HELDOUT_PREFIX, RunRow, compare_max_batch, compare_run, load_max_batch, load_runs

__all__ = ["STANDINGS", "blind_figures", "load", "standing_of"]

STANDINGS = ("fitted", "blind", "refined-after")
DOCS = Path(__file__).resolve().parents[1] / "docs"
BLIND_FILES = ("predict-blind-heldout1.txt", "predict-blind-heldout2.txt", "predict-blind-torchvision.txt")
STANDING_FILE = DATA_DIR / "standing.json"

_RUN_LINE = re.compile(r"^(ho-[\w.-]+): (reserved [+-][\d.]+%, allocated [+-][\d.]+%, fits \w+/\w+)$")
_SEARCH_LINE = re.compile(r"^(ho-[\w.-]+): (\d+ real, \d+ predicted)$")


def blind_figures() -> dict[str, str]:
    """Run or search id → the figures its blind prediction printed (``reserved +0.12%, allocated ...``)."""
    out: dict[str, str] = {}
    for name in BLIND_FILES:
        for line in (DOCS / name).read_text().splitlines():
            match = _RUN_LINE.match(line) or _SEARCH_LINE.match(line)
            if match:
                out[match.group(1)] = match.group(2)
    return out


def _pct(x: float) -> str:
    return f"{x * 100:+.2f}%"


def run_figures(row: RunRow) -> str:
    """The figures of one run's prediction, as the blind files print them."""
    return f"reserved {_pct(row.reserved_error)}, allocated {_pct(row.allocated_error)}, " \
           f"fits {row.real_fits}/{row.predicted_fits}"


def standing_of(run_id: str, figures: str, blind: dict[str, str]) -> str:
    """The standing of a run or search whose prediction today prints ``figures``."""
    if not run_id.startswith(HELDOUT_PREFIX):
        return "fitted"
    if run_id not in blind:
        raise KeyError(f"{run_id}: a held-out run with no blind figures (docs/predict-blind-*.txt)")
    return "blind" if blind[run_id] == figures else "refined-after"


def load() -> dict[str, str]:
    """Run or search id → standing, as ``evaluation/recordings/standing.json`` records it."""
    return json.loads(STANDING_FILE.read_text())


def main() -> None:
    blind = blind_figures()
    standings = load() if STANDING_FILE.exists() else {}
    for run in load_runs():
        row = compare_run(run)
        standings[row.run_id] = standing_of(row.run_id, run_figures(row), blind)
        print(f"{row.run_id}: {standings[row.run_id]}", flush=True)
    for search in load_max_batch():
        row = compare_max_batch(search)
        standings[row.search_id] = standing_of(row.search_id, f"{row.real} real, {row.predicted} predicted", blind)
        print(f"{row.search_id}: {standings[row.search_id]}", flush=True)
    STANDING_FILE.write_text(json.dumps(dict(sorted(standings.items())), indent=0) + "\n")
    counts = {s: sum(v == s for v in standings.values()) for s in STANDINGS}
    print(counts)


if __name__ == "__main__":
    main()

"""Benchmark: a job's per-rank snapshots on one event scale, and the RankViewer's slider.

Each rank is the real 60-step H200 training run of tests/data/snapshots/workload (63,008 events), its clock
shifted by ``rank`` ms so that the ranks' events interleave as concurrent ranks' do. Timed, with ``--repeats``:

- ``load_ranks``: load and rebuild every rank's trace and merge them onto the time scale (from dicts already
  unpickled, so the figure is the rebuild and the merge, not the file reads);
- ``open``: ``RankViewer`` on the loaded ranks (figures built, the first position drawn);
- ``move``: one slider move to a random position (every drawn rank's state rebuilt and its map redrawn): the
  median and the worst of ``--moves`` moves.

Run: ``.venv/bin/python benchmarks/bench_ranks.py [--ranks 2,4,8] [--repeats 3] [--moves 40]``. Prints seconds.
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import time
from pathlib import Path

from memviz.snapshots import load_ranks, load_snapshot
from memviz.widgets import RankViewer

WORKLOAD = Path(__file__).resolve().parents[1] / "tests" / "data" / "snapshots" / "workload" / "workload_default.pickle"


def ranks_of(snapshot: dict, n: int) -> list[dict]:
    """``n`` copies of ``snapshot``, rank ``r``'s clock ``r`` ms later."""
    out = []
    for r in range(n):
        snap = copy.deepcopy(snapshot)
        for e in snap["device_traces"][0]:
            e["time_us"] += 1000 * r
        out.append(snap)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="2,4,8", help="rank counts to time (default 2,4,8)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--moves", type=int, default=40)
    args = p.parse_args()
    base = load_snapshot(WORKLOAD)
    print(f"load average {os.getloadavg()[0]:.2f}; {len(base['device_traces'][0]):,} events a rank")
    rng = random.Random(0)
    for n in map(int, args.ranks.split(",")):
        loads, opens, moves = [], [], []
        for _ in range(args.repeats):
            snaps = ranks_of(base, n)
            t = time.perf_counter()
            job = load_ranks(snaps, progress=False)
            loads.append(time.perf_counter() - t)
            t = time.perf_counter()
            viewer = RankViewer(job)
            opens.append(time.perf_counter() - t)
            for _ in range(args.moves):
                viewer.goto(rng.randrange(viewer.scale.length))
                moves.append(viewer.last_update_s)
            viewer.close()
        print(f"{n} ranks ({job.scale.length:,} positions): load_ranks median {statistics.median(loads):.2f} s, "
              f"open {statistics.median(opens):.2f} s, slider move median {1000 * statistics.median(moves):.1f} ms, "
              f"worst {1000 * max(moves):.1f} ms")


if __name__ == "__main__":
    main()

"""Replay benchmark for memviz.sim: median microseconds per op.

usage: python3 benchmarks/bench_sim.py [--repeats N] [--synthetic-ops N] [--cpu-time]

Times, without any comparison, the replay (:func:`memviz.sim.replay`, the engine every what-if uses) of
every golden ``random-*`` trace in tests/data/golden and of a seeded synthetic trace (default 200,000
ops) through ``CachingAllocator`` with all stats
and history recording on. Each replay starts from a fresh allocator (built outside the timing);
one untimed warm-up replay precedes the timed ones. Prints the median and the minimum of
``--repeats`` runs (default 7) for each, then a one-line summary. ``--cpu-time`` times with
``time.process_time`` instead of the wall clock: steadier on a machine shared with other work.
For reference: the real allocator through PyTorch costs 2.4 µs/op on an H200.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memviz.sim import CachingAllocator, Op, replay
from memviz.sim.constants import MiB
from memviz.sim.replay import EMPTY_CACHE, FREE, MALLOC

GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "data" / "golden"


def synthetic_ops(n: int, seed: int = 0) -> list[Op]:
    """Return n ops: mostly small/medium mallocs and frees, some empty_cache."""
    rng = random.Random(seed)
    ops: list[Op] = []
    live: list[int] = []
    next_id = 0
    while len(ops) < n:
        r = rng.random()
        if r < 0.5 or not live:
            size = rng.choice([rng.randint(1, 65536), rng.randint(65536, 4 * MiB),
                               rng.randint(4 * MiB, 64 * MiB)])
            ops.append(Op(MALLOC, next_id, size))
            live.append(next_id)
            next_id += 1
        elif r < 0.999:
            ops.append(Op(FREE, live.pop(rng.randrange(len(live)))))
        else:
            ops.append(Op(EMPTY_CACHE))
    return ops


def golden_ops(trace: dict) -> list[Op]:
    """The ops of a golden trace, its snapshot checks left out."""
    kinds = {"alloc": MALLOC, "free": FREE, "empty_cache": EMPTY_CACHE}
    return [Op(kinds[op["op"]], op.get("id"), op.get("size", 0)) for op in trace["ops"] if op["op"] != "snapshot"]


def time_replay(make: Callable[[], CachingAllocator], ops: list[Op], clock: Callable[[], float] = time.perf_counter
                ) -> float:
    """Replay ops on a fresh allocator (made outside the timing) with :func:`memviz.sim.replay`; return s/op."""
    sim = make()
    t0 = clock()
    replay(ops, sim)
    return (clock() - t0) / max(1, len(ops))


def timings_us(make: Callable[[], CachingAllocator], ops: list[Op], repeats: int,
               clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """Return (median, min) µs per op over ``repeats`` replays, after one untimed warm-up."""
    time_replay(make, ops, clock)
    times = [time_replay(make, ops, clock) * 1e6 for _ in range(repeats)]
    return statistics.median(times), min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--synthetic-ops", type=int, default=200_000)
    parser.add_argument("--cpu-time", action="store_true", help="time.process_time instead of the wall clock")
    args = parser.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    medians: list[float] = []

    def report(config: str, trace: str, n_ops: int, make: Callable[[], CachingAllocator], ops: list[Op]) -> None:
        median, best = timings_us(make, ops, args.repeats, clock)
        medians.append(median)
        print(f"{config:>14} {trace:<10} {n_ops:>7} ops  median {median:5.2f}  min {best:5.2f} us/op")

    print(f"median and min of {args.repeats} replays, {'CPU' if args.cpu_time else 'wall'} time")
    for path in sorted(GOLDEN.glob("*.json.gz")):
        with gzip.open(path, "rt") as f:
            data = json.load(f)
        meta = data["meta"]

        def make(meta: dict = meta) -> CachingAllocator:
            return CachingAllocator(meta["total_memory"], memory_fraction=meta["fraction"],
                                    alloc_conf=meta["alloc_conf"])

        for trace in data["traces"]:
            if not trace["name"].startswith("random") or "rerun" in trace["name"]:
                continue
            ops = golden_ops(trace)
            report(meta["config"], trace["name"], len(ops), make, ops)
    ops = synthetic_ops(args.synthetic_ops)
    for conf in ("", "expandable_segments:True"):
        def make(conf: str = conf) -> CachingAllocator:
            return CachingAllocator(80 << 30, alloc_conf=conf)

        report("synthetic", "expandable" if conf else "default", len(ops), make, ops)
    print(f"summary: {len(medians)} medians, worst {max(medians):.2f} us/op, "
          f"median of medians {statistics.median(medians):.2f} us/op; "
          f"{sum(m <= 2.4 for m in medians)}/{len(medians)} <= 2.4 us/op (torch on an H200), "
          f"{sum(m <= 4.0 for m in medians)}/{len(medians)} <= 4 us/op")


if __name__ == "__main__":
    main()

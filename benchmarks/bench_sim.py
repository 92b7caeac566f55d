"""Replay benchmark for memviz.sim: median microseconds per op.

usage: python3 benchmarks/bench_sim.py [--repeats N] [--synthetic-ops N] [--cpu-time] [--paths]

Times, without any comparison, the replay (:func:`memviz.sim.replay`, the engine every what-if uses) of
every golden ``random-*`` trace in tests/data/golden and of a seeded synthetic trace (default 200,000
ops) through ``CachingAllocator`` with all stats
and history recording on. Each replay starts from a fresh allocator (built outside the timing);
one untimed warm-up replay precedes the timed ones. Prints the median and the minimum of
``--repeats`` runs (default 7) for each, then a one-line summary, and the machine's load average
(1 minute) before and after. ``--cpu-time`` times with ``time.process_time`` instead of the wall clock:
steadier on a machine shared with other work. ``--paths`` times the allocator's two ways of running
``malloc`` / ``free`` (``fast_paths=True``, the default, and ``fast_paths=False``, the methods that read
beside the C++; see :mod:`memviz.sim._fastpath`), their replays alternating, and prints both with the
readable one's cost relative to the fast one. For reference: the real allocator through PyTorch costs
2.4 µs/op on an H200.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
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


def timings_us(makers: list[Callable[[], CachingAllocator]], ops: list[Op], repeats: int,
               clock: Callable[[], float] = time.perf_counter) -> list[tuple[float, float]]:
    """Return (median, min) µs per op over ``repeats`` replays for each allocator maker, after one untimed
    warm-up each; with several makers their replays alternate, so that a change of the machine's load
    falls on all of them alike."""
    for make in makers:
        time_replay(make, ops, clock)
    times: list[list[float]] = [[] for _ in makers]
    for _ in range(repeats):
        for make, out in zip(makers, times, strict=True):
            out.append(time_replay(make, ops, clock) * 1e6)
    return [(statistics.median(t), min(t)) for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--synthetic-ops", type=int, default=200_000)
    parser.add_argument("--cpu-time", action="store_true", help="time.process_time instead of the wall clock")
    parser.add_argument("--paths", action="store_true",
                        help="also time fast_paths=False (the readable methods), alternating with the default")
    args = parser.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    fast_paths = (True, False) if args.paths else (True,)
    medians: list[list[float]] = [[] for _ in fast_paths]

    def report(config: str, trace: str, n_ops: int, make: Callable[..., CachingAllocator], ops: list[Op]) -> None:
        makers = [lambda fast=fast: make(fast_paths=fast) for fast in fast_paths]
        timings = timings_us(makers, ops, args.repeats, clock)
        line = f"{config:>14} {trace:<10} {n_ops:>7} ops"
        for out, (median, best) in zip(medians, timings, strict=True):
            out.append(median)
            line += f"  median {median:5.2f}  min {best:5.2f} us/op"
        if args.paths:
            line += f"  readable/fast {timings[1][0] / timings[0][0]:.2f}"
        print(line)

    print(f"median and min of {args.repeats} replays, {'CPU' if args.cpu_time else 'wall'} time"
          + (", fast paths then readable paths, alternating" if args.paths else "")
          + f"; load average {os.getloadavg()[0]:.2f} (1 min, {os.cpu_count()} CPUs)")
    for path in sorted(GOLDEN.glob("*.json.gz")):
        with gzip.open(path, "rt") as f:
            data = json.load(f)
        meta = data["meta"]

        def make(meta: dict = meta, **kwargs: bool) -> CachingAllocator:
            return CachingAllocator(meta["total_memory"], memory_fraction=meta["fraction"],
                                    alloc_conf=meta["alloc_conf"], **kwargs)

        for trace in data["traces"]:
            if not trace["name"].startswith("random") or "rerun" in trace["name"]:
                continue
            ops = golden_ops(trace)
            report(meta["config"], trace["name"], len(ops), make, ops)
    ops = synthetic_ops(args.synthetic_ops)
    for conf in ("", "expandable_segments:True"):
        def make(conf: str = conf, **kwargs: bool) -> CachingAllocator:
            return CachingAllocator(80 << 30, alloc_conf=conf, **kwargs)

        report("synthetic", "expandable" if conf else "default", len(ops), make, ops)
    for fast, ms in zip(fast_paths, medians, strict=True):
        print(f"summary{'' if fast else ' (readable paths)'}: {len(ms)} medians, worst {max(ms):.2f} us/op, "
              f"median of medians {statistics.median(ms):.2f} us/op; "
              f"{sum(m <= 2.4 for m in ms)}/{len(ms)} <= 2.4 us/op (torch on an H200), "
              f"{sum(m <= 4.0 for m in ms)}/{len(ms)} <= 4 us/op")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()

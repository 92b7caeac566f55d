"""Replay benchmark for memviz.sim: median microseconds per op.

usage: python3 benchmarks/bench_sim.py [--repeats N] [--synthetic-ops N]

Times, without any comparison, the replay of every golden ``random-*`` trace in tests/data/golden
and of a seeded synthetic trace (default 200,000 ops) through ``CachingAllocator`` with all stats
and history recording on. Prints the median of ``--repeats`` runs (default 5) for each.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memviz.sim import CachingAllocator, OutOfMemoryError

GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "data" / "golden"
MiB = 1 << 20


def synthetic_ops(n: int, seed: int = 0) -> list[tuple[str, int, int]]:
    """Return n ops (kind, id, size): mostly small/medium allocs and frees, some empty_cache."""
    rng = random.Random(seed)
    ops: list[tuple[str, int, int]] = []
    live: list[int] = []
    next_id = 0
    while len(ops) < n:
        r = rng.random()
        if r < 0.5 or not live:
            size = rng.choice([rng.randint(1, 65536), rng.randint(65536, 4 * MiB),
                               rng.randint(4 * MiB, 64 * MiB)])
            ops.append(("alloc", next_id, size))
            live.append(next_id)
            next_id += 1
        elif r < 0.999:
            ops.append(("free", live.pop(rng.randrange(len(live))), 0))
        else:
            ops.append(("empty_cache", 0, 0))
    return ops


def replay(make: callable, ops: list[tuple[str, int, int]]) -> float:
    """Replay ops on a fresh allocator; return seconds per op."""
    sim = make()
    live: dict[int, int] = {}
    malloc, free, empty_cache = sim.malloc, sim.free, sim.empty_cache
    t0 = time.perf_counter()
    for kind, ident, size in ops:
        if kind == "alloc":
            try:  # noqa: SIM105 - try/except is cheaper than contextlib.suppress
                live[ident] = malloc(size)
            except OutOfMemoryError:
                pass
        elif kind == "free":
            addr = live.pop(ident, None)
            if addr is not None:
                free(addr)
        else:
            empty_cache()
    return (time.perf_counter() - t0) / max(1, len(ops))


def median_us(make: callable, ops: list[tuple[str, int, int]], repeats: int) -> float:
    return statistics.median(replay(make, ops) for _ in range(repeats)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--synthetic-ops", type=int, default=200_000)
    args = parser.parse_args()
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
            ops = [(op["op"], op.get("id", 0), op.get("size", 0))
                   for op in trace["ops"] if op["op"] != "snapshot"]
            us = median_us(make, ops, args.repeats)
            print(f"{meta['config']:>14} {trace['name']:<10} {len(ops):>7} ops  {us:6.2f} us/op (median of "
                  f"{args.repeats})")
    ops = synthetic_ops(args.synthetic_ops)
    for conf in ("", "expandable_segments:True"):
        def make(conf: str = conf) -> CachingAllocator:
            return CachingAllocator(80 << 30, alloc_conf=conf)

        us = median_us(make, ops, args.repeats)
        print(f"{'synthetic':>14} {conf or 'default':<10} {len(ops):>7} ops  {us:6.2f} us/op (median of "
              f"{args.repeats})")


if __name__ == "__main__":
    main()

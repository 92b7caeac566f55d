"""Run one lab script on two backends and compare ``memory_stats()`` after every action.

``python -m evaluation.parity --cap "2 GiB"`` runs :func:`lab_script` on the real GPU and on the simulator
(mirroring the GPU's capacity, under the same cap and the ``PYTORCH_CUDA_ALLOC_CONF`` of the process)
and prints a JSON report: per action, the keys whose values differ. Without CUDA it compares the
simulator with itself, which checks the script, not the allocator.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from collections.abc import Callable

from memviz.lab import Lab

__all__ = ["compare_labs", "lab_script"]


def lab_script(lab: Lab, seed: int = 0) -> None:
    """The actions every lesson relies on: the seed demo, fragmentation and OOM, order, random churn."""
    lab.allocate("512 MiB", name="big")
    lab.allocate((100, 100), "float32", count=5000, name="small")
    lab.free("big")
    lab.free("small")
    lab.gc()
    lab.empty_cache()
    lab.allocate("4 MiB", count=600, name="chunk")  # fills a 2 GiB cap: stops at the OOM
    survivors = len(lab.groups.get("chunk", ()))
    lab.free(*[f"chunk[{i}]" for i in range(survivors) if i % 5])
    lab.allocate("200 MiB", name="wide")
    lab.empty_cache()
    lab.allocate("200 MiB", name="wide")
    lab.free_all()
    lab.empty_cache()
    lab.allocate("16 MiB", count=8, name="eight")
    lab.free("eight")
    lab.allocate("32 MiB", count=4, name="four")
    lab.free_all()
    lab.reset_stats()
    rng = random.Random(seed)
    for step in range(400):
        names = list(lab)
        roll = rng.random()
        if names and roll < 0.4:
            lab.free(rng.choice(names))
        elif roll < 0.43:
            lab.empty_cache()
        else:
            band = rng.choice((2_000, 900_000, 6 << 20, 120 << 20))
            lab.allocate(rng.randint(1, band), name=f"r{step}")
    lab.free_all()
    lab.empty_cache()


def compare_labs(first: Lab, second: Lab, script: Callable[[Lab], None] = lab_script) -> dict:
    """Run ``script`` on both labs; report each action whose stats or outcome differ."""
    script(first)
    script(second)
    diffs = []
    for a, b in zip(first.events, second.events, strict=False):
        keys = sorted(k for k in b.stats_after if a.stats_after.get(k) != b.stats_after[k])
        if keys or a.ok != b.ok or a.action != b.action:
            diffs.append({
                "event": a.index, "action": a.action, "detail": a.detail, "ok": [a.ok, b.ok],
                "keys": {k: [a.stats_after.get(k), b.stats_after[k]] for k in keys[:8]},
            })  # fmt: skip
    oom_leaks = [
        {"event": e.index, "before": e.stats_before.get("allocated_bytes.all.current"), "after": e.allocated_bytes}
        for e in first.events
        if not e.ok and e.oom.succeeded == 0 and e.allocated_bytes != e.stats_before.get("allocated_bytes.all.current")
    ]
    return {
        "first": first.describe(),
        "second": second.describe(),
        "events": [len(first.events), len(second.events)],
        "ooms": [sum(not e.ok for e in first.events), sum(not e.ok for e in second.events)],
        "matching_events": len(first.events) - len(diffs),
        "churn_starts_at": next((e.index for e in first.events if e.action == "reset_stats"), None),
        "diffs": diffs[:20],
        "oom_leaks": oom_leaks,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", default="2 GiB", help="cap for both backends (default 2 GiB)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    first = Lab("auto", cap=args.cap)
    from memviz.devices import SimulatedDevice

    twin = SimulatedDevice(f"{first.backend.device_name} (simulated)", first.backend.total_memory_bytes)
    second = Lab("sim", device=twin, cap=args.cap, alloc_conf=conf)
    report = compare_labs(first, second, lambda lab: lab_script(lab, args.seed))
    json.dump(report, sys.stdout, indent=1)
    print()
    return 0 if not report["diffs"] and not report["oom_leaks"] else 1


if __name__ == "__main__":
    sys.exit(main())

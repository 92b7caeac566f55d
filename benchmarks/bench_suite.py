"""Summarise the per-test logs that ``benchmarks/bench_suite_plugin.py`` writes.

Run the suite with the plugin, then this::

    MEMVIZ_SUITE_LOG=/tmp/suite-log PYTHONPATH=. bash scripts/test.sh -p benchmarks.bench_suite_plugin
    .venv/bin/python benchmarks/bench_suite.py /tmp/suite-log [--top 25] [--table]

It prints each worker's busy time and idle tail (packing), and the files by wall time with their CPU
(the worker's own and that of reaped children such as notebook kernels), all in seconds. ``--table`` prints
the per-file wall seconds as a Python dict, the form conftest.py's cost table takes.
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log_dir", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args()
    records = [json.loads(line) for path in sorted(args.log_dir.glob("*.jsonl")) for line in path.open()]
    tests = [r for r in records if r["start_s"] is not None]
    t0 = min(r["start_s"] for r in tests)
    t_end = max(r["end_s"] for r in tests)
    print(f"first test start -> last test end: {t_end - t0:.1f} s wall")
    for worker in sorted({r["worker"] for r in records}):
        mine = [r for r in records if r["worker"] == worker]
        startup = [r for r in mine if r["start_s"] is None]
        run = [r for r in mine if r["start_s"] is not None]
        busy = sum(r["end_s"] - r["start_s"] for r in run)
        cpu = sum(r["cpu_self_s"] + r["cpu_children_s"] for r in run)
        up = startup[0]["cpu_self_s"] if startup else 0.0
        last = max(r["end_s"] for r in run)
        print(f"{worker}: start-up CPU {up:.1f} s, tests {busy:.1f} s wall / {cpu:.1f} s CPU, "
              f"first test at +{min(r['start_s'] for r in run) - t0:.1f} s, last ends at +{last - t0:.1f} s "
              f"(idle tail {t_end - last:.1f} s)")
    per_file = defaultdict(lambda: [0.0, 0.0, 0.0, 0, ""])
    for r in tests:
        entry = per_file[r["file"]]
        entry[0] += r["end_s"] - r["start_s"]
        entry[1] += r["cpu_self_s"]
        entry[2] += r["cpu_children_s"]
        entry[3] += 1
        entry[4] = r["worker"]
    total_wall = sum(e[0] for e in per_file.values())
    total_cpu = sum(e[1] + e[2] for e in per_file.values())
    print(f"all tests: {total_wall:.1f} s wall, {total_cpu:.1f} s CPU (worker+children) in {len(tests)} tests")
    print(f"{'file':58} {'wall':>6} {'cpu':>6} {'child':>6} {'n':>4} worker")
    ranked = sorted(per_file.items(), key=lambda kv: -kv[1][0])
    for name, (wall, cpu, child, count, worker) in ranked[: args.top]:
        print(f"{name:58} {wall:6.2f} {cpu:6.2f} {child:6.2f} {count:4d} {worker}")
    if args.table:
        print("{")
        for name, (wall, *_rest) in ranked:
            print(f'    "{name}": {wall:.1f},')
        print("}")


if __name__ == "__main__":
    main()

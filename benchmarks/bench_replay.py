"""Benchmark: replay a 100,000-event allocator trace (target: median <= 1 s).

The trace is the real 60-step training run of tests/data/snapshots/workload (63,008 events) followed
by a second copy at shifted addresses (its starting segments and parameters, then the first recorded
events), 100,000 events in all, so every event is a real request. Timed, with
at least 5 repeats each:

- ``history``: :class:`memviz.snapshots.SnapshotHistory` — rebuild the starting state backwards and
  play all events forward (per-event timeline and stored states), from an already-loaded snapshot.
- ``what-if``: :func:`memviz.snapshots.replay` through :class:`memviz.sim.CachingAllocator` under the
  default config and under ``expandable_segments:True``.

Run: ``.venv/bin/python benchmarks/bench_replay.py [--repeats N]``. Prints the median seconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from memviz.snapshots import SnapshotHistory, load_snapshot, replay

WORKLOAD = Path(__file__).resolve().parent.parent / "tests" / "data" / "snapshots" / "workload"
N_EVENTS = 100_000
SHIFT = 1 << 44  # bytes: moves the second copy's addresses clear of the first's


def build_trace(n_events: int = N_EVENTS) -> dict:
    """Return a snapshot dict whose single device trace has ``n_events`` real events."""
    snap = load_snapshot(WORKLOAD / "workload_default.pickle")
    events = snap["device_traces"][0]
    # The second copy first re-creates, at shifted addresses, what the recording started from
    # (the parameters' segments and blocks), then repeats the recorded events.
    extra = []
    for seg in SnapshotHistory(snap, progress=False).initial_state():
        extra.append({"action": "segment_alloc", "addr": seg["address"] + SHIFT, "size": seg["total_size"],
                      "stream": seg["stream"]})
        for b in seg["blocks"]:
            if b["state"] != "inactive":
                extra.append({"action": "alloc", "addr": b["address"] + SHIFT, "size": b["requested_size"],
                              "stream": seg["stream"]})
    for e in events[: n_events - len(events) - len(extra)]:
        e2 = dict(e)
        if "addr" in e2:
            e2["addr"] += SHIFT
        extra.append(e2)
    trace = events + extra
    # The state after the combined trace: rebuild it from the recorded end state plus the extra events.
    first = SnapshotHistory(snap, progress=False)
    combined = {"segments": first.state_at(-1), "device_traces": [extra],
                "allocator_settings": snap["allocator_settings"]}
    tail = SnapshotHistory(combined, progress=False)
    return {"segments": tail.state_at(-1), "device_traces": [trace],
            "allocator_settings": snap["allocator_settings"], "external_annotations": []}


def _median(fn, repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    repeats = max(args.repeats, 5)
    snap = load_snapshot(build_trace())
    n = len(snap["device_traces"][0])
    history = SnapshotHistory(snap, progress=False)
    assert len(history) == n == N_EVENTS and history.anomalies == [], history.anomalies[:3]
    assert history.compare_final() == []

    med, times = _median(lambda: SnapshotHistory(snap, progress=False), repeats)
    print(f"history  {n} events: median {med:.3f} s  ({', '.join(f'{t:.3f}' for t in times)})")
    for conf in ("", "expandable_segments:True"):
        med, times = _median(lambda c=conf: replay(history, c, progress=False), repeats)
        r = replay(history, conf, progress=False)
        print(f"what-if  {n} events, {conf or 'default':<24}: median {med:.3f} s  "
              f"({', '.join(f'{t:.3f}' for t in times)}); peak reserved {r.peak_reserved_bytes / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()

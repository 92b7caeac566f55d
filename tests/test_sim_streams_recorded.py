"""Golden tests from the H200: streams, CUDA graphs and MemPools recorded by scripts/record_streams.py.

Each file of tests/data/streams/ is one program run under one config (tests/data/streams/README.md says how
it was recorded), compacted: the final trace once, and after each phase the segments, the settings, the
trace length and torch's own ``memory_stats()``. Each recording replays through
``memviz.snapshots.check_fidelity`` (the final snapshot, with the phases' snapshots naming the pools of
segments gone by the end) and must match the real allocator: every request's reserved and allocated bytes
and the sampled segment states, each phase's reserved and allocated bytes, and the final ``memory_stats()``
(all 122 keys but ``num_sync_all_streams``).

    python3 tests/test_sim_streams_recorded.py compact RAW_DIR   # write tests/data/streams/ from a run's output
    python3 tests/test_sim_streams_recorded.py report            # what matches, recording by recording
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memviz.sim import CachingAllocator
from memviz.snapshots import SnapshotHistory, check_fidelity
from memviz.snapshots.settings import settings_from_snapshot

DATA = Path(__file__).resolve().parent / "data" / "streams"
RECORDINGS = sorted(DATA.glob("*.json.gz"))
#: the memory cap a program set before its first allocation (record_streams.py), as a fraction's numerator
CAPS_BYTES = {"record_stream_oom": 2 << 30}
#: memory_stats() keys not compared: an empty_cache() that released nothing (torch.cuda.graph's own, one while
#: every pool is held) leaves no trace entry, so the replay cannot count its synchronize
UNREPLAYABLE_STATS = ("num_sync_all_streams",)


def compact(raw: dict[str, Any]) -> dict[str, Any]:
    """One record_streams.py run file as stored here: the last phase's trace once, each phase without its trace."""
    out = {k: v for k, v in raw.items() if k != "phases"}
    phases = []
    trace: list = []
    for p in raw["phases"]:
        snap = p.get("snapshot") or {}
        traces = snap.get("device_traces") or [[]]
        if snap:
            trace = traces[0]
        phases.append({"name": p["name"], "error": p.get("error"), "notes": p.get("notes") or {},
                       "stats": p.get("stats"), "mem_get_info": p.get("mem_get_info"),
                       "events": len(traces[0]) if snap else None, "segments": snap.get("segments"),
                       "allocator_settings": snap.get("allocator_settings")})
    out["trace"] = trace
    out["phases"] = phases
    return out


def load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def phase_snapshots(rec: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(phase, its snapshot) for each phase that kept one, the snapshot rebuilt from the stored trace."""
    out = []
    for p in rec["phases"]:
        if p["events"] is None:
            continue
        out.append((p, {"segments": p["segments"], "device_traces": [rec["trace"][:p["events"]]],
                        "allocator_settings": p["allocator_settings"] or {}}))
    return out


def evaluate(rec: dict[str, Any]) -> dict[str, Any]:
    """Replay one recording and compare it with the real allocator's numbers (see the module docstring)."""
    snaps = phase_snapshots(rec)
    (last, final), earlier = snaps[-1], [s for _, s in snaps[:-1]]
    history = SnapshotHistory(final, earlier_snapshots=earlier, progress=False)
    cap = CAPS_BYTES.get(rec["program"])
    total = rec["total_bytes"]
    report = check_fidelity(history, device_total_bytes=total, memory_fraction=None if cap is None else cap / total,
                            progress=False)
    result = report.result
    phases_ok = []
    for p, _ in snaps:
        k = p["events"]
        got = (result.reserved_bytes[k], result.allocated_bytes[k]) if k < len(result.reserved_bytes) else \
            (result.final_reserved_bytes, result.final_allocated_bytes)
        want = (p["stats"]["reserved_bytes.all.current"], p["stats"]["allocated_bytes.all.current"])
        phases_ok.append((p["name"], got == want, got, want))
    replayed = result.allocator.memory_stats()
    stats_diff = {k: (replayed.get(k), want) for k, want in last["stats"].items()
                  if k not in UNREPLAYABLE_STATS and replayed.get(k) != want}
    return {"report": report, "phases": phases_ok, "stats_diff": stats_diff, "inferred": history.pools.inferred,
            "exact": report.exact and all(ok for _, ok, _, _ in phases_ok) and not stats_diff}


@pytest.mark.skipif(not RECORDINGS, reason="no H200 recordings in tests/data/streams")
@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name.removesuffix(".json.gz"))
def test_recording_replays_exactly(path: Path) -> None:
    rec = load(path)
    out = evaluate(rec)
    assert out["report"].exact, out["report"].describe()
    assert [name for name, ok, _, _ in out["phases"] if not ok] == []
    assert out["stats_diff"] == {}


SETTINGS_CALLS = ("max_split_size_mb:64", "roundup_power2_divisions:4", "garbage_collection_threshold:0.5",
                  "expandable_segments:True", "max_split_size_mb:40", "")  # record_streams.py's allocator_settings


@pytest.mark.parametrize("path", [p for p in RECORDINGS if p.name.startswith("allocator_settings-")],
                         ids=lambda p: p.name.removesuffix(".json.gz"))
def test_set_allocator_settings_keeps_what_torch_keeps(path: Path) -> None:
    """The simulator's own ``set_allocator_settings`` against the H200's: after each call the options in force
    (the snapshot's allocator_settings) and the segment a 21 MiB + 1 B request gets. torch resets max_split_size,
    roundup_power2_divisions and garbage_collection_threshold on every call; expandable_segments stays on."""
    rec = load(path)
    a = CachingAllocator(rec["total_bytes"], None, rec["alloc_conf"])
    phases = {p["name"]: p for p in rec["phases"]}
    seen = []
    for conf in SETTINGS_CALLS:
        a.set_allocator_settings(conf)
        ptr = a.malloc(21 * (1 << 20) + 1)
        real = phases[f"_set_allocator_settings({conf!r}), 21 MiB + 1 B"]
        want = settings_from_snapshot({"allocator_settings": real["allocator_settings"]})
        got = settings_from_snapshot(a.snapshot(record=False))
        assert got == want, conf
        assert [(s["total_size"], s["is_expandable"]) for s in a.segments()] == \
            [(s["total_size"], s["is_expandable"]) for s in real["segments"]], conf
        seen.append(want.expandable_segments)
        a.free(ptr)
        a.empty_cache()
    assert seen[-2:] == [True, True]  # the calls after expandable_segments:True left it on


def _main(argv: list[str]) -> None:
    if argv[:1] == ["compact"]:
        DATA.mkdir(parents=True, exist_ok=True)
        for src in sorted(Path(argv[1]).glob("*.json.gz")):
            with gzip.open(DATA / src.name, "wt", compresslevel=9) as f:
                json.dump(compact(load(src)), f, separators=(",", ":"))
        return
    matched = 0
    for path in RECORDINGS:
        out = evaluate(load(path))
        matched += out["exact"]
        bad = [f"{name}: {got} != {want}" for name, ok, got, want in out["phases"] if not ok]
        print(f"{path.name:40s} exact={out['exact']!s:5s} inferred={out['inferred']} {out['report'].describe()}")
        for line in bad[:3] + [f"stat {k}: replayed {g} real {w}" for k, (g, w) in list(out["stats_diff"].items())[:6]]:
            print("    " + line)
    print(f"{matched} of {len(RECORDINGS)} recordings match exactly")


if __name__ == "__main__":
    _main(sys.argv[1:])

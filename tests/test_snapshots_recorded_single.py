"""Issue 27's blind check: H200 runs recorded the way users record, one snapshot each (scripts/record_snapshots.py).

Each file of tests/data/single/ is one program under one config: the ``_dump_snapshot`` at its end (frames dropped)
and, apart, the truth it is checked against: ``memory_stats()`` after every phase, and the device's size. The replay
reads the snapshot alone (no device size, no earlier snapshot; only the torch version, which a snapshot does not
hold) and must either reproduce every phase's reserved bytes (at the phase's last trace entry, found by the
``user_metadata`` the recorder set at each phase) or refuse with the reason a lost pool gives ("pools"). What-ifs
under the other config must run out of memory nowhere (every program stays far below the device's memory), and the
device's size, where expandable segments bound it, must hold the real one. Each program was recorded under both
configs, so a what-if is also checked against the other recording: it reserves what that recording reserved at
every phase boundary, or the fidelity report says why it may not (segments whose pool no snapshot names).

    python3 tests/test_snapshots_recorded_single.py compact RAW_DIR  # tests/data/single/ from the recorder's DIR
    python3 tests/test_snapshots_recorded_single.py report [DIR]     # every recording's outcome (raw or compact)

``held_out_*`` programs were never looked at while the replay was written: their outcomes before any change are the
blind figures (docs/replay-blind-single.txt). A program whose phase failed on the GPU (``phases[k]["error"]``) is
still a real trace to replay, but not a test of what it meant to do; the report says so.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memviz.snapshots import SnapshotHistory, check_fidelity, load_snapshot, what_if

DATA = Path(__file__).resolve().parent / "data" / "single"
RECORDINGS = sorted(DATA.glob("*.json.gz"))
OTHER = {"default": "expandable_segments:True", "expandable": "expandable_segments:False"}


def _plain(obj: Any) -> Any:
    """Snapshot data as JSON: tuples to lists, frames and compile contexts dropped."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items() if k not in ("frames", "compile_context")}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


def read_raw(pickle_path: Path) -> dict[str, Any]:
    """One record_snapshots.py run: ``{"meta", "phases", "snapshot"}`` from its pickle and ``.stats.json``."""
    stats = json.loads(pickle_path.with_suffix(".stats.json").read_text())
    meta = {k: v for k, v in stats.items() if k != "phases"}
    return {"meta": meta, "phases": stats["phases"], "snapshot": _plain(load_snapshot(pickle_path))}


def load(path: Path) -> dict[str, Any]:
    if path.suffix == ".pickle":
        return read_raw(path)
    with gzip.open(path, "rt") as f:
        return json.load(f)


def boundaries(trace: list[dict[str, Any]], phases: int) -> list[int | None]:
    """The index of each phase's last trace entry (-1: none yet), from the ``user_metadata`` ``"<k>:<name>"`` the
    recorder set as phase ``k`` began; None for every phase when the entries carry no such marker."""
    marks = []
    for e in trace:
        head = str(e.get("user_metadata") or "").split(":", 1)[0]
        marks.append(int(head) if head.isdigit() else None)
    if not any(m is not None for m in marks):
        return [None] * phases
    last = [-1] * phases
    for i, m in enumerate(marks):
        if m is not None and m < phases:
            last[m] = i
    for k in range(1, phases):  # a phase with no entry ends where the one before it ended
        last[k] = max(last[k], last[k - 1])
    return last


def _phase_diffs(history: SnapshotHistory, reserved: Any, final_bytes: int, phases: list[dict[str, Any]]
                 ) -> list[tuple[str, int, int]]:
    """(phase, replayed, real) reserved bytes wherever a replay's per-event ``reserved`` and final reserved bytes
    differ from the phases' ``memory_stats()``."""
    diffs = []
    for p, b in zip(phases, boundaries(history.events, len(phases)), strict=True):
        if b is None:
            continue
        got = reserved[b] if b >= 0 else history.timeline.initial["reserved_bytes"]
        if got != p["stats"]["reserved_bytes.all.current"]:
            diffs.append((p["name"], got, p["stats"]["reserved_bytes.all.current"]))
    if final_bytes != phases[-1]["stats"]["reserved_bytes.all.current"]:
        diffs.append(("end", final_bytes, phases[-1]["stats"]["reserved_bytes.all.current"]))
    return diffs


def evaluate(rec: dict[str, Any], other_rec: dict[str, Any] | None = None) -> dict[str, Any]:
    """Replay one recording from its snapshot alone and compare with the truth (see the module docstring); with
    ``other_rec`` (the same program recorded under the other config), compare the what-if with it too."""
    meta, phases = rec["meta"], rec["phases"]
    history = SnapshotHistory(rec["snapshot"], progress=False, torch_version=meta.get("torch"))
    report = check_fidelity(history, progress=False)
    device = history.recorded_device
    out: dict[str, Any] = {"report": report, "device": device, "phase_diffs": [], "other_ooms": None,
                           "other_diffs": None, "failed": [p["name"] for p in phases if p["error"]],
                           "device_holds": device.upper_bytes is None or
                           device.lower_bytes <= meta["total_bytes"] <= device.upper_bytes}
    if not report.replayable:
        out["outcome"] = f"refused ({report.verdict.cause})"
        return out
    result = report.result
    out["phase_diffs"] = _phase_diffs(history, result.reserved_bytes,
                                      result.allocator.memory_stats()["reserved_bytes.all.current"], phases)
    other = what_if(history, {"other": OTHER[meta["config"]]}, progress=False).results["other"]
    out["other_ooms"] = other.num_ooms
    if other_rec is not None and len(other_rec["phases"]) == len(phases):
        out["other_diffs"] = _phase_diffs(history, other.reserved_bytes,
                                          other.allocator.memory_stats()["reserved_bytes.all.current"],
                                          other_rec["phases"])
    out["outcome"] = "exact" if not out["phase_diffs"] else "WRONG"
    return out


def _other(path: Path) -> Path:
    """The same program's recording under the other config."""
    name = path.name
    for mine, theirs in (("-default.", "-expandable."), ("-expandable.", "-default.")):
        if mine in name:
            return path.with_name(name.replace(mine, theirs))
    return path


@pytest.mark.skipif(not RECORDINGS, reason="no single-snapshot H200 recordings in tests/data/single yet")
@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name.removesuffix(".json.gz"))
def test_replayed_exactly_or_refused_for_a_lost_pool(path: Path) -> None:
    rec = load(path)
    assert rec["meta"]["error"] is None and rec["meta"]["torch"].startswith("2.11.")
    out = evaluate(rec, load(_other(path)))
    assert out["device_holds"], out["device"].note
    assert out["outcome"] in ("exact", "refused (pools)"), (out["outcome"], out["phase_diffs"],
                                                            out["report"].describe())
    if out["outcome"] == "exact":
        assert out["other_ooms"] == 0
        # the what-if lands on the other config's own recording, or the report says it may not: the pools of
        # segments no snapshot names were guessed, and under another config they can matter
        if out["other_diffs"]:
            assert any("no recorded pool" in c for c in out["report"].caveats), out["other_diffs"]
    else:
        assert "no snapshot names" in out["report"].reason and "earlier_snapshots" in out["report"].remedy


def _main(argv: list[str]) -> None:
    if argv[:1] == ["compact"]:
        DATA.mkdir(parents=True, exist_ok=True)
        for src in sorted(Path(argv[1]).glob("*.pickle")):
            with gzip.open(DATA / src.name.replace(".pickle", ".json.gz"), "wt", compresslevel=9) as f:
                json.dump(read_raw(src), f, separators=(",", ":"))
        return
    where = Path(argv[1]) if argv[1:] else DATA
    paths = sorted(where.glob("*.pickle")) or sorted(where.glob("*.json.gz"))
    counts: dict[str, int] = {}
    landed = [0, 0]  # what-ifs of exact replays: on the other recording, off it
    for path in paths:
        other = _other(path)
        out = evaluate(load(path), load(other) if other.exists() and other != path else None)
        name = path.name.split(".")[0]
        counts[out["outcome"]] = counts.get(out["outcome"], 0) + 1
        lands = "" if out["other_diffs"] is None else (" lands on the other recording" if not out["other_diffs"]
                                                      else " OFF the other recording")
        if out["other_diffs"] is not None:
            landed[bool(out["other_diffs"])] += 1
        print(f"{name:48s} {out['outcome']:18s} device {out['device'].label:24s} holds={out['device_holds']} "
              f"other-config OOMs={out['other_ooms']}{lands}")
        if out["failed"]:
            print(f"    the program failed on the GPU in phase(s) {', '.join(out['failed'])}: a real trace, but not "
                  "of what the program meant to do")
        if out["outcome"].startswith("refused"):
            print("    " + out["report"].verdict.describe())
        for phase, got, want in out["phase_diffs"][:4]:
            print(f"    {phase}: replayed {got:,} B reserved, real {want:,} B")
        for phase, got, want in (out["other_diffs"] or [])[:4]:
            print(f"    what-if, {phase}: {got:,} B reserved, the other config's recording {want:,} B")
        if out["other_diffs"]:
            print("    caveat: " + "; ".join(c for c in out["report"].caveats if "no recorded pool" in c))
    print(", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no recordings")
    print(f"what-ifs of the exact ones under the other config: {landed[0]} land on its recording, {landed[1]} do not "
          "(each with the caveat that says why it may not)")


if __name__ == "__main__":
    _main(sys.argv[1:])

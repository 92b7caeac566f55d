"""The GPU-vs-simulator parity script runs on the simulator too (CI has no GPU): it must exercise OOMs."""

from evaluation.parity import compare_labs
from memviz.lab import Lab


def test_parity_script_compares_every_event_and_hits_ooms():
    report = compare_labs(Lab("sim", device="H200", cap="2 GiB"), Lab("sim", device="H200", cap="2 GiB"))
    assert report["events"][0] == report["events"][1] > 400
    assert report["ooms"][0] >= 2
    assert report["diffs"] == [] and report["oom_leaks"] == []


def test_parity_script_reports_differences():
    report = compare_labs(Lab("sim", device="H200", cap="2 GiB"),
                     Lab("sim", device="H200", cap="2 GiB", alloc_conf="expandable_segments:True"))  # fmt: skip
    assert report["diffs"], "different configs must show up as differences"
    assert "reserved_bytes.all.current" in report["diffs"][0]["keys"]

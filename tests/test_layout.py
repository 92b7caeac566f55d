"""The text segment map: same layouts counted once, runs shortened, no addresses."""

from memviz.lab import Lab
from memviz.layout import segment_table


def test_fragmented_cache_prints_one_line_per_layout():
    lab = Lab("sim", device="T4", cap="2 GiB")
    lab.allocate("4 MiB", count=1000, name="c")
    kept = len(lab.groups["c"])
    lab.free(*[f"c[{i}]" for i in range(kept) if i % 5])
    assert lab.segment_table() == "large              20.00 MiB ×102  [4.00 MiB live] [16.00 MiB free]"


def test_seed_demo_layout_and_empty_cache():
    lab = Lab("sim", device="T4", cap="2 GiB")
    lab.allocate((100, 100), "float32", count=5000, name="s")
    lines = lab.segment_table().splitlines()
    assert lines[0] == "small               2.00 MiB ×98   [39.50 KiB live]×51 [33.50 KiB free]"
    assert lines[1] == "small               2.00 MiB ×1    [39.50 KiB live]×2 [1.92 MiB free]"
    lab.free_all()
    lab.empty_cache()
    assert lab.segment_table() == "(no segments: nothing reserved)"


def test_limit_sums_up_the_rest():
    segments = [{"segment_type": "large", "total_size": (i + 1) << 21,
                 "blocks": [{"size": (i + 1) << 21, "state": "inactive"}]} for i in range(5)]  # fmt: skip
    text = segment_table({"segments": segments}, limit=2)
    assert text.splitlines()[-1] == "... and 3 more segments in 3 other layouts"

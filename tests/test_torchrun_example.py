"""CI's proof of the per-rank snapshot path: ``torchrun --nproc-per-node 2 examples/torchrun_snapshots.py`` on CPU
(gloo, memviz's simulated H200 per rank), then the snapshots in the RankViewer.

What each rank holds after DDP training is checked exactly against the model: every parameter three times (itself and
AdamW's two moments) and DDP's gradient buckets, which hold every parameter's bytes once, each block rounded to
512 B as the caching allocator does. The ranks ran at once, so their timelines interleave on the viewer's scale.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memviz.snapshots import load_ranks
from memviz.widgets import RankViewer

ROOT = Path(__file__).resolve().parents[1]
WIDTH, DEPTH, BATCH, STEPS = 256, 3, 16, 2


def round_512(nbytes: int) -> int:
    return -(-nbytes // 512) * 512


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("ranks")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "examples" / "torchrun_snapshots.py"), "--out", str(out), "--width", str(WIDTH),
           "--depth", str(DEPTH), "--batch", str(BATCH), "--steps", str(STEPS)]  # fmt: skip
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return out, run.stdout


def test_each_rank_wrote_its_own_snapshot(job):
    out, stdout = job
    ranks = load_ranks(out)
    assert [r.rank for r in ranks] == [0, 1] and [r.device for r in ranks] == [0, 1]  # cuda:local_rank
    for r in ranks:
        note = r.simulated
        assert note is not None and (note["rank"], note["world_size"], note["index"]) == (r.rank, 2, r.rank)
        assert (note["strategy"], note["backend"], note["device"]) == ("ddp", "gloo", "NVIDIA H200 (simulated)")
        traces = r.history.snapshot["device_traces"]
        assert [d for d, t in enumerate(traces) if t] == [r.rank]  # nothing on another device
        peaks = r.peaks()
        line = re.search(rf"rank {r.rank}/2: .* peak allocated ([\d,]+) B, peak reserved ([\d,]+) B", stdout)
        assert line is not None, stdout
        assert [int(g.replace(",", "")) for g in line.groups()] == [peaks["peak_allocated"], peaks["peak_reserved"]]


def test_each_rank_holds_its_parameters_adam_s_moments_and_ddp_s_buckets(job):
    params = [WIDTH * WIDTH * 4, WIDTH * 4] * DEPTH + [WIDTH * 10 * 4, 10 * 4]  # weights and biases, float32
    for r in load_ranks(job[0]):
        live = [(b["size"], b["requested_size"]) for s in r.history.state_at(-1) for b in s["blocks"]
                if b["state"] == "active_allocated"]  # fmt: skip
        for p in params:  # the parameter and AdamW's exp_avg and exp_avg_sq
            for _ in range(3):
                live.remove((round_512(p), p))
        buckets = live  # what is left: DDP's buckets, every parameter's bytes once
        assert buckets and sum(requested for _, requested in buckets) == sum(params)
        assert all(size == round_512(requested) for size, requested in buckets)
        assert r.history.compare_final() == []  # the rebuilt trace ends at the recorded segments


def test_the_viewer_shows_both_ranks_on_one_time_scale(job):
    viewer = RankViewer(job[0])
    try:
        job_ranks = viewer.job
        assert job_ranks.scale.kind == "time" and "simulated" in viewer.header.value
        first = [r.history.events[0]["time_us"] for r in job_ranks]
        last = [r.history.events[-1]["time_us"] for r in job_ranks]
        assert max(first) < min(last)  # the ranks ran at the same time ...
        positions = [list(p) for p in job_ranks.scale.positions]
        assert positions[0][-1] > positions[1][0] and positions[1][-1] > positions[0][0]  # ... and interleave
        viewer.goto(-1)
        assert viewer.indices == [len(r.history) - 1 for r in job_ranks]
        for k, r in enumerate(job_ranks):
            assert viewer.maps[k].bars["live"]["size"] and f"event {len(r.history) - 1:,}" in viewer.texts[k]
    finally:
        viewer.close()

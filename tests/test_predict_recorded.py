"""memviz.predict against the real H200 runs in evaluation/recordings (fresh processes, torch 2.11, cuDNN 9.19).

CI predicts a few runs of each kind, held-out programs among them (seconds each on 2 cores);
``MEMVIZ_FIT_ALL=1`` predicts every run and every recorded largest-batch search and checks the issue's
targets on the whole set (minutes). The figures for the whole set are in docs/predict.md
(``python -m evaluation.recorded``).
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")

from evaluation import recorded

ALL = os.environ.get("MEMVIZ_FIT_ALL") == "1"

# (run id, tolerance on peak reserved): an MLP, a GPT with SDPA and bf16, with checkpointing and
# expandable segments under a cap, a capped OOM, a capped CNN with SGD.
FAST = [("mlp-b256", 0.0), ("mlp-cap3-b16285", 0.01), ("gpt-b8-amp", 0.03), ("gpt-amp-ckpt-cap8-b29", 0.03),
        ("gpt-b8-amp-exp", 0.03), ("convnet-cap2-b349", 0.03), ("convnet-cap2-b350", 0.03),
        ("resnet18-b64-cap2", 0.03),
        # held out (evaluation/programs/heldout.py, never fitted on): depthwise convolutions under a cap near the
        # cliff, a ViT under bf16 with expandable segments, a masked nn.TransformerEncoder in fp32, re-entrant
        # checkpointing with fused AdamW
        ("ho-mbv2-b64-exp-capm3", 0.03), ("ho-vit-b64-amp-exp", 0.03), ("ho-bert-b8-fp32", 0.03),
        ("ho-llama-b4-ckpt", 0.03)]


@pytest.mark.parametrize(("run_id", "tolerance"), FAST)
def test_recorded_run(run_id: str, tolerance: float) -> None:
    run = recorded.load_run(run_id)  # one file when the test runs, not all of them at collection
    assert run["id"] == run_id
    row = recorded.compare_run(run)
    assert row.predicted_fits == row.real_fits
    assert abs(row.reserved_error) <= tolerance, row
    assert abs(row.allocated_error) <= max(tolerance, 0.01), row


@pytest.mark.skipif(not ALL, reason="every recorded run takes minutes: MEMVIZ_FIT_ALL=1")
def test_every_recorded_run_meets_the_targets() -> None:
    rows = [recorded.compare_run(run) for run in recorded.load_runs()]
    searches = [recorded.compare_max_batch(s) for s in recorded.load_max_batch()]
    figures = recorded.summarize(rows, searches)
    print(recorded.markdown(rows, searches))
    assert figures["reserved_median"] <= 0.03
    assert figures["reserved_worst"] <= 0.05
    assert figures["fits_hit_rate_off_cliff"] >= 0.95
    assert figures["max_batch_worst"] <= 0.05

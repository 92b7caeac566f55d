"""memviz.predict against real H200 runs (evaluation/recordings: fresh processes, torch 2.11, cuDNN 9.19).

A few runs of each kind, each named by its standing (evaluation/recordings/standing.json): ``fitted`` (the
programs the rules were developed against), ``blind`` (held out, predicted today as it was before anything was
changed after seeing it) and ``refined-after`` (held out, but a rule made after the held-out misses changed its
prediction: no longer a check of generalization). Each tolerance is the target the predictor is held to (3% on
peak reserved; exact where the run is exact), not its current error. Every run and search, with the figures
against the targets per standing, is a benchmark: ``python -m evaluation.recorded`` (docs/predict.md).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from evaluation import recorded, standing

STANDING = standing.load()

# an MLP, a GPT with SDPA and bf16, with checkpointing and expandable segments under a cap, a capped OOM, a capped
# CNN with SGD; held out: depthwise convolutions under a cap near the cliff, a ViT under bf16 with expandable
# segments, a masked nn.TransformerEncoder in fp32, re-entrant checkpointing with fused AdamW
FAST = ["mlp-b256", "mlp-cap3-b16285", "gpt-b8-amp", "gpt-amp-ckpt-cap8-b29", "gpt-b8-amp-exp", "convnet-cap2-b349",
        "convnet-cap2-b350", "resnet18-b64-cap2", "ho-mbv2-b64-exp-capm3", "ho-vit-b64-amp-exp", "ho-bert-b8-fp32",
        "ho-llama-b4-ckpt"]


@pytest.mark.parametrize("run_id", FAST, ids=[f"{STANDING[r]}:{r}" for r in FAST])
def test_recorded_run(run_id: str) -> None:
    run = recorded.load_run(run_id)  # one file when the test runs, not all of them at collection
    row = recorded.compare_run(run)
    assert row.predicted_fits == row.real_fits
    assert abs(row.reserved_error) <= 0.03, row
    assert abs(row.allocated_error) <= 0.03, row


def test_every_recorded_run_has_a_standing() -> None:
    """Held-out runs are blind or refined-after, never silently counted as held out."""
    runs = {path.name.removesuffix(".json.gz") for path in (recorded.DATA_DIR / "h200").glob("*.json.gz")}
    assert runs <= set(STANDING)
    assert all(STANDING[r] == "fitted" for r in runs if not r.startswith(recorded.HELDOUT_PREFIX))
    assert all(STANDING[r] in ("blind", "refined-after") for r in runs if r.startswith(recorded.HELDOUT_PREFIX))

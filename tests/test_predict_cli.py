"""python -m memviz.fit: the command line over memviz.predict / max_batch (real torch, in process)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from memviz import fit

PROGRAM = "memviz.examples:mlp_training"


def test_fits_prints_json_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    status = fit.main([PROGRAM, "--device", "T4", "--kw", "batch=8", "--kw", "steps=1", "--json", "--no-progress"])
    out = json.loads(capsys.readouterr().out)
    assert status == 0 and out["fits"] and out["peak_reserved_bytes"] >= out["peak_allocated_bytes"] > 0
    assert set(out["breakdown_at_peak"]) >= {"parameters", "workspaces"}


def test_an_oom_exits_1_and_says_where(capsys: pytest.CaptureFixture[str]) -> None:
    status = fit.main([PROGRAM, "--device", "H200", "--cap", "512 MiB", "--kw", "batch=8", "--no-progress"])
    out = capsys.readouterr().out
    assert status == 1 and "OUT OF MEMORY" in out and "examples.py" in out


def test_max_batch_with_a_progress_bar(capsys: pytest.CaptureFixture[str]) -> None:
    status = fit.main([PROGRAM, "--device", "H200", "--cap", "1400 MiB", "--max-batch", "--lo", "64", "--hi", "64",
                       "--kw", "steps=1"])
    captured = capsys.readouterr()
    assert status == 0 and "largest batch that fits = 64" in captured.out
    assert "try" in captured.err  # tqdm's bar


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert fit.main(["no_colon_here", "--no-progress"]) == 2
    assert fit.main([PROGRAM, "--kw", "not an assignment", "--no-progress"]) == 2
    assert fit.main(["missing_file.py:main", "--no-progress"]) == 2
    assert "memviz.fit:" in capsys.readouterr().err


SCRIPT = '''
import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main(batch: int = 4, seq: int = 64) -> None:
    config = AutoConfig.for_model("llama", hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    model = AutoModelForCausalLM.from_config(config).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 1000, (batch, seq), device="cuda")
    mask = torch.ones_like(ids)
    mask[0, :8] = 0
    for step in range(2):
        loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"step {step}: loss {loss.item():.3f}")
'''


def test_a_script_that_builds_a_transformers_model_from_a_config(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    status = fit.main([f"{script}:main", "--device", "T4", "--kw", "batch=8", "--json", "--no-progress"])
    printed = capsys.readouterr().out
    assert "step 1: loss 0.000" in printed  # the program's own log, before the JSON
    out = json.loads(printed[printed.index("\n{") + 1:])
    assert status == 0 and out["fits"] and out["breakdown_at_peak"]["optimizer state"] > 0
    assert any("read as zeros" in note and "train.py" in note for note in out["notes"])

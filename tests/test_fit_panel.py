"""The fit panel without a browser: controls driven by ``.value =`` and ``.click()``, and what every view holds
compared with real predictions (``memviz.predict`` / ``max_batch``) of the same small programs, made here."""

from __future__ import annotations

import pytest
import torch
from ipywidgets import fixed
from torch import nn

import memviz
from memviz.examples import mlp_training as train  # a user's script: (batch=256, steps=3, amp=False)
from memviz.predictor import max_batch, predict
from memviz.widgets._common import escape, exact_bytes
from memviz.widgets.fit_controls import ProgramControls
from memviz.widgets.fit_panel import FitPanel, fit_panel
from memviz.widgets.fit_report import first_oom_rank, limit_bytes, outside_html, phase_spans


def wide(batch: int = 48, steps: int = 1) -> None:
    """1 MiB of input per sample: the batch decides what fits."""
    model = nn.Linear(1 << 18, 4).cuda()
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(steps):
        model(torch.randn(batch, 1 << 18, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad()


def picky(batch: int = 8) -> None:
    """Raises for batches it does not take: the panel must show the program's own error."""
    if batch > 100:
        raise ValueError(f"batch {batch} is more than this program takes")
    wide(batch=batch)


@pytest.fixture
def panel():
    p = FitPanel(train, device="T4")
    yield p
    p.close()


def expected(device="T4", cap=None, alloc_conf="", **kwargs):
    return predict(train, device=device, cap=cap, alloc_conf=alloc_conf, **kwargs)


def assert_shows(panel: FitPanel, p) -> None:
    """Every view of the panel holds the numbers of prediction ``p`` (made independently)."""
    shown = panel.prediction
    assert (shown.peak_allocated_bytes, shown.peak_reserved_bytes) == (p.peak_allocated_bytes, p.peak_reserved_bytes)
    rows = {r["key"]: r for r in panel.gauges.rows}
    assert rows["allocated"]["text"] == exact_bytes(p.peak_allocated_bytes)
    assert rows["reserved"]["text"] == exact_bytes(p.peak_reserved_bytes)
    assert rows["reserved"]["fraction"] == p.peak_reserved_bytes / limit_bytes(p)
    drawn = panel.area.drawn
    assert drawn["x"] == list(range(len(p.events)))  # a short run is drawn whole
    assert drawn["reserved"] == [e.reserved_bytes for e in p.events]
    stack_at_peak = sum(drawn[cat][p.peak_event_index] for cat in memviz.predictor.CATEGORIES)
    assert stack_at_peak == sum(p.breakdown().values())
    assert drawn["peak"] == p.peak_event_index
    assert drawn["phases"] == phase_spans(p)
    assert not panel.out.outputs, panel.out.outputs


def test_controls_are_built_from_the_signature():
    def program(batch: int = 8, amp: bool = False, lr: float = 1e-3, name: str = "x", depth: int = 18,
                mode=None, *, seq: int = 128):  # fmt: skip
        pass

    c = ProgramControls(program, {"depth": [18, 34, 50], "seq": (64, 1024, 64), "name": fixed("y")})
    kinds = {name: type(w).__name__ for name, w in c.widgets.items()}
    assert kinds == {"batch": "BoundedIntText", "amp": "Checkbox", "lr": "FloatText", "depth": "Dropdown",
                     "seq": "IntSlider"}  # fmt: skip
    assert c.widgets["depth"].options == (18, 34, 50) and c.widgets["depth"].value == 18
    assert (c.widgets["seq"].min, c.widgets["seq"].max, c.widgets["seq"].value) == (64, 1024, 128)
    assert c.widgets["batch"].min == 1
    assert c.values() == {"batch": 8, "amp": False, "lr": 1e-3, "depth": 18, "seq": 128, "name": "y", "mode": None}


@pytest.mark.parametrize(
    ("defaults", "message"),
    [({"btach": 4}, "takes no argument 'btach'"), ({}, "needs a value for 'data'")],
)
def test_controls_refuse_what_the_program_does_not_take(defaults, message):
    def program(data, batch: int = 8):
        pass

    with pytest.raises(TypeError, match=message):
        ProgramControls(program, defaults)


def test_panel_shows_the_prediction_and_follows_every_control(panel):
    assert_shows(panel, expected())
    assert "fits" in panel.banner.value and panel.fix_button.layout.display == "none"
    assert [name for name, *_ in panel.area.drawn["phases"]] == ["forward", "backward", "optimizer"] * 3
    panel.args.widgets["batch"].value = 512
    assert_shows(panel, expected(batch=512))
    panel.args.widgets["amp"].value = True
    assert_shows(panel, expected(batch=512, amp=True))
    panel.target.device.value = "H200"
    assert_shows(panel, expected("H200", batch=512, amp=True))
    panel.target.config.value = "expandable_segments:True"
    assert_shows(panel, expected("H200", alloc_conf="expandable_segments:True", batch=512, amp=True))
    panel.target.device.value = "custom size"
    assert "custom GPU size: type the GPU's memory" in panel.error_text  # the empty box, before the size
    panel.target.custom.value = "3 GiB"
    assert_shows(panel, expected(3 << 30, alloc_conf="expandable_segments:True", batch=512, amp=True))
    assert len(panel.refresh_seconds) == 6  # the first draw and one per change that predicted
    assert panel.gauges.title.startswith("Simulated GPU 3.00 GiB")


def test_segment_map_is_the_cache_at_the_peak(panel):
    p = panel.prediction
    assert f"after event {p.peak_event_index:,}" in panel.map_note.value
    assert sum(panel.map.bars["live"]["size"]) == p.events[p.peak_event_index].allocated_bytes
    segments = p.snapshot(at=p.peak_event_index)["segments"]
    assert sum(sum(panel.map.bars[k]["size"]) for k in ("live", "stuck", "releasable")) == sum(
        s["total_size"] for s in segments) == p.events[p.peak_event_index].reserved_bytes


def test_notes_say_what_the_prediction_does_not_model():
    def recurrent(batch: int = 4) -> None:
        lstm = nn.LSTM(64, 64).cuda()
        lstm(torch.randn(16, batch, 64, device="cuda"))[0].sum().backward()

    panel = FitPanel(recurrent)
    notes = panel.prediction.notes
    assert notes and all(escape(note) in panel.banner.value for note in notes)
    assert "memviz-fit-notes" in panel.banner.value
    panel.close()


def test_oom_banner_names_the_request_and_finds_what_fits():
    panel = FitPanel(wide, device="T4", cap="80 MiB")
    p = predict(wide, device="T4", cap="80 MiB", batch=48)  # wide's default batch
    assert not p.fits and panel.prediction.oom == p.oom
    text = panel.banner.value
    assert "OUT OF MEMORY" in text and f"{p.oom.requested_bytes:,} B" in text and p.oom.op in text
    assert "test_fit_panel.py" in p.oom.line and p.oom.line in text and p.oom.phase in text
    assert panel.area.drawn["oom"][0] == p.oom.event_index  # marked where the request failed
    assert panel.fix_button.layout.display is None
    panel.fix_button.click()
    best = max_batch(wide, device="T4", cap="80 MiB", hi=47)
    assert 1 < best < 48 and f"largest batch that fits under this config: {best}" in panel.fix_html.value
    fitting = [c or "default" for c in panel.configs if predict(wide, device="T4", cap="80 MiB", alloc_conf=c).fits]
    assert (f"configs that fit: {', '.join(fitting)}" if fitting else "no config fits") in panel.fix_html.value
    assert not panel.out.outputs
    panel.close()


def test_bad_input_shows_one_line_and_changes_nothing(panel):
    before, banner = panel.prediction, panel.banner.value
    panel.target.cap.value = "lots"
    assert panel.error_text.startswith("cap: ") and "lots" in panel.error_text
    panel.target.cap.value = "20 GiB"
    assert "more than the target GPU" in panel.error_text
    panel.target.device.value = "custom size"
    panel.target.custom.value = "big"
    assert panel.error_text.startswith("custom GPU size: ")
    assert panel.prediction is before and panel.banner.value == banner
    assert 'class="memviz-error"' in panel.status.value and not panel.out.outputs


def test_the_programs_own_error_is_shown_and_the_last_result_stays():
    panel = FitPanel(picky)
    before = panel.prediction
    panel.args.widgets["batch"].value = 500
    assert "the program raised ValueError: batch 500 is more than this program takes" in panel.error_text
    assert "memviz.predict: the program stopped" in panel.error_text
    assert panel.prediction is before and not panel.out.outputs
    panel.args.widgets["batch"].value = 50
    assert panel.error_text == "" and panel.prediction is not before
    panel.close()


def test_configs_side_by_side(panel):
    panel.configs = ("", "expandable_segments:True")
    panel.configs_button.click()
    for conf in panel.configs:
        p = expected(alloc_conf=conf)
        assert f"<code>{conf or 'default'}</code></td><td>yes</td><td>{memviz.format_bytes(p.peak_reserved_bytes)}" in (
            panel.configs_html.value)
    assert not panel.out.outputs


def test_configs_follow_every_change_once_ticked(panel):
    panel.configs = ("", "expandable_segments:True")
    panel.configs_auto.value = True
    shown = panel.configs_html.value
    assert memviz.format_bytes(expected(alloc_conf="expandable_segments:True").peak_reserved_bytes) in shown
    panel.args.widgets["batch"].value = 1024
    p = expected(alloc_conf="expandable_segments:True", batch=1024)
    assert panel.configs_html.value != shown and memviz.format_bytes(p.peak_reserved_bytes) in panel.configs_html.value
    assert len(panel.refresh_seconds) == 2 and not panel.out.outputs


def test_largest_batch_on_each_gpu_is_max_batch():
    panel = FitPanel(wide, cap="64 MiB")  # the cap binds on both devices
    rows = panel.largest_batches(("T4", "A100-80GB"))
    want = max_batch(wide, device="T4", cap="64 MiB")
    assert [r.largest_batch for r in rows] == [want, want] and want > 1
    assert f"<td>{want}</td>" in panel.batches_html.value
    panel.close()


def test_progress_bar_moves_while_predicting_and_hides_after():
    def many(batch: int = 1, n: int = 1100) -> None:
        xs = [torch.empty(1024, device="cuda") for _ in range(n)]
        del xs

    panel = FitPanel(many)
    seen = []
    panel.progress.observe(lambda change: seen.append(change["new"]), names="value")
    panel.args.widgets["n"].value = 1200
    assert any(v >= 1024 for v in seen) and panel.progress.layout.visibility == "hidden"
    panel.close()


def test_real_run_button_only_with_a_gpu(panel):
    shown = panel.real_button.layout.display is None
    assert shown == memviz.cuda_available()


def test_fit_panel_is_exported():
    assert memviz.fit_panel is fit_panel
    with pytest.raises(TypeError, match="batch_arg='nope' is not a parameter"):
        fit_panel(train, batch_arg="nope")


needs_gpu = pytest.mark.skipif(not memviz.cuda_available(), reason="needs a CUDA GPU")


def _within(predicted: int, measured: int, share: float) -> bool:
    return abs(predicted - measured) <= share * measured


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("held_mib", [0, 1024], ids=["fresh", "notebook-holds-1GiB"])
def test_run_for_real_matches_the_prediction_and_frees_everything(held_mib):
    # a notebook's own tensor: subtracted from the peaks, and the cap is the program's own (2 GiB would
    # leave the program 1 GiB, less than it needs, if the held bytes counted against it)
    held = torch.empty(held_mib << 20, dtype=torch.uint8, device="cuda")
    base = torch.cuda.memory_allocated()
    fraction = torch.cuda.get_per_process_memory_fraction()
    panel = FitPanel(train, cap="2 GiB", batch=256)
    result = panel.run_real()
    predicted, measured = result["predicted"], result["measured"]
    print(f"held {held_mib} MiB: predicted {predicted.peak_allocated_bytes:,} / {predicted.peak_reserved_bytes:,} B, "
          f"measured {measured.peak_allocated_bytes:,} / {measured.peak_reserved_bytes:,} B (allocated / reserved)")
    assert measured.fits and predicted.fits, measured.oom_message
    # the targets (#12): peak reserved within 5% worst; allocated held to the same
    assert _within(predicted.peak_reserved_bytes, measured.peak_reserved_bytes, 0.05), result
    assert _within(predicted.peak_allocated_bytes, measured.peak_allocated_bytes, 0.05), result
    assert measured.peak_allocated_bytes > 1 << 30  # the run was measured, not the held tensor
    assert "predicted vs measured" in panel.real_html.value and not panel.out.outputs
    assert torch.cuda.memory_allocated() == base  # nothing of the run stays pinned
    assert torch.cuda.get_per_process_memory_fraction() == fraction
    panel.close()
    del held


@pytest.mark.cuda
@needs_gpu
def test_run_for_real_out_of_memory_under_a_small_cap_leaves_the_process_usable():
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    fraction = torch.cuda.get_per_process_memory_fraction()
    panel = FitPanel(train, cap="1 GiB", batch=256)  # 67.5 M parameters x 16 B (weight, grad, 2 states) > 1 GiB
    result = panel.run_real()
    predicted, measured = result["predicted"], result["measured"]
    print(f"cap 1 GiB: predicted fits={predicted.fits}, measured: {measured.oom_message[:200]}")
    assert not predicted.fits and not measured.fits
    assert "Tried to allocate" in measured.oom_message and measured.oom_message in panel.real_html.value
    assert measured.peak_reserved_bytes <= 1 << 30
    assert torch.cuda.memory_allocated() == base  # the failed run's tensors were freed with its traceback
    assert torch.cuda.get_per_process_memory_fraction() == fraction
    big = torch.ones(2 << 30, dtype=torch.uint8, device="cuda")  # the cap is lifted: 2 GiB > the 1 GiB cap
    assert int(big[-1]) == 1
    del big
    panel.target.cap.value = "4 GiB"  # then the same panel runs for real again, and fits
    again = panel.run_real()
    assert again["measured"].fits and _within(again["predicted"].peak_reserved_bytes,
                                              again["measured"].peak_reserved_bytes, 0.05)  # fmt: skip
    assert torch.cuda.memory_allocated() == base
    panel.close()


# ---- a torchrun program: several ranks


class Net(nn.Module):
    def __init__(self, width: int, token: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, width), nn.Linear(width, 10)
        self.token = nn.Parameter(torch.zeros(1, token))  # first dimension 1: FSDP2 gives it to rank 0 alone

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x))) + self.token.mean()


def sharded(batch: int = 64, width: int = 1001, token: int = 1 << 22) -> None:
    """A torchrun script's main() under FSDP2: 1001 rows shard as 251, 251, 251, 248 over 4 ranks, and the token's
    16 MiB (and its 32 MiB of AdamW state) live on rank 0 alone."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    mesh = init_device_mesh("cuda", (int(os.environ["WORLD_SIZE"]),))
    model = Net(width, token).cuda()
    for layer in (model.up, model.down):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        model(torch.randn(batch, width, device="cuda")).sum().backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


PAD = ' style="padding:0 8px;text-align:left"'  # the per-rank table's cells
MiB = 1 << 20


def test_a_job_of_four_ranks_predicts_each_rank_and_groups_those_that_agree():
    panel = FitPanel(sharded, device="H200", world_size=4)
    want = predict(sharded, device="H200", world_size=4, rank="all")
    assert [(panel.ranks[r].peak_allocated_bytes, panel.ranks[r].peak_reserved_bytes) for r in range(4)] == [
        (want[r].peak_allocated_bytes, want[r].peak_reserved_bytes) for r in range(4)]
    assert want.groups() == [[0], [1, 2], [3]]  # rank 0 holds the token, rank 3 three rows fewer
    table = panel.ranks_html.value
    for group in want.groups():
        p = want[group[0]]
        cells = (f"<td{PAD}>yes</td><td{PAD}>{exact_bytes(p.peak_allocated_bytes)}</td>"
                 f"<td{PAD}>{exact_bytes(p.peak_reserved_bytes)}</td>")
        assert cells in table
    assert f"<td{PAD}>1–2</td>" in table and "4 ranks, 3 different results" in table
    assert "every rank fits</b> (4 ranks)" in panel.banner.value
    assert f"rank {want.worst_rank}'s, {memviz.format_bytes(want.peak_reserved_bytes)}" in panel.banner.value
    outside = want[0].outside  # an estimate, apart from the peaks: the context and NCCL's buffers
    assert outside.nccl_bytes > 0 and f"= {memviz.format_bytes(outside.total_bytes)}" in table
    assert "an estimate, not in the peaks above" in table and escape(outside.basis) in table
    assert "tight" not in table  # an H200 has room for NCCL beside these peaks; a 1 GiB GPU has not:
    small = predict(sharded, device="1 GiB", world_size=2, rank=0)
    assert small.fits and small.peak_reserved_bytes + small.outside.total_bytes > 1024 * MiB
    assert "tight</b>: peak reserved" in outside_html(small)
    assert panel.gauges.title.startswith("rank 0 of 4 · NVIDIA H200")
    assert_shows(panel, want[0])
    assert panel.real_button.layout.display == "none" and panel.job.rank.layout.display is None
    with pytest.raises(ValueError, match="run for real plays one GPU"):
        panel.run_real()

    refreshes = len(panel.refresh_seconds)
    panel.job.rank.value = 3  # the rank picker redraws, it does not predict
    assert panel.prediction is panel.ranks[3] and len(panel.refresh_seconds) == refreshes
    assert_shows(panel, want[3])
    assert panel.gauges.title.startswith("rank 3 of 4 · ") and "rank 3 of 4 · segment map" in panel.map_note.value
    assert f'<tr style="font-weight:600"><td{PAD}>3</td>' in panel.ranks_html.value

    panel.job.world_size.value = 2  # fewer ranks: the picker follows, the shown rank goes back to 0
    assert list(panel.job.rank.options) == [0, 1] and panel.prediction is panel.ranks[0]
    assert_shows(panel, predict(sharded, device="H200", world_size=2, rank=0))
    panel.close()


def test_the_rank_that_runs_out_of_memory_first():
    panel = FitPanel(sharded, device="H200", cap="262 MiB", world_size=4)
    want = predict(sharded, device="H200", cap="262 MiB", world_size=4, rank="all")
    assert [want[r].fits for r in range(4)] == [False, True, True, True]  # rank 0's token and its AdamW state
    assert "rank 0 of 4 runs out of memory first (1 of 4 ranks run out: rank 0)" in panel.banner.value
    assert f"{want[0].oom.requested_bytes:,} B" in panel.banner.value and "OOM, first" in panel.ranks_html.value
    assert panel.fix_button.layout.display is None
    panel.configs = ("",)
    (row,) = panel.compare_configs()  # the row is the job's: every rank under that config
    assert row.prediction.world_size == 4 and [row.prediction[r].fits for r in range(4)] == [False, True, True, True]
    assert row.prediction.peak_reserved_bytes == want.peak_reserved_bytes
    assert "<td><code>default</code></td><td>OOM</td>" in panel.configs_html.value
    panel.close()

    tighter = predict(sharded, device="H200", cap="236 MiB", world_size=4, rank="all")
    assert not any(tighter[r].fits for r in range(4))
    # every rank runs out in the second step's forward; rank 0 (the token's 32 MiB of AdamW state) one request in,
    # the others a few requests later, though their own logs are shorter (no token state) and number it earlier
    assert tighter[0].oom.event_index > tighter[1].oom.event_index
    assert first_oom_rank(tighter) == 0


def test_a_torchrun_program_at_one_gpu_says_to_set_the_ranks():
    panel = FitPanel(sharded, device="H200")
    assert panel.prediction is None and panel.job.rank.layout.display == "none"
    assert "the program raised ValueError: Error initializing torch.distributed" in panel.error_text
    assert "set GPUs (ranks) to the job's number of ranks" in panel.error_text
    panel.job.world_size.value = 2
    assert panel.error_text == "" and panel.ranks.world_size == 2 and panel.settings()[0]["world_size"] == 2
    panel.close()
    with pytest.raises(ValueError, match="world_size must be an int from 1 to 64"):
        FitPanel(sharded, world_size=65)


def test_lesson_10s_recorded_figures_are_copies_of_the_recordings():
    import gzip
    import json
    from importlib.resources import files
    from pathlib import Path

    data = Path(__file__).parents[1] / "evaluation" / "recordings"
    shipped = json.loads(files("memviz.data").joinpath("h200_fit.json").read_text())
    for run_id, run in shipped["runs"].items():
        recorded = json.loads(gzip.decompress((data / "h200" / f"{run_id}.json.gz").read_bytes()))
        assert (run["program"], run["kwargs"], run["alloc_conf"], run["fits"]) == (
            recorded["program"], recorded["kwargs"], recorded["alloc_conf"], recorded["fits"])
        for key in ("allocated", "reserved", "requested"):
            assert run[f"peak_{key}_bytes"] == recorded["peaks"][f"{key}_bytes"], (run_id, key)
    cliffs = {c["id"]: c for c in json.loads((data / "h200_max_batch.json").read_text())}
    for cliff_id, cliff in shipped["max_batch"].items():
        assert cliff == {k: cliffs[cliff_id][k] for k in cliff}
    events = json.loads(gzip.decompress((data / "h200" / "resnet18-b64.json.gz").read_bytes()))["events"]
    largest = sorted({e[2] for e in events if e[0] == "alloc"}, reverse=True)[:3]
    assert shipped["workspaces"]["resnet18_b64_largest_requests_bytes"] == largest


def test_lesson_12s_recorded_figures_are_copies_of_the_recordings():
    import gzip
    import json
    from importlib.resources import files
    from pathlib import Path

    from evaluation import lesson_data

    shipped_text = files("memviz.data").joinpath("h200_dist.json").read_text()
    assert shipped_text == lesson_data.dumps(lesson_data.build())  # python -m evaluation.lesson_data writes it
    shipped = json.loads(shipped_text)
    runs = Path(__file__).parents[1] / "evaluation" / "recordings" / "dist" / "runs"
    recorded = json.loads(gzip.decompress((runs / "dist-mlp-ddp-ws4-r3.json.gz").read_bytes()))
    rank = shipped["runs"]["dist-mlp-ddp-ws4"]["ranks"]["3"]
    assert (rank["peak_allocated_bytes"], rank["peak_reserved_bytes"]) == (
        recorded["stats"]["allocated_bytes.all.peak"], recorded["stats"]["reserved_bytes.all.peak"])
    last = recorded["steps"][-1]
    assert ", ".join(map(str, rank["ddp_rebuilt_bucket_sizes"])) == last["ddp"][0]["rebuilt_bucket_sizes"]
    assert rank["steps"][-1][1] == last["stats"]["reserved_bytes.all.peak"]
    assert rank["process_gpu_bytes"] == recorded["process_gpu"]["used_bytes"]
    every_rank = list(runs.parent.parent.glob("dist*/runs/*.json.gz"))
    assert sum(len(run["ranks"]) for run in shipped["runs"].values()) == len(every_rank) == 94
    assert len(shipped_text.encode()) < 64 << 10  # a lesson's figures, not the recordings

"""evaluation/record_programs.py (the recorder of the Hugging Face programs) and the two plans it records: what
runs here without a GPU. The programs themselves run on the CPU through ``record_programs.py --cpu-check``
(minutes, so not in the suite); the recordings need the H200."""

import inspect
import math
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from evaluation import record_programs as rp

H200_TOTAL_BYTES = 150_109_880_320  # the H200's total_memory, as tests/data/fit/h200/*.json.gz record it


@pytest.mark.parametrize(("name", "prefix"), [("evaluation.programs.hf", "hf-"),
                                              ("evaluation.programs.hf_heldout", "hfho-"),
                                              ("evaluation.programs.hf_heldout2", "hfho2-")])
def test_plans_load_and_use_every_program(name, prefix):
    module = rp.load_plan(name)  # checks ids, programs, keyword arguments, caps
    entries = [*module.RUNS, *module.CHAINS]
    assert all(e["id"].startswith(prefix) for e in entries)
    assert {e["program"] for e in entries} == set(module.PROGRAMS)
    for fn in module.PROGRAMS.values():
        params = inspect.signature(fn).parameters
        assert "batch" in params and params["device"].default == "cuda"
        assert set(module.CPU_CHECK) & set(params) >= {"batch", "device"}
    assert sum(r["cap_gib"] is None for r in module.RUNS) > len(module.RUNS) / 2  # mostly uncapped peaks
    assert any(r["alloc_conf"] == "expandable_segments:True" for r in module.RUNS)


@pytest.mark.parametrize("held_out", ["evaluation.programs.hf_heldout", "evaluation.programs.hf_heldout2"])
def test_held_out_set_shares_no_run_and_says_it_is_held_out(held_out):
    dev, held = rp.load_plan("evaluation.programs.hf"), rp.load_plan(held_out)
    assert not {e["id"] for e in [*dev.RUNS, *dev.CHAINS]} & {e["id"] for e in [*held.RUNS, *held.CHAINS]}
    assert "never use these programs" in held.__doc__


@pytest.fixture
def plan_module(tmp_path, monkeypatch):
    """A function writing a plan module (a one-program PROGRAMS, then the given body) under tmp_path; it returns
    the module's name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(body: str) -> str:
        name = f"plan_{uuid.uuid4().hex}"  # a fresh name: import caches modules by name
        (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
            def prog(batch: int, seq: int = 8, device: str = "cuda"):
                pass
            PROGRAMS = {"prog": prog}
        """) + textwrap.dedent(body))
        return name

    return write


@pytest.mark.parametrize(("body", "error"), [
    ('RUNS = [{"id": "a", "program": "nope", "kwargs": {"batch": 1}, "alloc_conf": "", "cap_gib": None}]\nCHAINS = []',
     "no program 'nope'"),
    ('RUNS = [{"id": "a", "program": "prog", "kwargs": {"batch": 1, "width": 3}, "alloc_conf": "", "cap_gib": None}]'
     '\nCHAINS = []', "width"),
    ('RUNS = [{"id": "a", "program": "prog", "kwargs": {"batch": 1}, "alloc_conf": "", "cap_gib": -2}]\nCHAINS = []',
     "cap_gib"),
    ('RUNS = [{"id": "a", "program": "prog", "kwargs": {"batch": 1}, "alloc_conf": "", "cap_gib": None}]\n'
     'CHAINS = [{"id": "a", "program": "prog", "kwargs": {}, "alloc_conf": "", "cap_gib": 8, "start_batch": 4}]',
     "used twice"),
    ('RUNS = []\nCHAINS = [{"id": "c", "program": "prog", "kwargs": {"batch": 2}, "alloc_conf": "", "cap_gib": 8, '
     '"start_batch": 4}]', "must not hold batch"),
    ('RUNS = []', "no CHAINS"),
])
def test_bad_plans_are_refused_by_name(plan_module, body, error):
    with pytest.raises(ValueError, match=error):
        rp.load_plan(plan_module(body))


def test_bad_plan_on_the_command_line_starts_nothing(plan_module, tmp_path):
    name = plan_module('RUNS = [{"id": "a", "program": "nope", "kwargs": {}, "alloc_conf": "", "cap_gib": None}]\n'
                       'CHAINS = []')
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, rp.__file__, "--module", name, "--out", str(out)], capture_output=True,
                          text=True, env={"PYTHONPATH": f"{tmp_path}:{rp.ROOT}", "PATH": ""})
    assert proc.returncode == 2 and "no program 'nope'" in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("truth", [0, 1, 2, 3, 7, 8, 9, 31, 33, 100, 1000])
@pytest.mark.parametrize("start", [1, 4, 16, 48])
def test_largest_batch_finds_the_boundary_without_repeating_a_try(truth, start):
    tried = []

    def fits(batch):
        tried.append(batch)
        return batch <= truth

    assert rp.largest_batch(fits, start) == {"max_batch": truth}
    assert len(tried) == len(set(tried))
    assert len(tried) <= 2 * abs(truth.bit_length() - start.bit_length()) + start.bit_length() + 4


def test_largest_batch_stops_at_its_limit_and_on_a_failed_try():
    assert rp.largest_batch(lambda b: True, 3, limit=64) == {"max_batch_at_least": 64}
    assert rp.largest_batch(lambda b: None if b > 8 else True, 2) == {"incomplete": True}


@pytest.mark.parametrize("cap_gib", [0.5, 1, 3.7, 8, 12, 139.8])
def test_cap_fraction_is_the_smallest_that_reaches_the_cap(cap_gib):
    cap = rp.cap_bytes(cap_gib)
    f = rp.cap_fraction(cap, H200_TOTAL_BYTES)
    assert int(f * H200_TOTAL_BYTES) >= cap
    assert int(math.nextafter(f, 0) * H200_TOTAL_BYTES) < cap
    with pytest.raises(ValueError):
        rp.cap_fraction(H200_TOTAL_BYTES + 1, H200_TOTAL_BYTES)


def test_trace_events_keep_innermost_and_program_frames():
    program = "/x/evaluation/programs/hf.py"
    snapshot = {"device_traces": [[
        {"action": "segment_alloc", "addr": 4096, "size": 2097152, "frames": [
            {"filename": "/torch/nn/modules/linear.py", "line": 125, "name": "forward"},
            {"filename": program, "line": 40, "name": "gpt2_finetune"}]},
        {"action": "alloc", "addr": 4096, "size": 512, "frames": [
            {"filename": program, "line": 41, "name": "gpt2_finetune"}]},
        {"action": "free_requested", "addr": 4096, "size": 512, "frames": []},
    ]]}
    frames, events = rp.trace_events(snapshot, program)
    assert frames == ["/torch/nn/modules/linear.py:125:forward", f"{program}:40:gpt2_finetune",
                      f"{program}:41:gpt2_finetune"]
    assert events == [["segment_alloc", 4096, 2097152, 0, 1], ["alloc", 4096, 512, 2, 2],
                      ["free_requested", 4096, 512, -1, -1]]


def test_runner_kills_at_the_deadline_and_starts_nothing_after_it(tmp_path):
    runner = rp.Runner(1, time.perf_counter() + 1.5, {"PATH": ""})
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    first = runner.submit(1, sleeper, {}, tmp_path / "a.log", 60)
    second = runner.submit(1, sleeper, {}, tmp_path / "b.log", 60)
    t0 = time.perf_counter()
    assert first.result(timeout=20)["killed"] == "deadline"
    assert second.result(timeout=20) == {"skipped": "deadline"}
    assert time.perf_counter() - t0 < 10
    runner.close()


def test_runner_sets_and_removes_the_allocator_config(tmp_path):
    env = {"PATH": "", "PYTORCH_CUDA_ALLOC_CONF": "x", "PYTORCH_ALLOC_CONF": "y"}
    runner = rp.Runner(2, time.perf_counter() + 60, env)
    show = [sys.executable, "-c", "import os; print(os.environ.get('PYTORCH_CUDA_ALLOC_CONF'), "
            "os.environ.get('PYTORCH_ALLOC_CONF'))"]
    for conf, expected in (("", "None None"), ("expandable_segments:True", "expandable_segments:True None")):
        log = tmp_path / f"{len(conf)}.log"
        assert runner.submit(1, show, rp.child_env(conf), log, 30).result(timeout=30)["rc"] == 0
        assert log.read_text().strip() == expected
    runner.close()

"""evaluation/record_runs.py's logic that needs no GPU: what each part runs, the probe's geometries, and that
every program it records (memviz.examples and the held-out ones) takes the keyword arguments it is given."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "evaluation" / "record_runs.py"


@pytest.fixture(scope="module")
def recorder():
    from evaluation import record_runs

    return record_runs


@pytest.fixture(scope="module")
def geometries(recorder) -> list[dict]:
    """The probe's geometries, built once (it builds four ResNets on the meta device: ~2 s of CPU)."""
    return recorder.conv_geometries()


def test_every_run_and_search_binds_to_its_program(recorder):
    for _, program, kwargs, _, _ in recorder.PLAN + recorder.HELDOUT:
        inspect.signature(recorder._program_module(program).PROGRAMS[program]).bind(**kwargs)
    for _, program, kwargs, _, _, lo, hi in recorder.CHAINS + recorder.HELDOUT_CHAINS:
        assert lo < hi
        inspect.signature(recorder._program_module(program).PROGRAMS[program]).bind(batch=lo, **kwargs)


def test_held_out_ids_are_apart_from_the_fitted_ones(recorder):
    fitted = {r[0] for r in recorder.PLAN} | {c[0] for c in recorder.CHAINS}
    held = [r[0] for r in recorder.HELDOUT] + [c[0] for c in recorder.HELDOUT_CHAINS]
    assert all(i.startswith("ho-") for i in held) and len(set(held)) == len(held)
    assert not fitted & set(held)
    assert not any(i.startswith("ho-") for i in fitted)


def test_probe_geometries_cover_the_programs_convolutions(geometries):
    geoms = geometries
    keys = {(g["c_in"], g["c_out"], g["k"], g["stride"], g["hw"], g["bias"]) for g in geoms}
    # one geometry per shape, groups and layout (a depthwise and a dense convolution may share the rest, and
    # the channels-last probe repeats shapes)
    assert len({(g["c_in"], g["c_out"], g["k"], g["stride"], g["hw"], g["bias"], g.get("groups", 1),
                 g.get("channels_last", False)) for g in geoms}) == len(geoms)
    assert sum(g.get("channels_last", False) for g in geoms) == 16 + 23  # depthwise and ResNet-50's, channels-last
    # the convnet's four 3×3 convolutions with bias (convnet-b128's misses), the ResNet stems at both sizes
    assert {(3, 64, 3, 1, 64, True), (64, 128, 3, 1, 32, True), (128, 256, 3, 1, 16, True),
            (256, 512, 3, 1, 8, True)} <= keys
    assert {(3, 64, 7, 2, 224, False), (3, 64, 7, 2, 160, False)} <= keys
    # ResNet-50's 1×1 downsample at 224² and 160² (its input is the 56² / 40² map)
    assert {(64, 256, 1, 1, 56, False), (64, 256, 1, 1, 40, False)} <= keys
    assert sum("grid" in g["sources"] for g in geoms) == 8
    assert {(3, 384, 16, 16, 224, True), (3, 96, 4, 4, 224, True)} <= keys  # patchify stems
    assert sum("stem-s2" in g["sources"] for g in geoms) == 4
    # the held-out MobileNetV2's distinct convolutions (probe6), its 3×3/2 stem one of the stem-s2 ones
    mobilenet = [g for g in geoms if "mobilenetv2-224" in g["sources"]]
    assert len(mobilenet) == 30 and sum(g.get("groups", 1) > 1 for g in mobilenet) == 10


def test_dry_run_lists_only_the_parts_asked(recorder, geometries, monkeypatch, capsys):
    def dry(*args: str) -> dict:
        """The script's main() in this process (the ResNets and torch are built already), its stdout as JSON."""
        monkeypatch.setattr(sys, "argv", [str(SCRIPT), *args, "--dry-run"])
        recorder.main()
        return json.loads(capsys.readouterr().out)

    new = dry("--parts", "probe2,heldout,heldout-chains")
    assert new["chains"] == [] and all(r.startswith("ho-") for r in new["runs"]) and new["heldout_chains"]
    assert sorted(new["probes"]) == sorted(f"{b}-{d}" for b in (32, 128, 256, 96, 192) for d in ("float32", "bfloat16"))
    assert new["probe2_geometries"] == len(geometries)
    some = dry("--parts", "probe2", "--probe-sources", "patchify,stem-s2")
    assert some["probe2_geometries"] == 8 and some["runs"] == []


def test_dry_run_from_the_command_line():
    """The script as run (no probe2 asked: no torch, a tenth of a second): its JSON, and argparse's exit 2."""
    out = subprocess.run([sys.executable, str(SCRIPT), "--parts", "plan,chains,probe", "--dry-run"],
                         capture_output=True, text=True, check=True).stdout
    old = json.loads(out)
    assert old["probes"] == ["probe"] and old["heldout_chains"] == [] and "resnet18-b64" in old["runs"]
    assert old["probe2_geometries"] == 0
    bad = subprocess.run([sys.executable, str(SCRIPT), "--parts", "plan,nope", "--dry-run"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "nope" in bad.stderr

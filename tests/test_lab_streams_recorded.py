"""The lab on the simulator against the H200: lesson 11's two recorded programs, phase by phase.

memviz/data/h200_streams.json holds scripts/record_streams.py's H200 runs of ``graphs_shared_pool`` and
``cross_stream_30mib`` (default config). Each is replayed here through ``Lab(backend="sim")``, the matmuls as
the allocations they make (the output, then cuBLAS's 32 MiB workspace the first time a stream runs one), and
after each phase the lab's ``memory_stats()`` and segments (private or not, stream, size, blocks' size and state)
must equal the recording's: the four keys the lesson cites, and against tests/data/streams/ every one of the 122
keys, under the default config and ``expandable_segments:True``.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from importlib.resources import files
from pathlib import Path

import pytest

from memviz.lab import Lab

RECORDED = json.loads(files("memviz.data").joinpath("h200_streams.json").read_text())
FULL_RECORDINGS = Path(__file__).parent / "data" / "streams"  # the H200 runs (all 122 keys), compacted: its README
WORKSPACE = "32 MiB"  # cuBLAS's workspace on the H200, per stream (the recording's 32 MiB blocks)
TENSOR = "4 MiB"  # a 1024 x 1024 float32 tensor


def state(lab: Lab, keys: list[str]) -> tuple[dict, list]:
    names = {sid: name for name, sid in lab.streams.items()} if lab.streams else {0: "default"}
    segments = sorted((tuple(s["segment_pool_id"]) != (0, 0), names[s["stream"]], s["total_size"],
                       [(b["size"], b["state"]) for b in s["blocks"]]) for s in lab.segments())
    stats = lab.stats()
    return {k: stats[k] for k in keys}, segments


def recorded_state(phase: dict) -> tuple[dict, list]:
    segments = sorted((tuple(s["segment_pool_id"]) != (0, 0), s["stream"], s["total_size"],
                       [(b["size"], b["state"]) for b in s["blocks"]]) for s in phase["segments"])
    return phase["stats"], segments


def graphs_shared_pool(lab: Lab) -> Iterator[str]:
    lab.allocate(TENSOR, name="w")
    lab.allocate(TENSOR, name="x")
    lab.allocate(TENSOR, name="mm0")  # (x @ w): the output, then the default stream's workspace
    lab.allocate(WORKSPACE, name="workspace_default")
    lab.allocate(TENSOR, name="warm")  # .relu()
    lab.free("mm0", "warm")
    yield "inputs, eager warm-up"
    with lab.capture("g1"):  # y1 = (x @ w).relu()
        lab.allocate(TENSOR, name="mm1")
        lab.allocate(WORKSPACE, name="workspace_capture")
        lab.allocate(TENSOR, name="y1")
        lab.free("mm1")
    yield "g1 captured"
    with lab.capture("g2", pool="g1"):  # y2 = (y1 @ w).relu() + 1
        lab.allocate(TENSOR, name="mm2")
        lab.allocate(TENSOR, name="r2")
        lab.free("mm2")
        lab.allocate(TENSOR, name="y2")
        lab.free("r2")
    yield "g2 captured into the same pool"
    for _ in range(3):
        lab.replay("g1")
        lab.replay("g2")
    lab.synchronize()
    yield "replayed"
    lab.delete_graph("g1")
    lab.empty_cache()
    yield "g1 deleted, empty_cache"
    lab.delete_graph("g2")
    lab.free("y1", "y2")
    lab.empty_cache()
    yield "g2 and outputs deleted, empty_cache"


def cross_stream_30mib(lab: Lab) -> Iterator[str]:
    lab.new_stream("side")
    lab.allocate("30 MiB", name="x")
    lab.free("x")
    yield "30 MiB freed on the default stream"
    lab.allocate("30 MiB", name="y", stream="side")
    yield "30 MiB asked on the side stream"
    lab.queue_work("default", 60)
    lab.record_stream("y", "default")
    lab.free("y")
    yield "side block freed with a use on the busy default stream (pending)"
    lab.allocate("30 MiB", name="z", stream="side")
    yield "asked again on the side stream while pending"
    lab.synchronize()
    lab.allocate("30 MiB", name="w", stream="side")
    yield "synchronize, asked again on the side stream"
    lab.allocate("30 MiB", name="v")
    yield "30 MiB asked on the default stream"
    lab.queue_work("default", 60)
    lab.record_stream("z", "default")
    lab.free("z", "w", "v")
    lab.empty_cache()
    yield "empty_cache with a free pending"


PROGRAMS: dict[str, Callable] = {"graphs_shared_pool": graphs_shared_pool, "cross_stream_30mib": cross_stream_30mib}


@pytest.mark.parametrize("program", PROGRAMS)
def test_the_lab_on_the_simulator_is_the_h200_after_every_phase(program):
    phases = RECORDED[program]["phases"]
    keys = list(phases[0]["stats"])
    lab = Lab(backend="sim", device="H200")
    names = []
    for name, phase in zip(PROGRAMS[program](lab), phases, strict=True):
        assert name == phase["name"]
        assert state(lab, keys) == recorded_state(phase), name
        names.append(name)
    assert len(names) == len(phases)


@pytest.mark.parametrize("config", ["default", "expandable"])
@pytest.mark.parametrize("program", PROGRAMS)
def test_every_stat_key_and_segment_equals_the_full_recording(program, config):
    data = json.loads(gzip.decompress((FULL_RECORDINGS / f"{program}-{config}.json.gz").read_bytes()))
    names = {sid: name for name, sid in data["streams"].items()}
    lab = Lab(backend="sim", device="H200", alloc_conf=data["alloc_conf"])
    for name, phase in zip(PROGRAMS[program](lab), data["phases"], strict=True):
        segments = [{**s, "stream": names[s["stream"]]} for s in phase["segments"]]
        want = recorded_state({"stats": phase["stats"], "segments": segments})
        assert state(lab, list(phase["stats"])) == want, name

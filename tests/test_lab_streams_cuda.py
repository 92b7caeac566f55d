"""On a real GPU, the lab's streams, record_stream, MemPool and CUDA graphs give the simulator's stats.

The scenario runs in a fresh process (``python tests/test_lab_streams_cuda.py`` prints a JSON report): once on
``Lab(backend="cuda")``, through torch's own ``Stream``, ``record_stream``, ``MemPool`` / ``use_mem_pool`` and
``torch.cuda.graph``, and once on the simulator of the same device; after every step it compares the full
``memory_stats()`` and the segments (place, size, block states). After every step of the GPU's run it also replays
the lab's op log (``lab.ops``, what every what-if of the lab replays) through a fresh simulator of the device and
compares its reserved, allocated and active bytes and its segment and device-call counts with the GPU's.
Skipped without CUDA.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest

from memviz.backends import cuda_available
from memviz.lab import Lab
from memviz.sim import CachingAllocator, replay

MiB = 1 << 20
LOG_KEYS = ("reserved_bytes.all.current", "allocated_bytes.all.current", "active_bytes.all.current",
            "segment.all.current", "allocation.all.current", "num_device_alloc", "num_device_free")


def _capture(lab: Lab, name: str, pool: str | None, sizes: list[tuple[str, str]], free: tuple[str, ...] = ()) -> None:
    with lab.capture(name, pool=pool):
        for tensor, size in sizes:
            lab.allocate(size, name=tensor)
        if free:
            lab.free(*free)


STEPS: list[tuple[str, Callable[[Lab], object]]] = [
    ("new stream", lambda lab: lab.new_stream("side")),
    ("30 MiB on side", lambda lab: lab.allocate("30 MiB", name="x", stream="side")),
    ("free it", lambda lab: lab.free("x")),
    ("30 MiB on default", lambda lab: lab.allocate("30 MiB", name="y")),
    ("record y on side, side busy", lambda lab: (lab.record_stream("y", "side"), lab.queue_work("side", 3))),
    ("free y: pending", lambda lab: lab.free("y")),
    ("30 MiB again: not y's block", lambda lab: lab.allocate("30 MiB", name="z")),
    ("synchronize", lambda lab: lab.synchronize("side")),
    ("1 MiB: y's free completes", lambda lab: lab.allocate("1 MiB", name="w")),
    ("free all, empty_cache", lambda lab: (lab.free_all(), lab.empty_cache())),
    ("pool p", lambda lab: lab.new_pool("p")),
    ("8 MiB in p, 8 MiB outside", lambda lab: (lab.allocate("8 MiB", name="a", pool="p"),
                                               lab.allocate("8 MiB", name="b"))),
    ("free both, empty_cache", lambda lab: (lab.free("a", "b"), lab.empty_cache())),
    ("release p", lambda lab: lab.release_pool("p")),
    ("1 MiB in a new pool q, released", lambda lab: (lab.new_pool("q"), lab.allocate("1 MiB", name="c", pool="q"),
                                                      lab.release_pool("q"))),
    ("free c, empty_cache", lambda lab: (lab.free("c"), lab.empty_cache())),
    ("capture g1", lambda lab: _capture(lab, "g1", None, [("ws", "32 MiB"), ("tmp", "4 MiB"), ("y1", "4 MiB")],
                                        free=("tmp",))),
    ("capture g2 into g1's pool", lambda lab: _capture(lab, "g2", "g1", [("y2", "4 MiB")])),
    ("replay both", lambda lab: (lab.replay("g1"), lab.replay("g2"))),
    ("delete g1, empty_cache", lambda lab: (lab.delete_graph("g1"), lab.empty_cache())),
    ("delete g2, free outputs, empty_cache", lambda lab: (lab.delete_graph("g2"), lab.free("y1", "y2"),
                                                          lab.empty_cache())),
]


def run(backend: str) -> list[dict]:
    lab = Lab(backend=backend)
    out = []
    for label, step in STEPS:
        step(lab)
        segments = sorted((lab.place_of(s), s["total_size"], [b["state"] for b in s["blocks"]])
                          for s in lab.segments())
        sim = CachingAllocator(lab.backend.total_memory_bytes, alloc_conf=lab.backend.alloc_conf)
        failure = replay(list(lab.ops), sim).failure
        out.append({"step": label, "stats": dict(lab.stats()), "segments": segments, "log_failure": failure,
                    "log_stats": {k: sim.memory_stats()[k] for k in LOG_KEYS}})
    return out


def report() -> dict:
    cuda, sim = run("cuda"), run("sim")
    diffs = []
    for real, simulated in zip(cuda, sim, strict=True):
        keys = sorted(k for k in set(real["stats"]) | set(simulated["stats"])
                      if real["stats"].get(k) != simulated["stats"].get(k))
        if keys or real["segments"] != simulated["segments"]:
            diffs.append({"step": real["step"], "stats": {k: [real["stats"].get(k), simulated["stats"].get(k)]
                                                          for k in keys},
                          "segments": [real["segments"], simulated["segments"]]})
    log_diffs = [{"step": r["step"], "failure": r["log_failure"],
                  "stats": {k: [r["stats"].get(k), r["log_stats"][k]] for k in LOG_KEYS
                            if r["stats"].get(k) != r["log_stats"][k]}}
                 for r in cuda if r["log_failure"] or any(r["stats"].get(k) != r["log_stats"][k] for k in LOG_KEYS)]
    return {"steps": len(cuda), "diffs": diffs, "log_diffs": log_diffs, "final_cuda": cuda[-1]["segments"],
            "reserved_cuda": [r["stats"].get("reserved_bytes.all.current") for r in cuda]}


@pytest.mark.cuda
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")
def test_lab_streams_pools_and_graphs_match_the_simulator_on_cuda():
    done = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    print(json.dumps(result, indent=1))
    assert result["steps"] == len(STEPS)
    assert result["diffs"] == []
    assert result["log_diffs"] == []  # the op log's replay is the GPU's lab, step by step


if __name__ == "__main__":
    print(json.dumps(report()))

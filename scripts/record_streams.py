"""Record the truth for streams, CUDA graphs and private pools on a real GPU (issue 18), one fresh process per run.

    python3 scripts/record_streams.py --out DIR [--only NAME] [--configs default,expandable]

Each program of ``PROGRAMS`` runs alone in a new process under each config (``PYTORCH_CUDA_ALLOC_CONF`` set
before torch starts: ``""`` and ``"expandable_segments:True"``), with ``_record_memory_history("all",
context=None)`` on from the start. After every phase it keeps ``torch.cuda.memory_stats()`` and
``torch.cuda.memory._snapshot()`` (segments with ``stream`` and ``segment_pool_id``, the trace with each
entry's ``stream``). Each run writes ``DIR/<program>-<config>.json.gz``::

    {"program", "alloc_conf", "torch", "device_name", "total_bytes",
     "streams": {"side": int, ...}  (the cudaStream_t values the trace shows),
     "phases": [{"name", "stats": {...}, "snapshot": {...}}, ...], "error": null | str}

and ``DIR/summary.json`` lists the runs. The simulator's counterparts are tests/test_sim_torch_ported.py
and tests/test_sim_streams.py; the recordings become golden tests next (replayed through
``memviz.snapshots.check_fidelity`` and compared phase by phase with ``memory_stats()``).

The programs (each names what it settles; "UNCONFIRMED" = read in the C++, never run):

- ``side_stream_training``: a training loop whose batches are copied on a side stream (pinned memory,
  ``non_blocking``) and used on the default stream after ``record_stream``.
- ``cross_stream_30mib``: 30 MiB blocks freed on one stream and asked for on another (separate caches), with
  and without ``synchronize`` in between, then ``empty_cache`` with frees still pending.
- ``record_stream_oom``: test_cuda.py's test_caching_allocator_record_stream_oom under a 2 GiB cap: pending frees
  released by the OOM retry (``num_sync_all_streams``, ``num_alloc_retries``).
- ``graphs_shared_pool``: two CUDA graphs captured into one pool (``graph_pool_handle()``), replayed, the first
  deleted, ``empty_cache``, the second deleted, ``empty_cache`` (what stays: cuBLAS's workspace, outputs).
- ``mempool_use``: ``MemPool`` + ``use_mem_pool``: order and 1 MiB-boundary cases, ``empty_cache`` inside the
  context, nested pools, deleting the pool (``releasePool`` + ``emptyCache(id)``: does it sync? UNCONFIRMED).
- ``mempool_record_stream``: a ``record_stream`` free inside ``use_mem_pool``: deferred as during a capture in
  2.11 (``captures_underway`` is not empty) or not? UNCONFIRMED.
- ``allocator_settings``: ``_set_allocator_settings`` sequences: which options a call resets, expandable
  segments included; ``get_per_process_memory_fraction``; the OOM observer's arguments.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MiB = 1 << 20
CONFIGS = {"default": "", "expandable": "expandable_segments:True"}


def _plain(obj: object) -> object:
    """Snapshot data as JSON: tuples to lists, frames dropped (context=None records none anyway)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items() if k != "frames"}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


class Recorder:
    """Keeps memory_stats() and _snapshot() after each phase of one program."""

    def __init__(self, torch: object) -> None:
        self.torch = torch
        self.phases: list[dict] = []
        self.streams: dict[str, int] = {}

    def phase(self, name: str) -> None:
        torch = self.torch
        torch.cuda.synchronize()
        self.phases.append({"name": name, "stats": dict(torch.cuda.memory_stats()),
                            "snapshot": _plain(torch.cuda.memory._snapshot())})

    def stream(self, name: str, stream: object) -> object:
        self.streams[name] = int(stream.cuda_stream)
        return stream


def side_stream_training(torch, rec: Recorder) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    side = rec.stream("side", torch.cuda.Stream())
    host = [torch.randn(256 + 64 * (k % 3), 1024).pin_memory() for k in range(6)]
    rec.phase("setup")
    for step, cpu_batch in enumerate(host):
        with torch.cuda.stream(side):
            batch = cpu_batch.to("cuda", non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)
        batch.record_stream(torch.cuda.current_stream())
        loss = model(batch).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del batch, loss
        rec.phase(f"step {step}")
    torch.cuda.empty_cache()
    rec.phase("empty_cache")


def cross_stream_30mib(torch, rec: Recorder) -> None:
    side = rec.stream("side", torch.cuda.Stream())
    n = 30 * MiB
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    del x
    rec.phase("30 MiB freed on the default stream")
    with torch.cuda.stream(side):
        y = torch.empty(n, dtype=torch.uint8, device="cuda")
    rec.phase("30 MiB asked on the side stream")
    y.record_stream(torch.cuda.current_stream())
    del y
    rec.phase("freed with a use on the default stream (pending)")
    with torch.cuda.stream(side):
        z = torch.empty(n, dtype=torch.uint8, device="cuda")
    rec.phase("asked again on the side stream")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        w = torch.empty(n, dtype=torch.uint8, device="cuda")
    rec.phase("after synchronize")
    z.record_stream(torch.cuda.current_stream())
    del z, w
    torch.cuda.empty_cache()
    rec.phase("empty_cache with a free pending")


def record_stream_oom(torch, rec: Recorder) -> None:
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(2 * (1 << 30) / total)
    stream = rec.stream("side", torch.cuda.Stream())
    with torch.cuda.stream(stream):
        y = torch.zeros(40 * MiB, device="cuda")
    rec.phase("y")
    for _ in range(100):
        x = torch.empty(40 * MiB, device="cuda")
        with torch.cuda.stream(stream):
            y += x
        x.record_stream(stream)
        del x
    rec.phase("100 pending frees")
    del y
    torch.cuda.empty_cache()
    rec.phase("empty_cache")


def graphs_shared_pool(torch, rec: Recorder) -> None:
    w = torch.randn(1024, 1024, device="cuda")
    x = torch.randn(1024, 1024, device="cuda")
    rec.phase("inputs")
    pool = torch.cuda.graph_pool_handle()
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1, pool=pool):
        y1 = (x @ w).relu()
    rec.phase("g1 captured")
    with torch.cuda.graph(g2, pool=pool):
        y2 = (y1 @ w).relu() + 1
    rec.phase("g2 captured into the same pool")
    for _ in range(3):
        g1.replay()
        g2.replay()
    rec.phase("replayed")
    del g1
    torch.cuda.empty_cache()
    rec.phase("g1 deleted, empty_cache")
    del g2, y1, y2
    torch.cuda.empty_cache()
    rec.phase("g2 and outputs deleted, empty_cache")


def mempool_use(torch, rec: Recorder) -> None:
    pool = torch.cuda.MemPool()
    outside = torch.empty(MiB, dtype=torch.uint8, device="cuda")  # exactly 1 MiB: the small pool
    with torch.cuda.use_mem_pool(pool):
        a = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        b = torch.empty(MiB + 512, dtype=torch.uint8, device="cuda")  # just over: the large pool
    rec.phase("1 MiB and 1 MiB + 512 in the pool, 1 MiB outside")
    del a
    c = torch.empty(MiB, dtype=torch.uint8, device="cuda")  # outside: not served by the pool's free block
    rec.phase("pool block freed, same size asked outside")
    with torch.cuda.use_mem_pool(pool):
        torch.cuda.empty_cache()
    rec.phase("empty_cache inside use_mem_pool")
    torch.cuda.empty_cache()
    rec.phase("empty_cache outside, pool alive")
    inner = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        d = torch.empty(20 * MiB, dtype=torch.uint8, device="cuda")
        with torch.cuda.use_mem_pool(inner):
            e = torch.empty(20 * MiB, dtype=torch.uint8, device="cuda")
    rec.phase("nested pools")
    del b, d, e
    del pool, inner
    rec.phase("pools deleted")
    torch.cuda.empty_cache()
    rec.phase("empty_cache")
    del outside, c


def mempool_record_stream(torch, rec: Recorder) -> None:
    side = rec.stream("side", torch.cuda.Stream())
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        a = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        original = a.data_ptr()
        with torch.cuda.stream(side):
            a.record_stream(side)
            _ = a + 1
        del a, _
        torch.cuda.synchronize()
        b = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        rec.phase(f"reused: {b.data_ptr() == original}")
        del b
    rec.phase("context left")


def allocator_settings(torch, rec: Recorder) -> None:
    seen = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *args: seen.append(list(args)))
    settings = torch.cuda.memory._set_allocator_settings
    for conf in ("max_split_size_mb:64", "roundup_power2_divisions:4", "garbage_collection_threshold:0.5",
                 "expandable_segments:True", "max_split_size_mb:40", ""):
        settings(conf)
        x = torch.empty(21 * MiB + 1, dtype=torch.uint8, device="cuda")
        rec.phase(f"after _set_allocator_settings({conf!r})")
        del x
        torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(0.25)
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    rec.phases[-1]["fraction"] = getter() if getter is not None else None
    try:
        torch.empty(1 << 40, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as error:
        rec.phases[-1]["oom_message"] = str(error)
    rec.phase("oom")
    rec.phases[-1]["oom_observer"] = seen


PROGRAMS = {f.__name__: f for f in (side_stream_training, cross_stream_30mib, record_stream_oom, graphs_shared_pool,
                                   mempool_use, mempool_record_stream, allocator_settings)}


def run_one(name: str, out: Path) -> None:
    """The child: run one program (config from the environment) and write its file."""
    import torch

    torch.cuda.init()
    torch.cuda.memory._record_memory_history("all", context=None, stacks="python")
    rec = Recorder(torch)
    error = None
    try:
        PROGRAMS[name](torch, rec)
    except Exception as exc:  # the recording so far is kept, with what stopped it
        error = f"{type(exc).__name__}: {exc}"
    props = torch.cuda.get_device_properties(0)
    data = {"program": name, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "torch": torch.__version__,
            "device_name": props.name, "total_bytes": props.total_memory, "streams": rec.streams,
            "phases": rec.phases, "error": error}
    with gzip.open(out, "wt") as f:
        json.dump(data, f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--only", choices=sorted(PROGRAMS), help="one program only")
    parser.add_argument("--configs", default="default,expandable", help="comma-separated: default, expandable")
    parser.add_argument("--child", nargs=2, metavar=("PROGRAM", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_one(args.child[0], Path(args.child[1]))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    summary = []
    for name in [args.only] if args.only else PROGRAMS:
        for label in args.configs.split(","):
            conf = CONFIGS[label]
            path = args.out / f"{name}-{label}.json.gz"
            env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": conf}
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, __file__, "--out", str(args.out), "--child", name, str(path)],
                                  env=env, capture_output=True, text=True, timeout=300)
            summary.append({"program": name, "config": label, "file": path.name, "rc": proc.returncode,
                            "seconds": round(time.perf_counter() - start, 1), "stderr": proc.stderr[-2000:]})
            print(f"{name:24s} {label:10s} rc={proc.returncode} {summary[-1]['seconds']:6.1f} s", flush=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

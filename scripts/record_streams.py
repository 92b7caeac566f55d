"""Record the truth for streams, CUDA graphs and private pools on a real GPU (issue 18), one fresh process per run.

    python3 scripts/record_streams.py --out DIR [--deadline-s 220] [--jobs 4] [--only NAME,...]
                                      [--configs default,expandable]

Each program of ``PROGRAMS`` runs alone in a new process under each config (``PYTORCH_CUDA_ALLOC_CONF`` set
before torch starts: unset, or ``"expandable_segments:True"``; ``PYTORCH_ALLOC_CONF`` removed), with
``_record_memory_history("all", context=None)`` on from the start. A program is a sequence of phases; after
each one the run keeps ``torch.cuda.memory_stats()``, ``torch.cuda.mem_get_info()`` and
``torch.cuda.memory._snapshot()`` (segments with ``stream`` and ``segment_pool_id``, the trace with each
entry's ``stream``; frames dropped). A phase that raises keeps its error (``"error"``) and the program goes on
with the next phase. Nothing here synchronizes unless the program says so: a pending ``record_stream`` free
stays pending until the program's own ``synchronize`` or the allocator's event query finds it done (the
trace's ``free_completed`` says when). Each run writes, after every phase (atomically),
``DIR/<program>-<config>.json.gz``::

    {"program", "config", "alloc_conf", "torch", "cuda", "device_name", "total_bytes", "cycles_per_ms",
     "streams": {"default": int, "side": int, ...}  (the cudaStream_t values the trace shows),
     "pools": {"pool": [int, int], ...}  (MemPool / graph pool ids, as segment_pool_id shows them),
     "phases": [{"name", "error", "notes", "stats", "mem_get_info", "snapshot"}, ...],
     "error": null | str  (what stopped the program outside any phase), "done": bool}

``DIR/summary.json`` lists the runs (return code, seconds, stderr tail); ``DIR/<program>-<config>.log`` holds
each child's stdout and stderr. The whole run stops starting programs, and kills the running ones, at
``--deadline-s`` seconds (default 220): a killed run keeps the phases it wrote.

The programs (each names what it settles; "UNCONFIRMED" = read in the C++, never run):

- ``side_stream_training``: a training loop whose batches are copied on a side stream (pinned memory,
  ``non_blocking``) and used on the default stream after ``record_stream``.
- ``cross_stream_30mib``: 30 MiB blocks freed on one stream and asked for on another (separate caches); a free
  kept pending by a ``_sleep`` on the default stream, with and without ``synchronize`` before the next ask;
  then ``empty_cache`` with a free still pending (``synchronize_and_free_events``).
- ``record_stream_oom``: test_cuda.py's test_caching_allocator_record_stream_oom under a 2 GiB cap: pending frees
  released by the OOM retry (``num_sync_all_streams``, ``num_alloc_retries``).
- ``graphs_shared_pool``: two CUDA graphs captured into one pool (``graph_pool_handle()``), replayed, the first
  deleted, ``empty_cache``, the second deleted, ``empty_cache`` (what stays: cuBLAS's workspace, outputs).
- ``mempool_use``: ``MemPool`` + ``use_mem_pool``: 1 MiB / 1 MiB + 512 B, a pool's free block not serving an
  outside request, ``empty_cache`` inside and outside the context, nested pools, deleting the pools
  (``releasePool`` + ``emptyCache(id)``).
- ``mempool_devlog``: the devlog "When does fragmentation occur in the CUDA caching allocator?" cases, each in
  a fresh MemPool: small-then-large vs large-then-small allocation order before a bigger request, and the 1 MiB
  boundary (1 MiB blocks freed, then a 2 MiB / 1 MiB + 1 B request that the small pool cannot serve).
- ``mempool_record_stream``: a ``record_stream`` free inside ``use_mem_pool``: deferred as during a capture in
  2.11 (``captures_underway`` is not empty) or not? UNCONFIRMED.
- ``allocator_settings``: ``_set_allocator_settings`` sequences: which options a call resets, expandable
  segments included; ``get_per_process_memory_fraction``; the OOM observer's arguments; the OOM message.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import gzip
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

MiB = 1 << 20
CONFIGS = {"default": "", "expandable": "expandable_segments:True"}
SLEEP_MS = 300  # how long a _sleep keeps a stream busy, so that a free recorded on it is still pending


def _plain(obj: object) -> object:
    """Snapshot data as JSON: tuples to lists, frames dropped (context=None records none anyway)."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items() if k != "frames"}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:4000]


class Recorder:
    """Runs one program's phases and keeps memory_stats(), mem_get_info() and _snapshot() after each."""

    def __init__(self, torch: object, path: Path, meta: dict) -> None:
        self.torch = torch
        self.path = path
        self.data = {**meta, "streams": {}, "pools": {}, "phases": [], "error": None, "done": False}
        self.cycles_per_ms = meta["cycles_per_ms"]

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[dict]:
        """Run the body as phase ``name``; an exception in it is kept as the phase's error, not raised.

        Yields the phase's ``notes`` dict (JSON values the program wants kept)."""
        entry = {"name": name, "error": None, "notes": {}}
        try:
            yield entry["notes"]
        except Exception as exc:  # the phase's error is data; the program goes on
            entry["error"] = _error(exc)
        self._measure(entry)
        self.data["phases"].append(entry)
        self.write()

    def _measure(self, entry: dict) -> None:
        cuda = self.torch.cuda
        measures = (("stats", lambda: dict(cuda.memory_stats())), ("mem_get_info", lambda: list(cuda.mem_get_info())),
                    ("snapshot", lambda: _plain(cuda.memory._snapshot())))
        for key, get in measures:
            try:
                entry[key] = get()
            except Exception as exc:
                entry[key] = None
                entry.setdefault("measure_errors", {})[key] = _error(exc)

    def stream(self, name: str, stream: object) -> object:
        """Name a stream (its cudaStream_t is kept) and return it."""
        self.data["streams"][name] = int(stream.cuda_stream)
        return stream

    def pool(self, name: str, pool_id: object) -> None:
        """Name a private pool by its id (``MemPool.id``, ``graph_pool_handle()``, ``CUDAGraph.pool()``)."""
        self.data["pools"][name] = [int(v) for v in pool_id]

    def sleep(self) -> None:
        """Keep the current stream busy for SLEEP_MS (``torch.cuda._sleep``)."""
        self.torch.cuda._sleep(int(SLEEP_MS * self.cycles_per_ms))

    def write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with gzip.open(tmp, "wt") as f:
            json.dump(self.data, f, default=repr)
        os.replace(tmp, self.path)


def side_stream_training(torch, rec: Recorder) -> None:
    with rec.phase("setup"):
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        side = rec.stream("side", torch.cuda.Stream())
        host = [torch.randn(256 + 64 * (k % 3), 1024).pin_memory() for k in range(6)]
    for step in range(6):
        with rec.phase(f"step {step}"):
            with torch.cuda.stream(side):
                batch = host[step].to("cuda", non_blocking=True)
            torch.cuda.current_stream().wait_stream(side)
            batch.record_stream(torch.cuda.current_stream())
            loss = model(batch).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del batch, loss
    with rec.phase("synchronize, empty_cache"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def cross_stream_30mib(torch, rec: Recorder) -> None:
    n = 30 * MiB
    with rec.phase("30 MiB freed on the default stream"):
        side = rec.stream("side", torch.cuda.Stream())
        x = torch.empty(n, dtype=torch.uint8, device="cuda")
        del x
    with rec.phase("30 MiB asked on the side stream"), torch.cuda.stream(side):
        y = torch.empty(n, dtype=torch.uint8, device="cuda")
    with rec.phase("side block freed with a use on the busy default stream (pending)"):
        rec.sleep()
        y.record_stream(torch.cuda.current_stream())
        del y
    with rec.phase("asked again on the side stream while pending"), torch.cuda.stream(side):
        z = torch.empty(n, dtype=torch.uint8, device="cuda")
    with rec.phase("synchronize, asked again on the side stream"):
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            w = torch.empty(n, dtype=torch.uint8, device="cuda")
    with rec.phase("30 MiB asked on the default stream"):
        v = torch.empty(n, dtype=torch.uint8, device="cuda")
    with rec.phase("empty_cache with a free pending"):
        rec.sleep()
        z.record_stream(torch.cuda.current_stream())
        del z, w, v
        torch.cuda.empty_cache()


def record_stream_oom(torch, rec: Recorder) -> None:
    with rec.phase("y on the side stream under a 2 GiB cap"):
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(2 * (1 << 30) / total)
        stream = rec.stream("side", torch.cuda.Stream())
        with torch.cuda.stream(stream):
            y = torch.zeros(40 * MiB, device="cuda")
    with rec.phase("100 record_stream frees"):
        for _ in range(100):
            x = torch.empty(40 * MiB, device="cuda")
            with torch.cuda.stream(stream):
                y += x
            x.record_stream(stream)
            del x
    with rec.phase("empty_cache"):
        del y
        torch.cuda.empty_cache()


def graphs_shared_pool(torch, rec: Recorder) -> None:
    with rec.phase("inputs, eager warm-up"):
        rec.stream("default", torch.cuda.current_stream())
        w = torch.randn(1024, 1024, device="cuda")
        x = torch.randn(1024, 1024, device="cuda")
        warm = (x @ w).relu()  # cuBLAS handle and the default stream's workspace, before any capture
        del warm
    with rec.phase("g1 captured"):
        pool = torch.cuda.graph_pool_handle()
        rec.pool("shared", pool)
        g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(g1, pool=pool):
            y1 = (x @ w).relu()
        rec.stream("capture", torch.cuda.graph.default_capture_stream)
        rec.pool("g1", g1.pool())
    with rec.phase("g2 captured into the same pool"):
        with torch.cuda.graph(g2, pool=pool):
            y2 = (y1 @ w).relu() + 1
        rec.pool("g2", g2.pool())
    with rec.phase("replayed"):
        for _ in range(3):
            g1.replay()
            g2.replay()
        torch.cuda.synchronize()
    with rec.phase("g1 deleted, empty_cache"):
        del g1
        torch.cuda.empty_cache()
    with rec.phase("g2 and outputs deleted, empty_cache"):
        del g2, y1, y2
        torch.cuda.empty_cache()


def mempool_use(torch, rec: Recorder) -> None:
    with rec.phase("1 MiB and 1 MiB + 512 in the pool, 1 MiB outside"):
        pool = torch.cuda.MemPool()
        rec.pool("pool", pool.id)
        outside = torch.empty(MiB, dtype=torch.uint8, device="cuda")  # exactly 1 MiB: the small pool
        with torch.cuda.use_mem_pool(pool):
            a = torch.empty(MiB, dtype=torch.uint8, device="cuda")
            b = torch.empty(MiB + 512, dtype=torch.uint8, device="cuda")  # just over: the large pool
    with rec.phase("pool block freed, same size asked outside"):
        del a
        c = torch.empty(MiB, dtype=torch.uint8, device="cuda")  # outside: not served by the pool's free block
    with rec.phase("empty_cache inside use_mem_pool"), torch.cuda.use_mem_pool(pool):
        torch.cuda.empty_cache()
    with rec.phase("empty_cache outside, pool alive"):
        torch.cuda.empty_cache()
    with rec.phase("nested pools"):
        inner = torch.cuda.MemPool()
        rec.pool("inner", inner.id)
        with torch.cuda.use_mem_pool(pool):
            d = torch.empty(20 * MiB, dtype=torch.uint8, device="cuda")
            with torch.cuda.use_mem_pool(inner):
                e = torch.empty(20 * MiB, dtype=torch.uint8, device="cuda")
    with rec.phase("tensors freed, pools alive"):
        del b, d, e
    with rec.phase("pools deleted"):
        del pool, inner
    with rec.phase("empty_cache"):
        torch.cuda.empty_cache()
    with rec.phase("outside tensors freed, empty_cache"):
        del outside, c
        torch.cuda.empty_cache()


def mempool_devlog(torch, rec: Recorder) -> None:
    def empty(n: int) -> object:
        return torch.empty(n, dtype=torch.uint8, device="cuda")

    pools = {}
    for order, sizes in (("small then large", (8 * MiB, 64 * MiB)), ("large then small", (64 * MiB, 8 * MiB))):
        with rec.phase(f"{order}: in a new pool, each asked then freed"):
            pools[order] = pool = torch.cuda.MemPool()
            rec.pool(order, pool.id)
            with torch.cuda.use_mem_pool(pool):
                for n in sizes:  # each freed before the next is asked
                    t = empty(n)
                    del t
        with rec.phase(f"{order}: 72 MiB asked in the pool"), torch.cuda.use_mem_pool(pool):
            big = empty(72 * MiB)
        with rec.phase(f"{order}: 72 MiB freed, 64 MiB then 8 MiB asked"):
            del big
            with torch.cuda.use_mem_pool(pool):
                again = [empty(64 * MiB), empty(8 * MiB)]
        with rec.phase(f"{order}: freed"):
            del again
    with rec.phase("1 MiB boundary: eight 1 MiB blocks in a new pool, freed"):
        pools["boundary"] = pool = torch.cuda.MemPool()
        rec.pool("boundary", pool.id)
        with torch.cuda.use_mem_pool(pool):
            ones = [empty(MiB) for _ in range(8)]
            del ones
    with rec.phase("1 MiB boundary: 2 MiB asked in the pool"), torch.cuda.use_mem_pool(pool):
        two = empty(2 * MiB)
    with rec.phase("1 MiB boundary: 1 MiB + 1 B asked in the pool"), torch.cuda.use_mem_pool(pool):
        over = empty(MiB + 1)
    with rec.phase("1 MiB boundary: 1 MiB asked in the pool"), torch.cuda.use_mem_pool(pool):
        one = empty(MiB)
    with rec.phase("all freed, empty_cache with the pools alive"):
        del two, over, one
        torch.cuda.empty_cache()
    with rec.phase("pools deleted, empty_cache"):
        pools.clear()
        del pool
        torch.cuda.empty_cache()


def mempool_record_stream(torch, rec: Recorder) -> None:
    with rec.phase("1 MiB in the pool used on a side stream, freed"):
        side = rec.stream("side", torch.cuda.Stream())
        pool = torch.cuda.MemPool()
        rec.pool("pool", pool.id)
        ctx = torch.cuda.use_mem_pool(pool)
        ctx.__enter__()
        a = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        original = a.data_ptr()
        with torch.cuda.stream(side):
            a.record_stream(side)
            a.add_(1)
        del a
    with rec.phase("synchronize, same size asked in the pool") as notes:
        torch.cuda.synchronize()
        b = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        notes["reused"] = b.data_ptr() == original
        del b
    with rec.phase("context left"):
        ctx.__exit__(None, None, None)
    with rec.phase("same size asked outside the pool") as notes:
        c = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        notes["reused"] = c.data_ptr() == original
        del c


def allocator_settings(torch, rec: Recorder) -> None:
    seen = []
    with rec.phase("OOM observer attached"):
        torch._C._cuda_attach_out_of_memory_observer(lambda *args: seen.append([repr(a) for a in args]))
    for conf in ("max_split_size_mb:64", "roundup_power2_divisions:4", "garbage_collection_threshold:0.5",
                 "expandable_segments:True", "max_split_size_mb:40", ""):
        with rec.phase(f"_set_allocator_settings({conf!r}), 21 MiB + 1 B"):
            torch.cuda.memory._set_allocator_settings(conf)
            x = torch.empty(21 * MiB + 1, dtype=torch.uint8, device="cuda")
        with rec.phase(f"_set_allocator_settings({conf!r}): freed, empty_cache"):
            del x
            torch.cuda.empty_cache()
    with rec.phase("set_per_process_memory_fraction(0.25)") as notes:
        torch.cuda.set_per_process_memory_fraction(0.25)
        notes["fraction"] = torch.cuda.get_per_process_memory_fraction()
    with rec.phase("1 TiB asked: OOM") as notes:
        try:
            torch.empty(1 << 40, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError as error:
            notes["oom_message"] = str(error)
        notes["oom_observer"] = seen


PROGRAMS = {f.__name__: f for f in (side_stream_training, cross_stream_30mib, record_stream_oom, graphs_shared_pool,
                                   mempool_use, mempool_devlog, mempool_record_stream, allocator_settings)}


def _cycles_per_ms(torch) -> float:
    """GPU clock cycles per ms of ``torch.cuda._sleep`` (as test_cuda's get_cycles_per_ms); 2e6 if unmeasurable."""
    try:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        end.synchronize()
        return 10_000_000 / start.elapsed_time(end)
    except Exception:
        return 2e6


def run_one(name: str, config: str, out: Path) -> None:
    """The child: run one program (config from the environment) and write its file after every phase."""
    import torch

    meta = {"program": name, "config": config, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
            "device_name": None, "total_bytes": None, "cycles_per_ms": 2e6,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    rec = Recorder(torch, out, meta)
    try:
        torch.cuda.init()
        props = torch.cuda.get_device_properties(0)
        rec.data.update(device_name=props.name, total_bytes=props.total_memory, cycles_per_ms=_cycles_per_ms(torch))
        rec.cycles_per_ms = rec.data["cycles_per_ms"]
        rec.stream("default", torch.cuda.current_stream())
        torch.cuda.memory._record_memory_history("all", context=None, stacks="python")
        PROGRAMS[name](torch, rec)
    except Exception as exc:  # outside any phase: the recording so far is kept, with what stopped it
        rec.data["error"] = _error(exc)
    rec.data["done"] = True
    rec.write()


def _run_child(name: str, label: str, out: Path, deadline: float) -> dict:
    path = out / f"{name}-{label}.json.gz"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    if CONFIGS[label]:
        env["PYTORCH_CUDA_ALLOC_CONF"] = CONFIGS[label]
    start = time.monotonic()
    left = deadline - start
    row = {"program": name, "config": label, "file": path.name, "rc": None, "seconds": 0.0, "stderr": ""}
    if left < 5:
        row["rc"] = "skipped: deadline"
        return row
    log = out / f"{name}-{label}.log"
    with open(log, "w") as f:
        try:
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", name, label, str(path)],
                                  env=env, stdout=f, stderr=subprocess.STDOUT, timeout=left)
            row["rc"] = proc.returncode
        except subprocess.TimeoutExpired:
            row["rc"] = "killed: deadline"
    row["seconds"] = round(time.monotonic() - start, 1)
    row["stderr"] = log.read_text(errors="replace")[-2000:]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="output directory (required unless --child)")
    parser.add_argument("--only", help="comma-separated program names (default: all)")
    parser.add_argument("--configs", default="default,expandable", help="comma-separated: default, expandable")
    parser.add_argument("--deadline-s", type=float, default=220.0, help="wall-time limit of the whole run, seconds")
    parser.add_argument("--jobs", type=int, default=4, help="programs run at once (each its own process)")
    parser.add_argument("--child", nargs=3, metavar=("PROGRAM", "CONFIG", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_one(args.child[0], args.child[1], Path(args.child[2]))
        return
    if args.out is None:
        parser.error("--out is required")
    deadline = time.monotonic() + args.deadline_s
    names = args.only.split(",") if args.only else list(PROGRAMS)
    labels = args.configs.split(",")
    for bad in [n for n in names if n not in PROGRAMS] + [c for c in labels if c not in CONFIGS]:
        parser.error(f"unknown program or config: {bad}")
    args.out.mkdir(parents=True, exist_ok=True)
    summary: list[dict] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(_run_child, name, label, args.out, deadline) for name in names for label in labels]
        for future in concurrent.futures.as_completed(futures):
            row = future.result()
            summary.append(row)
            print(f"{row['program']:24s} {row['config']:10s} rc={row['rc']} {row['seconds']:6.1f} s", flush=True)
            (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    ok = sum(row["rc"] == 0 for row in summary)
    print(f"{ok} of {len(summary)} runs exited 0; results in {args.out}", flush=True)


if __name__ == "__main__":
    main()

"""Record single-snapshot truth for streams, CUDA graphs and MemPools the way users record (issue 27).

    python3 scripts/record_snapshots.py --out DIR [--deadline-s 150] [--jobs 6] [--only NAME,...]
                                        [--configs default,expandable] [--list]

Each program of ``PROGRAMS`` runs alone in a new process under each config (``PYTORCH_CUDA_ALLOC_CONF`` set before
torch starts: unset, or ``"expandable_segments:True"``; ``PYTORCH_ALLOC_CONF`` removed) the way a user records a
run: ``torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")`` before the program, the
program, then ONE ``torch.cuda.memory._dump_snapshot()`` at the end. Nothing is told the device's size, and no
other snapshot is taken: what ``memviz.snapshots`` can replay from that one file is the question.

Beside each snapshot, in a SEPARATE file the replay never reads, the truth to check it against: after every phase
``torch.cuda.memory_stats()`` and ``torch.cuda.mem_get_info()``. Phases are marked in the trace itself with
``torch.cuda.memory._set_memory_metadata("<k>:<phase>")`` (each trace entry's ``user_metadata``; nothing is
allocated or recorded by it), so the phase boundary is the last entry of phase ``k``. Files, per program and config:

- ``DIR/<program>-<config>.pickle``: the ``_dump_snapshot`` pickle (read it with ``memviz.snapshots.load_snapshot``).
- ``DIR/<program>-<config>.stats.json``: ``{"program", "config", "alloc_conf", "held_out", "torch", "cuda",
  "python", "device_name", "total_bytes", "phase_markers": "user_metadata" | null, "phases": [{"name", "error",
  "notes", "stats", "mem_get_info"}, ...], "error", "done", "seconds"}`` (written after every phase).
- ``DIR/<program>-<config>.log``: the child's output; ``DIR/summary.json``: every run's return code and time.

The run stops starting programs, and kills the running ones, at ``--deadline-s`` (default 150; the 26 runs take
about 60-90 s on an H200 with 6 at once: each is a torch start, CUDA init and well under a second of work).
``--list`` prints the programs and exits (no GPU needed).

The programs (each names what it settles). ``held_out_*`` were written with the others but never used while
developing the replay: they are the blind check (the acceptance: each held-out recording is replayed exactly or
refused with the right reason, none replayed wrong).

- ``expandable_four_segments``: small and large blocks on the default stream, a side stream and in a live MemPool:
  six expandable segments (the device's size must come from their reservations, not a default).
- ``capture_side_warmup_small``: an ``nn.Linear`` with bias warmed up on a side stream, captured
  (``torch.cuda.graph``, blocks of 1 MiB or less on the capture stream, beside the generator's two 8-byte tensors),
  replayed, the graph deleted and ``empty_cache()`` before the snapshot.
- ``capture_then_share_pool``: one capture without ``pool=``, a second with ``pool=g1.pool()``; both deleted,
  ``empty_cache()``.
- ``mempools_in_turn_same_sizes``: three MemPools used one after another with the same sizes, each alive while the
  next is used, all deleted before the snapshot.
- ``default_beside_live_pools``: allocations in the device's pool interleaved with a live MemPool's.
- ``back_into_pool_with_live_blocks``: a pool left with a live tensor, an allocation outside, the pool entered
  again.
- ``fresh_pool_small_and_2mib``: 1000 B, 2 MiB, 512 KiB and 2 MiB + 1 B requests in a fresh pool.
- ``empty_cache_pools_alive``: ``empty_cache()`` while two pools hold free segments; then the pools deleted.
- ``pools_released_at_once``: three pools used and freed, deleted together, then a request outside.
- ``held_out_graph_into_mempool``: a capture into a MemPool (``pool=mempool.id``) beside eager use of that pool
  (warmed up on a side stream first: without it the 2026-12-04 run's capture failed, cuBLAS setting itself up
  inside it).
- ``held_out_two_side_streams_pools``: two side streams, each in its own MemPool and outside it.
- ``held_out_graphed_callables``: ``torch.cuda.make_graphed_callables`` on a small MLP, a few training steps,
  everything deleted and ``empty_cache()``.
- ``held_out_late_start_pool_outlives``: a model on the GPU before recording starts; a tensor that outlives its
  MemPool; then the same size asked outside.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

MiB = 1 << 20
CONFIGS = {"default": "", "expandable": "expandable_segments:True"}


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:4000]


class Phases:
    """Marks each phase in the trace (``user_metadata``) and keeps ``memory_stats()`` / ``mem_get_info()`` after it."""

    def __init__(self, torch: object, stats_path: Path, meta: dict) -> None:
        self.torch = torch
        self.path = stats_path
        self.data = {**meta, "phases": [], "error": None, "done": False}
        self.mark: Callable[[str], None] | None = (getattr(torch.cuda.memory, "_set_memory_metadata", None)
                                                   or getattr(torch._C, "_cuda_setMemoryMetadata", None))
        self.data["phase_markers"] = "user_metadata" if self.mark is not None else None

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[dict]:
        """Run the body as the next phase; an exception in it is kept as the phase's error, not raised.

        Yields the phase's ``notes`` dict (JSON values the program wants kept)."""
        k = len(self.data["phases"])
        if self.mark is not None:
            self.mark(f"{k}:{name}")
        entry = {"name": name, "error": None, "notes": {}}
        try:
            yield entry["notes"]
        except Exception as exc:  # the phase's error is data; the program goes on
            entry["error"] = _error(exc)
        cuda = self.torch.cuda
        entry["stats"] = dict(cuda.memory_stats())
        entry["mem_get_info"] = list(cuda.mem_get_info())
        self.data["phases"].append(entry)
        self.write()

    def write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, default=repr))
        os.replace(tmp, self.path)


def _empty(torch, n: int, stream: object = None) -> object:
    if stream is None:
        return torch.empty(n, dtype=torch.uint8, device="cuda")
    with torch.cuda.stream(stream):
        return torch.empty(n, dtype=torch.uint8, device="cuda")


# ----------------------------------------------------------------------------------------------------------------
# The programs: each takes torch and the phase marker, and returns what stays alive until the snapshot (a model
# a user keeps, a live pool): the snapshot is taken after the program returns.


def expandable_four_segments(torch, phase: Phases) -> object:
    side = torch.cuda.Stream()
    pool = torch.cuda.MemPool()
    with phase("small and large on two streams and in a pool") as notes:
        held = [_empty(torch, 300 * 1024), _empty(torch, 30 * MiB), _empty(torch, 200 * 1024, side),
                _empty(torch, 24 * MiB, side)]
        with torch.cuda.use_mem_pool(pool):
            held += [_empty(torch, 100 * 1024), _empty(torch, 50 * MiB)]
        notes["streams"] = {"default": int(torch.cuda.current_stream().cuda_stream), "side": int(side.cuda_stream)}
        notes["pool"] = list(pool.id)
    with phase("half freed, more asked"):
        del held[1], held[3]
        held += [_empty(torch, 40 * MiB), _empty(torch, 600 * 1024, side)]
    with phase("freed, empty_cache, pool alive"):
        held.clear()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return pool, side


def capture_side_warmup_small(torch, phase: Phases) -> object:
    with phase("model and input"):
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128)).cuda()
        x = torch.randn(16, 256, device="cuda")
    with phase("warm-up on a side stream"):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                y = model(x)
        torch.cuda.current_stream().wait_stream(side)
        del y
    with phase("captured") as notes:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = model(x)
        notes["pool"] = list(g.pool())
    with phase("replayed"):
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
    with phase("graph and output deleted, empty_cache"):
        del g, out
        torch.cuda.empty_cache()
    return model, x


def capture_then_share_pool(torch, phase: Phases) -> object:
    with phase("inputs"):
        w = torch.randn(512, 512, device="cuda")
        x = torch.randn(512, 512, device="cuda")
        (x @ w).relu()  # the default stream's cuBLAS workspace, before any capture
    with phase("g1 captured without pool=") as notes:
        g1 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g1):
            y1 = (x @ w).relu()
        notes["pool"] = list(g1.pool())
    with phase("g2 captured into g1.pool()"):
        g2 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g2, pool=g1.pool()):
            y2 = (y1 @ w).sigmoid() + 1
    with phase("replayed"):
        g1.replay()
        g2.replay()
        torch.cuda.synchronize()
    with phase("both deleted, empty_cache"):
        del g1, g2, y1, y2
        torch.cuda.empty_cache()
    return w, x


def mempools_in_turn_same_sizes(torch, phase: Phases) -> None:
    pools = []
    for k in range(3):
        with phase(f"pool {k}: 64 MiB, 8 MiB, 512 KiB asked and freed"):
            pool = torch.cuda.MemPool()
            pools.append(pool)
            with torch.cuda.use_mem_pool(pool):
                held = [_empty(torch, 64 * MiB), _empty(torch, 8 * MiB), _empty(torch, 512 * 1024)]
            del held
    with phase("pools deleted, empty_cache"):
        pools.clear()
        del pool
        torch.cuda.empty_cache()


def default_beside_live_pools(torch, phase: Phases) -> None:
    pool = torch.cuda.MemPool()
    held = []
    for k in range(3):
        with phase(f"step {k}: 6 MiB outside, 6 MiB and 300 KiB in the pool"):
            held.append(_empty(torch, 6 * MiB))
            with torch.cuda.use_mem_pool(pool):
                held += [_empty(torch, 6 * MiB), _empty(torch, 300 * 1024)]
            if k:
                del held[0]
    with phase("all freed, pool deleted, empty_cache"):
        held.clear()
        del pool
        torch.cuda.empty_cache()


def back_into_pool_with_live_blocks(torch, phase: Phases) -> None:
    pool = torch.cuda.MemPool()
    with phase("8 MiB kept in the pool, 2 MiB freed there"), torch.cuda.use_mem_pool(pool):
        kept = _empty(torch, 8 * MiB)
        t = _empty(torch, 2 * MiB)
        del t
    with phase("8 MiB outside"):
        outside = _empty(torch, 8 * MiB)
    with phase("back into the pool: 2 MiB and 8 MiB"), torch.cuda.use_mem_pool(pool):
        again = [_empty(torch, 2 * MiB), _empty(torch, 8 * MiB)]
    with phase("all freed, pool deleted, empty_cache"):
        del kept, outside, again
        del pool
        torch.cuda.empty_cache()


def fresh_pool_small_and_2mib(torch, phase: Phases) -> None:
    pool = torch.cuda.MemPool()
    with phase("in a fresh pool: 1000 B, 2 MiB, 512 KiB, 2 MiB + 1 B"), torch.cuda.use_mem_pool(pool):
        held = [_empty(torch, 1000), _empty(torch, 2 * MiB), _empty(torch, 512 * 1024), _empty(torch, 2 * MiB + 1)]
    with phase("two freed, 1 MiB outside"):
        del held[1], held[0]
        outside = _empty(torch, MiB)
    with phase("all freed, pool deleted"):
        del held, outside
        del pool


def empty_cache_pools_alive(torch, phase: Phases) -> None:
    p, q = torch.cuda.MemPool(), torch.cuda.MemPool()
    with phase("30 MiB in p, 10 MiB in q, 30 MiB outside, all freed"):
        with torch.cuda.use_mem_pool(p):
            a = _empty(torch, 30 * MiB)
        with torch.cuda.use_mem_pool(q):
            b = _empty(torch, 10 * MiB)
        c = _empty(torch, 30 * MiB)
        del a, b, c
    with phase("empty_cache with the pools alive"):
        torch.cuda.empty_cache()
    with phase("30 MiB in p again"):
        with torch.cuda.use_mem_pool(p):
            d = _empty(torch, 30 * MiB)
        del d
    with phase("pools deleted"):
        del p, q


def pools_released_at_once(torch, phase: Phases) -> None:
    pools = [torch.cuda.MemPool() for _ in range(3)]
    with phase("three pools: 10, 20, 30 MiB asked and freed"):
        for k, pool in enumerate(pools):
            with torch.cuda.use_mem_pool(pool):
                t = _empty(torch, (k + 1) * 10 * MiB)
            del t
    with phase("deleted together"):
        pools.clear()
        del pool
    with phase("10 MiB outside"):
        x = _empty(torch, 10 * MiB)
        del x


def held_out_graph_into_mempool(torch, phase: Phases) -> object:
    pool = torch.cuda.MemPool()
    with phase("eager use of the pool"):
        w = torch.randn(256, 256, device="cuda")
        with torch.cuda.use_mem_pool(pool):
            a = _empty(torch, 3 * MiB)
            b = _empty(torch, 200 * 1024)
        del b
    with phase("captured into the MemPool"):
        x = torch.randn(64, 256, device="cuda")
        side = torch.cuda.Stream()  # warm-up before capturing, as torch.cuda.graph's docs ask: cuBLAS sets itself
        side.wait_stream(torch.cuda.current_stream())  # up here (in the capture it invalidated the capture on the
        with torch.cuda.stream(side):  # H200 run of 2026-12-04)
            (x @ w).tanh()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool.id):
            y = (x @ w).tanh()
    with phase("replayed, eager use again"):
        g.replay()
        with torch.cuda.use_mem_pool(pool):
            c = _empty(torch, 3 * MiB)
        torch.cuda.synchronize()
    with phase("everything deleted, empty_cache"):
        del g, y, a, c, pool
        torch.cuda.empty_cache()
    return w, x


def held_out_two_side_streams_pools(torch, phase: Phases) -> None:
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    p1, p2 = torch.cuda.MemPool(), torch.cuda.MemPool()
    held = []
    with phase("each side stream in its pool and outside"):
        for s, p in ((s1, p1), (s2, p2)):
            with torch.cuda.use_mem_pool(p):
                held += [_empty(torch, 12 * MiB, s), _empty(torch, 400 * 1024, s)]
            held += [_empty(torch, 12 * MiB, s), _empty(torch, 100 * 1024, s)]
    with phase("half freed, asked again"):
        del held[::2]
        torch.cuda.synchronize()
        with torch.cuda.use_mem_pool(p1):
            held.append(_empty(torch, 12 * MiB, s2))
    with phase("all freed, pools deleted, empty_cache"):
        held.clear()
        torch.cuda.synchronize()
        del p1, p2
        torch.cuda.empty_cache()


def held_out_graphed_callables(torch, phase: Phases) -> None:
    with phase("model, optimizer"):
        model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sample = torch.randn(32, 128, device="cuda", requires_grad=False)
    with phase("make_graphed_callables"):
        graphed = torch.cuda.make_graphed_callables(model, (sample,))
    with phase("three training steps"):
        for _ in range(3):
            loss = graphed(torch.randn(32, 128, device="cuda")).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        del loss
        torch.cuda.synchronize()
    with phase("everything deleted, empty_cache"):
        del graphed, model, opt, sample
        torch.cuda.empty_cache()


def held_out_late_start_pool_outlives(torch, phase: Phases) -> None:
    with phase("a pool's tensor outlives the pool"):
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            kept = _empty(torch, 6 * MiB)
            t = _empty(torch, 700 * 1024)
        del t, pool
    with phase("the same sizes outside"):
        a, b = _empty(torch, 6 * MiB), _empty(torch, 700 * 1024)
    with phase("freed, empty_cache"):
        del kept, a, b
        torch.cuda.empty_cache()


#: program -> (function, whether it is held out, whether recording starts after its first allocations)
PROGRAMS: dict[str, tuple[Callable, bool, bool]] = {
    f.__name__: (f, f.__name__.startswith("held_out_"), f.__name__ == "held_out_late_start_pool_outlives")
    for f in (expandable_four_segments, capture_side_warmup_small, capture_then_share_pool,
              mempools_in_turn_same_sizes, default_beside_live_pools, back_into_pool_with_live_blocks,
              fresh_pool_small_and_2mib, empty_cache_pools_alive, pools_released_at_once, held_out_graph_into_mempool,
              held_out_two_side_streams_pools, held_out_graphed_callables, held_out_late_start_pool_outlives)
}


def run_one(name: str, config: str, out: Path) -> bool:
    """The child: run one program as a user records it (config from the environment); whether nothing stopped it
    outside a phase."""
    start = time.monotonic()
    import torch

    func, held_out, late = PROGRAMS[name]
    meta = {"program": name, "config": config, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            "held_out": held_out, "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": sys.version.split()[0], "device_name": None, "total_bytes": None,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    phases = Phases(torch, out / f"{name}-{config}.stats.json", meta)
    try:
        torch.cuda.init()
        props = torch.cuda.get_device_properties(0)
        phases.data.update(device_name=props.name, total_bytes=props.total_memory)
        before = torch.randn(1024, 1024, device="cuda") if late else None  # a model's weights, before recording
        torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
        kept = func(torch, phases)
        if phases.mark is not None:
            phases.mark("")
        torch.cuda.memory._dump_snapshot(str(out / f"{name}-{config}.pickle"))  # the one snapshot
        torch.cuda.memory._record_memory_history(enabled=None)
        del before, kept
    except Exception as exc:  # outside any phase: what was kept stays, with what stopped it
        phases.data["error"] = _error(exc)
    phases.data["done"] = True
    phases.data["seconds"] = round(time.monotonic() - start, 2)
    phases.write()
    return phases.data["error"] is None


def _run_child(name: str, label: str, out: Path, deadline: float) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    if CONFIGS[label]:
        env["PYTORCH_CUDA_ALLOC_CONF"] = CONFIGS[label]
    start = time.monotonic()
    left = deadline - start
    row = {"program": name, "config": label, "rc": None, "seconds": 0.0, "log_tail": ""}
    if left < 5:
        row["rc"] = "skipped: deadline"
        return row
    log = out / f"{name}-{label}.log"
    with open(log, "w") as f:
        try:
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", name, label, str(out)],
                                  env=env, stdout=f, stderr=subprocess.STDOUT, timeout=left)
            row["rc"] = proc.returncode
        except subprocess.TimeoutExpired:
            row["rc"] = "killed: deadline"
    row["seconds"] = round(time.monotonic() - start, 1)
    row["log_tail"] = log.read_text(errors="replace")[-2000:]
    return row


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="output directory (required unless --list or --child)")
    parser.add_argument("--only", help="comma-separated program names (default: all)")
    parser.add_argument("--configs", default="default,expandable", help="comma-separated: default, expandable")
    parser.add_argument("--deadline-s", type=float, default=150.0, help="wall-time limit of the whole run, seconds")
    parser.add_argument("--jobs", type=int, default=6, help="programs run at once (each its own process)")
    parser.add_argument("--list", action="store_true", help="print the programs and exit")
    parser.add_argument("--child", nargs=3, metavar=("PROGRAM", "CONFIG", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.names = args.only.split(",") if args.only else list(PROGRAMS)
    args.labels = args.configs.split(",")
    for bad in [n for n in args.names if n not in PROGRAMS] + [c for c in args.labels if c not in CONFIGS]:
        parser.error(f"unknown program or config: {bad} (programs: {', '.join(PROGRAMS)})")
    if args.out is None and not args.list and not args.child:
        parser.error("--out is required")
    if args.jobs < 1 or args.deadline_s <= 0:
        parser.error("--jobs must be at least 1 and --deadline-s positive")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        if not run_one(args.child[0], args.child[1], Path(args.child[2])):
            sys.exit(1)  # the stats file says what stopped it
        return
    if args.list:
        for name in args.names:
            _, held_out, late = PROGRAMS[name]
            tags = ", ".join(t for t, on in (("held out", held_out), ("recording starts late", late)) if on)
            print(f"{name}{f'  ({tags})' if tags else ''}")
        return
    deadline = time.monotonic() + args.deadline_s
    args.out.mkdir(parents=True, exist_ok=True)
    summary: list[dict] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(_run_child, name, label, args.out, deadline)
                   for name in args.names for label in args.labels]
        for future in concurrent.futures.as_completed(futures):
            row = future.result()
            summary.append(row)
            print(f"{row['program']:36s} {row['config']:10s} rc={row['rc']} {row['seconds']:6.1f} s", flush=True)
            (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    ok = sum(row["rc"] == 0 for row in summary)
    print(f"{ok} of {len(summary)} runs exited 0; results in {args.out}", flush=True)


if __name__ == "__main__":
    main()

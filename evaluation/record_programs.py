"""Record the real GPU memory of a module's programs, one fresh process per run (a generic recorder).

    python3 evaluation/record_programs.py --module evaluation.programs.hf --out DIR [--jobs 8] [--deadline-s 240]
        [--only ID,...] [--parts runs,chains] [--run-timeout-s 120]
    python3 evaluation/record_programs.py --module evaluation.programs.hf --dry-run
    python3 evaluation/record_programs.py --module evaluation.programs.hf --cpu-check [--jobs 2]

The module exports ``PROGRAMS`` (name -> function with keyword arguments, ``batch`` always), ``RUNS`` (dicts
``id, program, kwargs, alloc_conf, cap_gib``; ``cap_gib`` None: no cap) and ``CHAINS`` (dicts ``id, program,
kwargs`` without batch, ``alloc_conf, cap_gib, start_batch``), optionally ``CPU_CHECK`` (keyword arguments that
replace the plan's for ``--cpu-check``).

Each run is a fresh process (an empty cache): ``PYTORCH_CUDA_ALLOC_CONF`` is set (or removed) before torch
starts; a cap is ``torch.cuda.set_per_process_memory_fraction`` with the smallest fraction ``f`` such that
``int(f * total) >= cap`` (bounding only that process: several processes share the GPU, ``--jobs`` at a
time); the allocator's history is recorded (``_record_memory_history(context="alloc", stacks="python")``)
while the program runs; ``torch.OutOfMemoryError`` is caught and recorded (``fits`` False). Each run writes
``DIR/runs/<id>.json.gz`` in evaluation/record_runs.py's format::

    {"id", "module", "program", "kwargs", "alloc_conf", "cap_bytes" (null: no cap), "total_bytes", "torch",
     "device_name", "fits", "oom": null | {"message" (torch's first line), "step_hint" (the innermost frame in
     the program's file, "file:line:function")},
     "peaks": {"allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes"},
     "stats": torch.cuda.memory_stats() at the end,
     "frames": ["file:line:function", ...],
     "events": [[action, addr, size, frame_index or -1, user_frame_index or -1], ...],
     "seconds" (the program's own time), "free_bytes_at_start" (cudaMemGetInfo's free memory before the program:
     what neighbours left an uncapped run), "versions": {"python", "torch", "transformers", "peft", "accelerate",
     "cuda", "cudnn", "driver"}}

``events`` is ``torch.cuda.memory._snapshot()["device_traces"][0]``: each entry's innermost Python frame and
innermost frame in the program's module file. The program's stdout/stderr go to ``DIR/logs/<id>.log``.

Chains search the largest batch that fits under a cap: the start batch, doubled while it fits (halved while
it does not), then bisection, one fresh process per try (each try is also a run, ``<chain id>-b<batch>``);
results in ``DIR/chains.json`` as record_runs's: ``[{"id", "module", "program", "kwargs", "alloc_conf",
"cap_bytes", "start_batch", "max_batch" (absent unless found: fits at max_batch, not at max_batch + 1),
"incomplete" (when a try failed or the deadline came), "tries": {"batch": fits}}]``. Chain tries go before
the plain runs in the queue, since each chain's tries are sequential.

``--deadline-s`` bounds the whole recording: no process starts after it, running ones are killed then (their
runs are reported, not written); what finished is kept. ``DIR/summary.json`` lists every run (fits, peaks,
wall time, or the error / deadline) and chain.

``--cpu-check`` runs every distinct (program, options) of the plan once on the CPU, with ``CPU_CHECK``'s
keyword arguments (a tiny size, ``device="cpu"``), each in a fresh process with no GPU visible; it exits 1
if any fails. ``--dry-run`` lists what would run and starts nothing.
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import inspect
import itertools
import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from types import ModuleType

GiB = 1 << 30
ROOT = Path(__file__).resolve().parent.parent
PARTS = ("runs", "chains")
MAX_CHAIN_BATCH = 1 << 14
"""A chain stops doubling there and reports ``max_batch_at_least`` (a bound on a search's length)."""


def _record_runs() -> ModuleType:
    """evaluation/record_runs.py (its helpers: one format for every recording; its plan is not run)."""
    from evaluation import record_runs

    return record_runs


# --- the plan -------------------------------------------------------------------------------------------------

def load_plan(module_name: str) -> ModuleType:
    """Import the module and check its plan; a bad plan raises ValueError naming the entry."""
    module = importlib.import_module(module_name)
    for name in ("PROGRAMS", "RUNS", "CHAINS"):
        if not hasattr(module, name):
            raise ValueError(f"{module_name} has no {name}")
    seen: set[str] = set()
    for entry, keys in [(r, ("id", "program", "kwargs", "alloc_conf", "cap_gib")) for r in module.RUNS] + \
            [(c, ("id", "program", "kwargs", "alloc_conf", "cap_gib", "start_batch")) for c in module.CHAINS]:
        missing = [k for k in keys if k not in entry]
        if missing:
            raise ValueError(f"{entry.get('id', entry)}: missing {missing}")
        if entry["id"] in seen:
            raise ValueError(f"{entry['id']}: id used twice")
        seen.add(entry["id"])
        if entry["program"] not in module.PROGRAMS:
            raise ValueError(f"{entry['id']}: no program {entry['program']!r} in {module_name}.PROGRAMS")
        cap = entry["cap_gib"]
        if cap is not None and not (isinstance(cap, int | float) and cap > 0):
            raise ValueError(f"{entry['id']}: cap_gib must be a positive number or None, not {cap!r}")
        kwargs = dict(entry["kwargs"])
        if "start_batch" in keys:
            if "batch" in kwargs:
                raise ValueError(f"{entry['id']}: a chain's kwargs must not hold batch")
            if not (isinstance(entry["start_batch"], int) and entry["start_batch"] >= 1):
                raise ValueError(f"{entry['id']}: start_batch must be an int >= 1")
            kwargs["batch"] = entry["start_batch"]
        try:
            inspect.signature(module.PROGRAMS[entry["program"]]).bind(**kwargs)
        except TypeError as e:
            raise ValueError(f"{entry['id']}: {entry['program']}{tuple(kwargs)}: {e}") from None
        try:
            json.dumps(kwargs)
        except TypeError as e:
            raise ValueError(f"{entry['id']}: kwargs must be JSON: {e}") from None
    return module


def cap_bytes(cap_gib: float | None) -> int | None:
    """A cap in GiB as bytes (None stays None: no cap)."""
    return None if cap_gib is None else int(cap_gib * GiB)


def cap_fraction(cap: int, total_bytes: int) -> float:
    """The smallest fraction ``f`` with ``int(f * total_bytes) >= cap`` (what set_per_process_memory_fraction
    needs for the allocator's limit to be the cap, to the byte or just above)."""
    if not 0 < cap <= total_bytes:
        raise ValueError(f"cap {cap} bytes is not within the device's {total_bytes} bytes")
    fraction = cap / total_bytes
    while int(fraction * total_bytes) < cap:
        fraction = math.nextafter(fraction, 2.0)
    return fraction


# --- one run, in its own process ------------------------------------------------------------------------------

def versions() -> dict:
    """The library versions a recording depends on (None where one is absent or unknown)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import torch

    out: dict = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "peft", "accelerate"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    out["cuda"] = torch.version.cuda
    out["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    out["driver"] = None
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        out["driver"] = smi.stdout.split("\n")[0].strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def trace_events(snapshot: dict, program_file: str) -> tuple[list[str], list[list]]:
    """``(frames, events)`` from a memory snapshot's device trace: each event as ``[action, addr, size,
    innermost frame index, innermost program-file frame index]`` (-1 where there is none)."""
    frame_text = _record_runs()._frame_text
    frames: dict[str, int] = {}
    events = []
    for e in snapshot["device_traces"][0]:
        stack = e.get("frames") or []
        inner = frame_text(stack[0]) if stack else None
        user = next((frame_text(f) for f in stack if f.get("filename") == program_file), None)
        idx = [frames.setdefault(t, len(frames)) if t else -1 for t in (inner, user)]
        events.append([e["action"], e.get("addr", 0), e.get("size", 0), *idx])
    return list(frames), events


def run_one(spec: dict) -> dict:
    """Run one program under the spec's cap with the allocator's history recorded; return the record. To be
    called in a fresh process whose PYTORCH_CUDA_ALLOC_CONF is already the spec's."""
    import torch

    module = importlib.import_module(spec["module"])
    program = module.PROGRAMS[spec["program"]]
    program_file = program.__code__.co_filename  # the name torch's frames carry
    total = torch.cuda.get_device_properties(0).total_memory
    if spec["cap_bytes"] is not None:
        torch.cuda.set_per_process_memory_fraction(cap_fraction(spec["cap_bytes"], total))
    free_at_start = torch.cuda.mem_get_info()[0]
    torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=3_000_000)
    start = time.perf_counter()
    oom = None
    try:
        program(**spec["kwargs"])
        torch.cuda.synchronize()
    except torch.OutOfMemoryError as e:
        hint = [f"{f.filename}:{f.lineno}:{f.name}" for f in traceback.extract_tb(e.__traceback__)
                if f.filename == program_file]
        oom = {"message": str(e).splitlines()[0][:600], "step_hint": hint[-1] if hint else None}
    seconds = time.perf_counter() - start
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(None)
    frames, events = trace_events(snapshot, program_file)
    stats = torch.cuda.memory_stats()
    return {**spec, "total_bytes": total, "torch": torch.__version__, "device_name": torch.cuda.get_device_name(0),
            "fits": oom is None, "oom": oom, "seconds": round(seconds, 3), "free_bytes_at_start": free_at_start,
            "peaks": {"allocated_bytes": stats["allocated_bytes.all.peak"],
                      "reserved_bytes": stats["reserved_bytes.all.peak"],
                      "active_bytes": stats["active_bytes.all.peak"],
                      "requested_bytes": stats["requested_bytes.all.peak"]},
            "stats": stats, "frames": frames, "events": events, "versions": versions()}


def cpu_one(spec: dict) -> None:
    """Run one program as the spec says, on whatever device its kwargs name (the CPU check)."""
    module = importlib.import_module(spec["module"])
    module.PROGRAMS[spec["program"]](**spec["kwargs"])


# --- processes, a queue, a deadline ---------------------------------------------------------------------------

class Runner:
    """``jobs`` worker threads, each running one child process at a time, taking chain tries before runs; no
    process starts after ``stop_at`` (perf_counter seconds) and any still running then is killed."""

    def __init__(self, jobs: int, stop_at: float, env: dict[str, str]):
        self.stop_at = stop_at
        self.env = env
        self.tasks: queue.PriorityQueue = queue.PriorityQueue()
        self.order = itertools.count()
        self.workers = [threading.Thread(target=self._work, daemon=True) for _ in range(jobs)]
        for w in self.workers:
            w.start()

    def submit(self, priority: int, argv: list[str], env: dict[str, str | None], log: Path,
               timeout_s: float) -> Future:
        """Queue a child process (``env`` on top of the runner's; None removes a variable); the future gives
        ``{"rc", "wall_s", "log_tail", "killed"?}`` or ``{"skipped"}``."""
        fut: Future = Future()
        self.tasks.put((priority, next(self.order), (argv, env, log, timeout_s, fut)))
        return fut

    def close(self) -> None:
        for _ in self.workers:
            self.tasks.put((99, next(self.order), None))
        for w in self.workers:
            w.join()

    def _work(self) -> None:
        while (item := self.tasks.get()[2]) is not None:
            argv, env, log, timeout_s, fut = item
            try:
                fut.set_result(self._spawn(argv, env, log, timeout_s))
            except Exception as e:  # a failure to start is the run's result, never the recorder's crash
                fut.set_result({"rc": None, "wall_s": 0.0, "log_tail": f"could not start: {e!r}"})

    def _spawn(self, argv: list[str], env: dict[str, str | None], log: Path, timeout_s: float) -> dict:
        left = self.stop_at - time.perf_counter()
        if left <= 0:
            return {"skipped": "deadline"}
        t0 = time.perf_counter()
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as out:
            merged = {k: v for k, v in {**self.env, **env}.items() if v is not None}
            proc = subprocess.Popen(argv, env=merged, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            killed = None
            try:
                proc.wait(timeout=min(timeout_s, left))
            except subprocess.TimeoutExpired:
                killed = "deadline" if timeout_s > left else f"timeout ({timeout_s:.0f} s)"
                proc.kill()
                proc.wait()
        tail = log.read_text(errors="replace")[-3000:] if proc.returncode else ""
        result = {"rc": proc.returncode, "wall_s": round(time.perf_counter() - t0, 1), "log_tail": tail}
        if killed:
            result["killed"] = killed
        return result


def child_env(alloc_conf: str) -> dict[str, str | None]:
    """What a run's process gets on top of our environment (None: removed): its allocator config, and none
    under torch's newer name, which would take precedence."""
    return {"PYTORCH_CUDA_ALLOC_CONF": alloc_conf or None, "PYTORCH_ALLOC_CONF": None}


def record(runner: Runner, spec: dict, out_dir: Path, priority: int, timeout_s: float) -> Future:
    """Queue one recorded run; the future gives its summary line."""
    path = out_dir / "runs" / f"{spec['id']}.json.gz"
    argv = [sys.executable, str(Path(__file__).resolve()), "--one", json.dumps(spec), "--to", str(path)]
    done: Future = Future()

    def summarize(r: dict) -> dict:
        line: dict = {"id": spec["id"]}
        if "skipped" in r:
            line["skipped"] = r["skipped"]
        elif r["rc"] != 0 or not path.exists():
            line.update(error=r.get("killed") or f"exit {r['rc']}", wall_s=r["wall_s"], log_tail=r["log_tail"])
        else:
            with gzip.open(path, "rt") as f:
                rec = json.load(f)
            line.update(fits=rec["fits"], peaks=rec["peaks"], seconds=rec["seconds"], wall_s=r["wall_s"],
                        events=len(rec["events"]))
            if rec["oom"]:
                line["oom"] = rec["oom"]["message"][:200]
                if rec["cap_bytes"] is None:  # neighbours may have held the memory: rerun alone (--only, --jobs 1)
                    line["uncapped_oom"] = True
        return line

    def finish(fut: Future) -> None:  # a done-callback: whatever happens, ``done`` gets a line
        try:
            line = summarize(fut.result())
        except Exception as e:
            line = {"id": spec["id"], "error": f"recorder: {e!r}"}
        print(json.dumps({k: v for k, v in line.items() if k != "log_tail"}), flush=True)
        done.set_result(line)

    runner.submit(priority, argv, child_env(spec["alloc_conf"]), out_dir / "logs" / f"{spec['id']}.log",
                  timeout_s).add_done_callback(finish)
    return done


def largest_batch(fits: Callable[[int], bool | None], start_batch: int, limit: int = MAX_CHAIN_BATCH) -> dict:
    """Search the largest batch for which ``fits`` is True: from ``start_batch``, doubled while it fits (up to
    ``limit``) or halved while it does not, then bisection. ``fits`` returning None (the try failed) ends the
    search. Returns ``{"max_batch": b}`` (fits at b, not at b + 1; 0 when batch 1 does not fit),
    ``{"max_batch_at_least": limit}``, or ``{"incomplete": True}``."""
    lo, hi = 0, None  # fits at lo (0: none known yet), not at hi
    batch = start_batch
    while True:
        f = fits(batch)
        if f is None:
            return {"incomplete": True}
        if f:
            lo = batch
            if hi is not None:
                break
            if batch >= limit:
                return {"max_batch_at_least": batch}
            batch = min(2 * batch, limit)
        else:
            hi = batch
            if lo or batch == 1:
                break
            batch //= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        f = fits(mid)
        if f is None:
            return {"incomplete": True}
        lo, hi = (mid, hi) if f else (lo, mid)
    return {"max_batch": lo}


def search(chain: dict, module_name: str, runner: Runner, out_dir: Path, timeout_s: float) -> dict:
    """The chain's largest batch under its cap (:func:`largest_batch`), one recorded run per try."""
    tries: dict[int, bool] = {}
    errors: dict[int, str] = {}

    def fits(batch: int) -> bool | None:
        if batch in tries:
            return tries[batch]
        spec = {"id": f"{chain['id']}-b{batch}", "module": module_name, "program": chain["program"],
                "kwargs": {**chain["kwargs"], "batch": batch}, "alloc_conf": chain["alloc_conf"],
                "cap_bytes": cap_bytes(chain["cap_gib"])}
        line = record(runner, spec, out_dir, 0, timeout_s).result()
        if "fits" not in line:
            errors[batch] = line.get("error") or line.get("skipped")
            return None
        tries[batch] = line["fits"]
        return line["fits"]

    result = {"id": chain["id"], "module": module_name, "program": chain["program"], "kwargs": chain["kwargs"],
              "alloc_conf": chain["alloc_conf"], "cap_bytes": cap_bytes(chain["cap_gib"]),
              "start_batch": chain["start_batch"], **largest_batch(fits, chain["start_batch"])}
    if errors:
        result["errors"] = {str(k): v for k, v in errors.items()}
    result["tries"] = {str(k): v for k, v in sorted(tries.items())}
    print(json.dumps({k: result[k] for k in result if k in ("id", "max_batch", "incomplete", "tries")}), flush=True)
    return result


# --- the whole recording --------------------------------------------------------------------------------------

def plan_specs(module: ModuleType, parts: list[str], only: set[str] | None) -> tuple[list[dict], list[dict]]:
    """The run specs and chains to record, in plan order, filtered by ``--parts`` and ``--only``."""
    runs = [{"id": r["id"], "module": module.__name__, "program": r["program"], "kwargs": r["kwargs"],
             "alloc_conf": r["alloc_conf"], "cap_bytes": cap_bytes(r["cap_gib"])}
            for r in module.RUNS if "runs" in parts and (only is None or r["id"] in only)]
    chains = [c for c in module.CHAINS if "chains" in parts and (only is None or c["id"] in only)]
    return runs, chains


def record_all(module: ModuleType, runs: list[dict], chains: list[dict], out_dir: Path, jobs: int,
               deadline_s: float, timeout_s: float) -> dict:
    """Record the runs and chains in parallel under the deadline; write chains.json and summary.json."""
    (out_dir / "runs").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))
    runner = Runner(jobs, t0 + deadline_s, env)
    chain_results: list[dict | None] = [None] * len(chains)

    def drive(i: int) -> None:
        try:
            chain_results[i] = search(chains[i], module.__name__, runner, out_dir, timeout_s)
        except Exception as e:  # kept in the summary; the other chains and runs go on
            chain_results[i] = {"id": chains[i]["id"], "incomplete": True, "error": f"recorder: {e!r}"}

    drivers = [threading.Thread(target=drive, args=(i,)) for i in range(len(chains))]
    for d in drivers:
        d.start()
    run_lines = [record(runner, spec, out_dir, 1, timeout_s) for spec in runs]
    lines = [f.result() for f in run_lines]
    for d in drivers:
        d.join()
    runner.close()
    summary = {"module": module.__name__, "jobs": jobs, "deadline_s": deadline_s,
               "wall_s": round(time.perf_counter() - t0, 1), "runs": lines, "chains": chain_results,
               "counts": {"runs": len(lines), "recorded": sum("fits" in x for x in lines),
                          "errors": sum("error" in x for x in lines), "skipped": sum("skipped" in x for x in lines),
                          "uncapped_oom": sum("uncapped_oom" in x for x in lines),
                          "chains": len(chains), "chains_found": sum("max_batch" in c for c in chain_results)}}
    if chains:
        (out_dir / "chains.json").write_text(json.dumps(chain_results, indent=1))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def cpu_check(module: ModuleType, jobs: int, timeout_s: float, only: set[str] | None = None) -> bool:
    """Every distinct (program, options) of the plan (of the ``only`` ids, if given; programs no entry uses
    with their defaults) once on the CPU at CPU_CHECK's sizes, each in a fresh process with no GPU visible;
    prints one line per check and returns whether all passed."""
    overrides = getattr(module, "CPU_CHECK", {"batch": 1, "device": "cpu"})
    cases: dict[str, dict] = {}
    entries = [(e["program"], e["kwargs"]) for e in [*module.RUNS, *module.CHAINS] if only is None or e["id"] in only]
    if only is None:
        entries += [(name, {}) for name in module.PROGRAMS if name not in {p for p, _ in entries}]
    for program, kwargs in entries:
        params = inspect.signature(module.PROGRAMS[program]).parameters
        call = {**kwargs, **{k: v for k, v in overrides.items() if k in params}}
        call.setdefault("batch", overrides.get("batch", 1))
        cases.setdefault(json.dumps([program, call], sort_keys=True), {"program": program, "kwargs": call})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1")
    runner = Runner(jobs, time.perf_counter() + 3600, env)
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"cpu-check-{os.getpid()}"
    futs = []
    for i, case in enumerate(cases.values()):
        spec = {"module": module.__name__, **case}
        argv = [sys.executable, str(Path(__file__).resolve()), "--cpu-one", json.dumps(spec)]
        futs.append((case, runner.submit(1, argv, {}, logs / f"{i}.log", timeout_s)))
    ok = True
    for case, fut in futs:
        r = fut.result()
        passed = r.get("rc") == 0
        ok &= passed
        print(f"{'ok  ' if passed else 'FAIL'} {r.get('wall_s', 0):6.1f} s  {case['program']} "
              f"{json.dumps(case['kwargs'])}", flush=True)
        if not passed:
            print(r.get("log_tail") or r, flush=True)
    runner.close()
    print(f"{sum(f.result().get('rc') == 0 for _, f in futs)} of {len(futs)} passed; logs in {logs}")
    return ok


def main() -> None:
    if str(ROOT) not in sys.path:  # run as a script: the programs' modules are named from the repository root
        sys.path.insert(0, str(ROOT))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module", help="the programs' module, e.g. evaluation.programs.hf")
    ap.add_argument("--out", type=Path, help="the output directory (runs/, logs/, chains.json, summary.json)")
    ap.add_argument("--jobs", type=int, default=8, help="processes at a time (default 8)")
    ap.add_argument("--deadline-s", type=float, default=240, help="wall-clock bound of the whole recording")
    ap.add_argument("--run-timeout-s", type=float, default=120, help="one process's bound (default 120 s)")
    ap.add_argument("--only", help="comma-separated run/chain ids")
    ap.add_argument("--parts", default="runs,chains", help=f"comma-separated, of {','.join(PARTS)}")
    ap.add_argument("--dry-run", action="store_true", help="list what would run, start nothing")
    ap.add_argument("--cpu-check", action="store_true", help="run every program once on the CPU at a tiny size")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--to", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--cpu-one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        rec = run_one(json.loads(args.one))
        args.to.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.to.with_suffix(".tmp")
        with gzip.open(tmp, "wt") as f:
            json.dump(rec, f, separators=(",", ":"))
        tmp.replace(args.to)
        return
    if args.cpu_one:
        cpu_one(json.loads(args.cpu_one))
        return
    if not args.module:
        ap.error("--module is required")
    if args.jobs < 1 or args.deadline_s <= 0 or args.run_timeout_s <= 0:
        ap.error("--jobs, --deadline-s and --run-timeout-s must be positive")
    parts = args.parts.split(",")
    if set(parts) - set(PARTS):
        ap.error(f"unknown parts {sorted(set(parts) - set(PARTS))}; choose from {','.join(PARTS)}")
    try:
        module = load_plan(args.module)
    except (ImportError, ValueError) as e:
        ap.error(f"{args.module}: {e}")
    only = set(args.only.split(",")) if args.only else None
    if only:
        unknown = only - {e["id"] for e in [*module.RUNS, *module.CHAINS]}
        if unknown:
            ap.error(f"unknown ids {sorted(unknown)}")
    if args.cpu_check:
        sys.exit(0 if cpu_check(module, args.jobs, args.run_timeout_s * 3, only) else 1)
    runs, chains = plan_specs(module, parts, only)
    if args.dry_run:
        print(json.dumps({"module": module.__name__,
                          "runs": [{k: r[k] for k in ("id", "program", "kwargs", "alloc_conf", "cap_bytes")}
                                   for r in runs],
                          "chains": chains, "counts": {"runs": len(runs), "chains": len(chains)}}, indent=1))
        return
    if args.out is None:
        ap.error("--out is required to record")
    summary = record_all(module, runs, chains, args.out, args.jobs, args.deadline_s, args.run_timeout_s)
    print(json.dumps(summary["counts"]), f"wall {summary['wall_s']} s", flush=True)


if __name__ == "__main__":
    main()

"""Record each rank's real memory of a multi-GPU training program on ONE GPU, with torch's fake process group.

    python3 evaluation/record_dist.py --module evaluation.programs.dist --out DIR [--jobs 8] [--deadline-s 180]
                                      [--only ID,PATTERN,...] [--device cuda|cpu] [--dry-run]

The module names a plan: ``PROGRAMS`` (functions written as a ``torchrun`` script's ``main()``) and ``RUNS``
(``{"id", "program", "kwargs", "world_size", "ranks", "alloc_conf", "cap_gib"}``). Every (run, rank) pair runs
alone in a FRESH process (so each starts with an empty cache and a new CUDA context), up to ``--jobs`` at once on
the one GPU, with the environment ``torchrun`` would give rank R of an N-rank job with one GPU per process, as
under SLURM (``srun --ntasks N --gpus-per-task 1``): ``RANK=R``, ``WORLD_SIZE=N``, ``LOCAL_RANK=0``,
``LOCAL_WORLD_SIZE=1``, ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT`` (unused by the fake group); so the program's
``torch.cuda.set_device(LOCAL_RANK)`` picks the one GPU. ``PYTORCH_CUDA_ALLOC_CONF`` is the run's
``alloc_conf`` (unset when empty; ``PYTORCH_ALLOC_CONF`` removed), set before torch starts; ``cap_gib`` becomes
``torch.cuda.set_per_process_memory_fraction`` (no cap when None).

How the group is made fake without changing the program
-------------------------------------------------------
Before the program's module is imported, the child replaces ``torch.distributed.init_process_group`` (and the
same function in ``torch.distributed.distributed_c10d``) with a wrapper that calls the original with
``backend="fake"``, ``store=torch.testing._internal.distributed.fake_pg.FakeStore()``, ``init_method=None``,
``pg_options=None`` and the rank / world size from the environment (or those the program passed), whatever
backend (``"nccl"``, ``"gloo"``, ``"cuda:nccl,cpu:gloo"``) or ``init_method`` (``"env://"``) it asked for.
Importing ``fake_pg`` registers the ``"fake"`` backend for cpu and cuda (torch 2.11 and 2.13 alike). The fake
group's collectives launch nothing across processes and return a completed ``FakeWork`` whose future holds
None. All-gathers copy the input into every output chunk (they have for many releases: DeviceMesh and DDP
validate ranks with an all-gather, ``verify_params_across_processes``); in torch 2.13 reduce-scatters also copy
this rank's chunk into the output. Those copies write into buffers the caller already allocated, on the
caller's current stream: the fake group allocates nothing. So every buffer the rank makes (sharded
parameters, FSDP2's all-gather and reduce-scatter buffers, unsharded parameters and gradients, DDP's buckets,
optimizer state, activations, the flat buffers of DDP's initial parameter broadcast) is a real allocation
through the real caching allocator, on the stream the framework really puts it on.

DDP needs one more step. With no comm hook, DDP's reducer (``torch/csrc/distributed/c10d/reducer.cpp``,
``Reducer::run_comm_hook`` -> ``run_allreduce_hook``) runs the C++ ``_AllReduceBySumCommHook``, which returns
``process_group->allreduce({bucket.buffer})->getFuture()``; ``Reducer::finalize_backward`` then parses that
future's value with ``detail::parseCppCommHookResult``, which asserts a Tensor or TensorList. The fake group's
``FakeWork::getFuture()`` completes with None, so backward fails (``INTERNAL ASSERT FAILED ... comm.cpp ...
expected the hook result is either a Tensor or a TensorList found None``). A user's program has no hook, so
the recorder registers one, transparently: the constructor of ``DistributedDataParallel`` is wrapped so that
each new instance gets ``register_comm_hook(process_group, fake_allreduce_hook)``, a hook that does to memory
what the built-in path does:

- it divides the bucket's flat buffer by the world size, IN PLACE (``buffer.div_(N)``, as
  ``default_hooks._allreduce_fut`` does; with a hook registered the reducer skips its own division, see
  ``Note [DDP Communication Hook]`` and ``mark_variable_ready_dense``: ``bucket_view.copy_(grad)`` instead of
  ``at::mul_out(bucket_view, grad, 1/N)``: the same write into the same view, no allocation either way (the
  1/N factor is a CPU scalar tensor));
- it calls ``dist.all_reduce(buffer, async_op=True)`` on the fake group (no memory), and returns a completed
  ``torch.futures.Future`` whose value is THAT SAME buffer. ``finalize_backward`` then builds
  ``bucket_views_out`` as views of the buffer (``populate_bucket_views_out``), exactly as with NCCL, whose
  in-place all-reduce completes its future with the input tensors; with ``gradient_as_bucket_view=True``,
  ``finalize_bucket_dense`` sees ``bucket_view_in.is_alias_of(bucket_view_out)`` and copies nothing; without
  it, ``copy_bucket_to_grad`` copies each view into ``param.grad`` as it would with NCCL. A hook that
  returned a new tensor would add a bucket-sized allocation per bucket; this one adds none.

What the run does NOT see (and a prediction must add separately, labelled as an estimate): the CUDA context and
the kernels' module images; NCCL's own memory (its communicator's buffers, ``NCCL_BUFFSIZE`` channels, the
proxy and, for NVLink SHARP / CE collectives, registered windows), none of which goes through the caching
allocator; and ``ProcessGroupNCCL``'s own uses of the caching allocator that the fake group does not repeat:
list-style collectives (``all_gather`` into a list, ``reduce_scatter`` from a list, coalesced ops) allocate a
flat staging tensor inside ``collective()`` under the NCCL stream's guard, so into the NCCL stream's pool (the
FSDP2 and DDP paths recorded here use ``all_gather_into_tensor``, ``reduce_scatter_tensor`` and an in-place
``all_reduce``: no staging tensors). Older ``ProcessGroupNCCL`` (``TORCH_NCCL_AVOID_RECORD_STREAMS=0``, long
the default) called ``recordStream`` on an async collective's tensors, which keeps a freed block out of reuse
until the NCCL stream passes it; recent sources stash the tensors until ``wait()`` instead and call that
variable deprecated (which of the two torch 2.11 does was not checked here); FSDP2 and DDP keep those tensors
alive past the wait anyway, and the fake group records no stream use at all. Timing differs too:
collectives take no time, so the overlap of prefetched all-gathers with compute follows the GPU's compute
alone. The allocator decides from the order of requests and frees, not from time, except where a free waits on
an event (``record_stream``); the fake group records none.

What each run records
---------------------
``torch.cuda.memory._record_memory_history(context="alloc", stacks="python")`` from before the program's
import to its end; a global ``torch.optim.optimizer.register_optimizer_step_post_hook`` that, after each
``optimizer.step()``, keeps ``torch.cuda.memory_stats()`` (``max_memory_allocated`` / ``max_memory_reserved``
so far and the current figures are its ``*.all.peak`` / ``*.all.current`` entries; ``allocation.all.allocated``
counts the trace's ``alloc`` entries up to that point, to find the step in the trace), the parameters' local
(per-rank) sizes at the first step and the optimizer state's bytes; DDP's
``_get_ddp_logging_data()`` per step (bucket sizes before and after the rebuild, the cap, the hook; DDP's
logger refreshes them at the start of each forward, before that forward's bucket rebuild, so the rebuild done in
the second forward shows from the third step's entry); FSDP2's
stream handles (``FSDPCommContext.lazy_init`` wrapped to read them); the number and sizes of
``UntypedStorage.resize_`` calls (FSDP2 frees and re-allocates unsharded parameters that way). Nothing of this
synchronizes or allocates on the GPU. Each (run, rank) writes ``DIR/runs/<id>-r<rank>.json.gz``::

    {"id": "<run id>-r<rank>", "run_id", "module", "program", "kwargs", "world_size", "rank", "alloc_conf",
     "cap_bytes", "device", "kwargs_run" (what the program got: kwargs, plus CPU_SHRINK and device on cpu),
     "versions": {"torch", "cuda", "cudnn", "nccl", "transformers", "python"},
     "device_name", "total_bytes", "fits", "oom": null | {"message", "after_steps"}, "seconds",
     "peaks": {"allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes"},
     "stats": torch.cuda.memory_stats() at the end,
     "steps": [{"step", "stats": memory_stats() after that optimizer.step(), "optimizer_state_bytes",
                "ddp": [DDP logging data subset per DDP instance]}, ...],
     "params": {"count", "dtensors", "local_numel", "global_numel", "local_numels": [...],
                "global_shapes": [...], "dtypes": {...}},
     "fake_pg": {"backend_requested", "init_method_requested", "rank", "world_size", "backend"},
     "ddp_hook": bool, "fsdp_streams": {"all_gather_copy_in_stream": int, ...} | null,
     "resize": {"calls", "grow_calls", "grow_bytes", "shrink_calls"},
     "process_gpu": {"used_bytes": NVML's figure for this process or null, "note", "reserved_bytes"},
     "streams": {"default": int, "current": int} (cuda only),
     "frames": ["file:line:function", ...],
     "events": [[action, addr, size, frame_index or -1, user_frame_index or -1], ...],
     "event_streams": [stream of each event, ...],
     "trace_allocs", "counted_allocs", "trace_truncated",
     "segments": [{"address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                   "segment_type", "segment_pool_id", "is_expandable",
                   "blocks": [[size, requested_size, state], ...]}, ...]}

``events`` and ``frames`` are exactly ``evaluation/record_runs.py``'s (its ``_frame_text``): the snapshot's
``device_traces[0]``, each entry's innermost Python frame and innermost frame in the program's own file;
``event_streams`` is each entry's ``stream`` (a ``cudaStream_t``; ``streams["default"]`` is the device's
default stream, 0). ``segments`` are the final snapshot's, after the program returned (what the cache still
holds), with their stream and pool ids. ``process_gpu`` is the one view outside the allocator: what the driver
says this process uses at the end (``pynvml``, when installed), beside the allocator's reserved bytes then;
their difference estimates the CUDA context and module images (no NCCL communicator exists under the fake
group, so none is in it). ``DIR/summary.json`` lists every pair (status ``ok`` / ``oom`` /
``error`` / ``killed`` / ``skipped``, peaks, per-step peaks, wall seconds, the output's tail when it failed);
``DIR/logs/`` holds
each child's output. At ``--deadline-s`` (default 180) the parent starts nothing new and kills the children
still running (by their own pids); what finished is kept. Ranks 0 and N-1 of every run are scheduled before
the other ranks, so a deadline cuts the least.

``--device cpu`` checks the harness on a machine with no GPU: the same children, the same fake group, DDP
hook, step hook and probes, with each program's ``CPU_SHRINK`` sizes and ``device="cpu"`` (gloo asked for,
fake given); no allocator to record, so a record holds the steps, parameters, DDP and FSDP2 data, resize
counts and ``"device": "cpu"``. Only the allocator's side (trace, stats, segments, caps) needs CUDA.
"""

from __future__ import annotations

import argparse
import fnmatch
import gzip
import importlib
import inspect
import json
import os
import subprocess
import sys
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

GiB = 1 << 30
ROOT = Path(__file__).resolve().parent.parent
WORLD_SIZES = (2, 4, 8)
MAX_TRACE_ENTRIES = 3_000_000
RUN_TIMEOUT_S = 170.0
DDP_KEYS = ("bucket_sizes", "rebuilt_bucket_sizes", "rebuilt_per_bucket_param_indices", "bucket_cap_bytes",
            "gradient_as_bucket_view", "has_rebuilt_buckets", "comm_hook", "iteration", "num_parameter_tensors",
            "total_parameter_size_bytes", "dtypes", "find_unused_parameters", "num_buckets_reduced")


def _record_runs() -> ModuleType:
    """evaluation/record_runs.py (its helpers: one format for every recording; its plan is not run)."""
    from evaluation import record_runs

    return record_runs


# ----------------------------------------------------------------------------------------------------------------
# the plan


def load_plan(module_name: str) -> tuple[object, list[dict]]:
    """The module and its RUNS, checked: unique ids, known programs, keyword arguments the program takes,
    world sizes of 2/4/8, ranks in range and including 0 and N-1. Raises ValueError naming every problem."""
    module = importlib.import_module(module_name)
    runs = list(module.RUNS)
    problems = []
    seen = set()
    for run in runs:
        rid = run.get("id", "?")
        if rid in seen:
            problems.append(f"{rid}: duplicate id")
        seen.add(rid)
        missing = {"id", "program", "kwargs", "world_size", "ranks", "alloc_conf", "cap_gib"} - set(run)
        if missing:
            problems.append(f"{rid}: missing {sorted(missing)}")
            continue
        fn = module.PROGRAMS.get(run["program"])
        if fn is None:
            problems.append(f"{rid}: unknown program {run['program']!r}")
            continue
        try:
            inspect.signature(fn).bind(**run["kwargs"])
        except TypeError as e:
            problems.append(f"{rid}: {e}")
        n = run["world_size"]
        if n not in WORLD_SIZES:
            problems.append(f"{rid}: world_size {n} not in {WORLD_SIZES}")
        ranks = run["ranks"]
        if sorted(set(ranks)) != sorted(ranks) or not all(0 <= r < n for r in ranks) or {0, n - 1} - set(ranks):
            problems.append(f"{rid}: ranks {ranks} must be distinct, in [0, {n}), with 0 and {n - 1}")
        if run["cap_gib"] is not None and not run["cap_gib"] > 0:
            problems.append(f"{rid}: cap_gib {run['cap_gib']} must be None or > 0")
    if problems:
        raise ValueError(f"{module_name}: bad plan:\n  " + "\n  ".join(problems))
    return module, runs


def select(runs: list[dict], only: str | None) -> list[dict]:
    """The runs whose id matches one of the comma-separated ids or fnmatch patterns (all when None)."""
    if not only:
        return runs
    patterns = [p.strip() for p in only.split(",") if p.strip()]
    chosen = [r for r in runs if any(fnmatch.fnmatchcase(r["id"], p) for p in patterns)]
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(r["id"], p) for r in runs)]
    if unmatched:
        raise ValueError(f"--only: no run matches {unmatched}")
    return chosen


def pairs(runs: list[dict]) -> list[dict]:
    """One spec per (run, rank): ranks 0 and N-1 of every run first, then the others."""
    first, rest = [], []
    for run in runs:
        n = run["world_size"]
        for rank in run["ranks"]:
            spec = {**run, "run_id": run["id"], "id": f"{run['id']}-r{rank}", "rank": rank}
            spec.pop("ranks")
            (first if rank in (0, n - 1) else rest).append(spec)
    return first + rest


# ----------------------------------------------------------------------------------------------------------------
# the child: what is installed around the program


class Probes:
    """What the child installs before the program runs, and what it collects."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.fake_pg: dict | None = None
        self.ddp_instances: list = []
        self.fsdp_streams: dict | None = None
        self.resize = {"calls": 0, "grow_calls": 0, "grow_bytes": 0, "shrink_calls": 0}
        self.steps: list[dict] = []
        self.params: dict | None = None

    def install(self) -> None:
        self._fake_process_group()
        self._ddp_comm_hook()
        self._fsdp_streams()
        self._resize_counter()
        self._step_hook()

    def _fake_process_group(self) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

        original = c10d.init_process_group
        signature = inspect.signature(original)
        probes = self

        def init_process_group(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            asked = dict(bound.arguments)
            rank = asked.get("rank", -1)
            world_size = asked.get("world_size", -1)
            rank = int(os.environ["RANK"]) if rank is None or rank < 0 else rank
            world_size = int(os.environ["WORLD_SIZE"]) if world_size is None or world_size < 0 else world_size
            kept = {k: v for k, v in asked.items()
                    if k not in ("backend", "init_method", "store", "rank", "world_size", "pg_options")}
            result = original(backend="fake", store=FakeStore(), rank=rank, world_size=world_size, **kept)
            probes.fake_pg = {"backend_requested": str(asked.get("backend")),
                              "init_method_requested": asked.get("init_method"), "rank": rank,
                              "world_size": world_size, "backend": str(dist.get_backend())}
            return result

        init_process_group.__wrapped__ = original
        dist.init_process_group = init_process_group
        c10d.init_process_group = init_process_group

    def _ddp_comm_hook(self) -> None:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        def fake_allreduce_hook(process_group, bucket):
            """The built-in all-reduce's memory: the bucket's buffer divided in place, returned as the result."""
            buffer = bucket.buffer()
            buffer.div_(process_group.size())
            dist.all_reduce(buffer, group=process_group, async_op=True)
            future = torch.futures.Future()
            future.set_result(buffer)
            return future

        original = DistributedDataParallel.__init__
        probes = self

        def __init__(ddp, *args, **kwargs):
            original(ddp, *args, **kwargs)
            ddp.register_comm_hook(ddp.process_group, fake_allreduce_hook)
            probes.ddp_instances.append(weakref.ref(ddp))

        __init__.__wrapped__ = original
        DistributedDataParallel.__init__ = __init__

    def _fsdp_streams(self) -> None:
        try:
            from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPCommContext
        except ImportError:  # another torch: nothing to read
            return
        original = FSDPCommContext.lazy_init
        probes = self

        def lazy_init(ctx, *args, **kwargs):
            result = original(ctx, *args, **kwargs)
            streams = {}
            for name, value in vars(ctx).items():
                if name.endswith("stream") and value is not None:
                    streams[name] = getattr(value, "cuda_stream", None)
                    if streams[name] is None:
                        streams[name] = getattr(value, "stream_id", repr(value))
            probes.fsdp_streams = streams
            return result

        FSDPCommContext.lazy_init = lazy_init

    def _resize_counter(self) -> None:
        import torch

        original = torch.UntypedStorage.resize_
        resize = self.resize

        def resize_(storage, size):
            before = storage.size()
            resize["calls"] += 1
            if size > before:
                resize["grow_calls"] += 1
                resize["grow_bytes"] += size - before
            elif size < before:
                resize["shrink_calls"] += 1
            return original(storage, size)

        torch.UntypedStorage.resize_ = resize_

    def _step_hook(self) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        def after_step(optimizer, args, kwargs):
            if self.params is None:
                self.params = _param_summary(optimizer)
            record = {"step": len(self.steps), "optimizer_state_bytes": _state_bytes(optimizer),
                      "ddp": [_ddp_data(ref()) for ref in self.ddp_instances if ref() is not None]}
            if self.cuda:
                record["stats"] = torch.cuda.memory_stats()
            self.steps.append(record)

        register_optimizer_step_post_hook(after_step)


def _local(tensor):
    """A DTensor's local shard (its ``_local_tensor``: no autograd op), or the tensor itself."""
    return getattr(tensor, "_local_tensor", tensor)


def _param_summary(optimizer) -> dict:
    """The optimizer's parameters as this rank holds them."""
    local_numels, shapes, dtypes = [], [], {}
    dtensors = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            local = _local(p)
            dtensors += local is not p
            local_numels.append(local.numel())
            shapes.append(list(p.shape))
            dtypes[str(p.dtype)] = dtypes.get(str(p.dtype), 0) + local.numel()
    return {"count": len(local_numels), "dtensors": dtensors, "local_numel": sum(local_numels),
            "global_numel": sum(_numel(s) for s in shapes), "local_numels": local_numels, "global_shapes": shapes,
            "dtypes": dtypes}


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _state_bytes(optimizer) -> dict:
    """Bytes of optimizer state per device type (this rank's shards)."""
    out: dict[str, int] = {}
    for state in optimizer.state.values():
        for value in state.values():
            if hasattr(value, "untyped_storage"):
                local = _local(value)
                out[local.device.type] = out.get(local.device.type, 0) + local.numel() * local.element_size()
    return out


def _ddp_data(ddp) -> dict:
    data = ddp._get_ddp_logging_data()
    return {k: data[k] for k in DDP_KEYS if k in data}


def _versions() -> dict:
    import platform

    import torch

    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
    try:
        out["cudnn"] = torch.backends.cudnn.version()
        nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
        out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
    except Exception as e:  # a build without NCCL: say so
        out["nccl"] = f"unavailable: {e}"
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except ImportError:
        out["transformers"] = None
    return out


def _trace(snapshot: dict, program_file: str, frame_text) -> tuple[list, list, list]:
    """record_runs.py's events and frames, and each event's stream."""
    frames: dict[str, int] = {}
    events, streams = [], []
    for e in snapshot["device_traces"][0] if snapshot["device_traces"] else []:
        fr = e.get("frames") or []
        inner = frame_text(fr[0]) if fr else None
        user = next((frame_text(f) for f in fr if f.get("filename") == program_file), None)
        idx = [frames.setdefault(t, len(frames)) if t else -1 for t in (inner, user)]
        events.append([e["action"], e.get("addr", 0), e.get("size", 0), *idx])
        streams.append(e.get("stream", 0))
    return list(frames), events, streams


def _segments(snapshot: dict) -> list[dict]:
    keys = ("address", "total_size", "allocated_size", "active_size", "requested_size", "stream", "segment_type",
            "segment_pool_id", "is_expandable")
    return [{**{k: s.get(k) for k in keys},
             "blocks": [[b["size"], b.get("requested_size", 0), b["state"]] for b in s.get("blocks", [])]}
            for s in snapshot["segments"]]


def _nvml_process_bytes() -> dict:
    """This process's GPU memory as the driver counts it (CUDA context, module images, the caching allocator's
    segments and anything else), from NVML when ``pynvml`` is installed and the process is visible to it."""
    try:
        import pynvml
    except ImportError:
        return {"used_bytes": None, "note": "pynvml not installed"}
    try:
        pynvml.nvmlInit()
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid():
                    return {"used_bytes": proc.usedGpuMemory, "note": f"NVML device {i}"}
        return {"used_bytes": None, "note": "this pid not among NVML's processes (a container's pid namespace?)"}
    except pynvml.NVMLError as e:
        return {"used_bytes": None, "note": f"NVML error: {e}"}


def run_one(spec: dict) -> dict:
    """In a fresh process: run one (run, rank) under the fake group; return the record."""
    import torch

    cuda = spec["device"] == "cuda"
    probes = Probes(cuda)
    probes.install()
    record = {**spec, "versions": _versions()}
    if cuda:
        total = torch.cuda.get_device_properties(0).total_memory
        record.update(device_name=torch.cuda.get_device_name(0), total_bytes=total)
        if spec["cap_bytes"] is not None:
            cap = int(spec["cap_bytes"])
            fraction = cap / total
            while int(fraction * total) < cap:
                fraction += 1e-12
            torch.cuda.set_per_process_memory_fraction(min(fraction, 1.0))
        torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=MAX_TRACE_ENTRIES)
        record["streams"] = {"default": torch.cuda.default_stream().cuda_stream,
                             "current": torch.cuda.current_stream().cuda_stream}
    module = importlib.import_module(spec["module"])
    fn = module.PROGRAMS[spec["program"]]
    kwargs = dict(spec["kwargs"])
    if not cuda:
        kwargs.update(getattr(module, "CPU_SHRINK", {}).get(spec["program"], {}), device="cpu")
    start = time.perf_counter()
    oom = None
    try:
        fn(**kwargs)
    except torch.OutOfMemoryError as e:
        oom = {"message": str(e).splitlines()[0][:600], "after_steps": len(probes.steps)}
    record.update(kwargs_run=kwargs, fits=oom is None, oom=oom, seconds=round(time.perf_counter() - start, 3),
                  steps=probes.steps, params=probes.params, fake_pg=probes.fake_pg,
                  ddp_hook=bool(probes.ddp_instances), fsdp_streams=probes.fsdp_streams, resize=probes.resize)
    if cuda:
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(None)
        frames, events, streams = _trace(snapshot, module.__file__, _record_runs()._frame_text)
        stats = torch.cuda.memory_stats()
        record.update(peaks={"allocated_bytes": stats["allocated_bytes.all.peak"],
                             "reserved_bytes": stats["reserved_bytes.all.peak"],
                             "active_bytes": stats["active_bytes.all.peak"],
                             "requested_bytes": stats["requested_bytes.all.peak"]},
                      stats=stats, frames=frames, events=events, event_streams=streams,
                      trace_allocs=sum(e[0] == "alloc" for e in events),
                      counted_allocs=stats["allocation.all.allocated"],
                      trace_truncated=len(events) >= MAX_TRACE_ENTRIES, segments=_segments(snapshot),
                      process_gpu={**_nvml_process_bytes(), "reserved_bytes": stats["reserved_bytes.all.current"]})
    import torch.distributed as dist

    if dist.is_initialized():  # the program stopped before its destroy_process_group (an OOM)
        dist.destroy_process_group()
    return record


# ----------------------------------------------------------------------------------------------------------------
# the parent


def _child_env(spec: dict, port: int) -> dict:
    env = dict(os.environ, RANK=str(spec["rank"]), WORLD_SIZE=str(spec["world_size"]), LOCAL_RANK="0",
               LOCAL_WORLD_SIZE="1", GROUP_RANK=str(spec["rank"]), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               PYTHONPATH=str(ROOT), OMP_NUM_THREADS="2", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    env.pop("PYTORCH_ALLOC_CONF", None)
    if spec["alloc_conf"]:
        env["PYTORCH_CUDA_ALLOC_CONF"] = spec["alloc_conf"]
    else:
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    return env


def _spawn(spec: dict, port: int, out: Path, stop_at: float) -> dict:
    """Run one pair in a child; the summary line of it."""
    base = {"id": spec["id"], "run_id": spec["run_id"], "rank": spec["rank"], "world_size": spec["world_size"]}
    remaining = stop_at - time.perf_counter()
    if remaining < 5:
        return {**base, "status": "skipped", "error": "deadline reached before it started"}
    path = out / "runs" / f"{spec['id']}.json.gz"
    log_path = out / "logs" / f"{spec['id']}.log"
    t0 = time.perf_counter()
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, __file__, "--one", json.dumps(spec), "--to", str(path)],
                                env=_child_env(spec, port), stdout=log, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=min(RUN_TIMEOUT_S, remaining))
        except subprocess.TimeoutExpired:
            proc.kill()  # our own child, by its pid
            proc.wait()
            rc = None
    wall = round(time.perf_counter() - t0, 1)
    tail = log_path.read_text(errors="replace")[-2000:]
    if rc is None:
        return {**base, "status": "killed", "wall_s": wall, "error": "deadline or timeout", "log_tail": tail}
    if rc != 0 or not path.exists():
        return {**base, "status": "error", "wall_s": wall, "error": f"exit {rc}", "log_tail": tail}
    with gzip.open(path, "rt") as f:
        rec = json.load(f)
    line = {**base, "status": "ok" if rec["fits"] else "oom", "wall_s": wall, "seconds": rec["seconds"],
            "steps": len(rec["steps"]), "resize_calls": rec["resize"]["calls"]}
    if "peaks" in rec:
        line["peaks"] = rec["peaks"]
        line["step_peaks"] = [{"allocated_bytes": s["stats"]["allocated_bytes.all.peak"],
                               "reserved_bytes": s["stats"]["reserved_bytes.all.peak"]} for s in rec["steps"]]
        line["events"] = len(rec["events"])
    if rec["oom"]:
        line["oom"] = rec["oom"]
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module", default="evaluation.programs.dist", help="the plan: a module with PROGRAMS, RUNS")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--jobs", type=int, default=8, help="processes at once on the GPU")
    ap.add_argument("--deadline-s", type=float, default=180, help="start nothing and kill what runs after this")
    ap.add_argument("--only", help="comma-separated run ids or fnmatch patterns (e.g. 'dist-gpt-ddp-*')")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: check the harness with CPU_SHRINK sizes, no allocator recording")
    ap.add_argument("--dry-run", action="store_true", help="list the (run, rank) pairs, start nothing")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--to", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        record = run_one(json.loads(args.one))
        tmp = args.to.with_suffix(".tmp")
        with gzip.open(tmp, "wt") as f:
            json.dump(record, f, separators=(",", ":"))
        tmp.replace(args.to)
        return
    sys.path.insert(0, str(ROOT))
    try:
        _, runs = load_plan(args.module)
        runs = select(runs, args.only)
    except ValueError as e:
        ap.error(str(e))
    specs = [{**s, "module": args.module, "device": args.device,
              "cap_bytes": None if s["cap_gib"] is None or args.device == "cpu" else int(s["cap_gib"] * GiB)}
             for s in pairs(runs)]
    if args.dry_run:
        for s in specs:
            cap = "-" if s["cap_gib"] is None else f"{s['cap_gib']:g} GiB"
            print(f"{s['id']:48s} {s['program']:12s} N={s['world_size']} R={s['rank']} "
                  f"conf={s['alloc_conf'] or '-'} cap={cap} {json.dumps(s['kwargs'])}")
        print(f"{len(runs)} runs, {len(specs)} processes, {args.jobs} at once, deadline {args.deadline_s:g} s")
        return
    if args.out is None:
        ap.error("--out is required unless --dry-run")
    for sub in ("runs", "logs"):
        (args.out / sub).mkdir(parents=True, exist_ok=True)
    stop_at = time.perf_counter() + args.deadline_s
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(_spawn, spec, 29500 + i, args.out, stop_at) for i, spec in enumerate(specs)]
        lines = []
        for fut in futures:
            lines.append(fut.result())
            print(json.dumps({k: v for k, v in lines[-1].items() if k != "log_tail"}), flush=True)
    counts: dict[str, int] = {}
    for line in lines:
        counts[line["status"]] = counts.get(line["status"], 0) + 1
    summary = {"module": args.module, "device": args.device, "jobs": args.jobs, "deadline_s": args.deadline_s,
               "wall_s": round(time.perf_counter() - t0, 1), "counts": counts, "runs": lines}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({"counts": counts, "wall_s": summary["wall_s"]}))


if __name__ == "__main__":
    main()

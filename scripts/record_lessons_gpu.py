"""On a CUDA GPU: run lessons 01-09 for real and lesson 9's what-ifs through the real allocator.

    python3 scripts/record_lessons_gpu.py --out DIR [--skip-notebooks]

Writes to DIR:

- ``lessons_gpu_outputs.json``: every code cell of ``notebooks/0[1-9]_*.ipynb`` executed here (nbclient,
  kernel ``python3``, cwd ``notebooks/``): its tags, the output this GPU printed, the stored output (the
  simulator's), and whether the two are equal. The "in your own code" cells' GPU output is the part the
  lessons show as recorded; ``nbval`` compares only the untagged cells and prints none of it.
- ``torch_facts.json``: what the lessons say about this torch: its version, the number of
  ``memory_stats()`` keys, the warning ``torch.cuda.memory._set_allocator_settings`` gives (lesson 6).
- ``whatif_real.json``: lesson 9's shipped run (``notebooks/data/workload_default.pickle``) replayed
  request by request through PyTorch's own allocator (``torch.empty`` / ``del``, uint8, stream 0) under
  the caps and configs lesson 9 shows, each in a fresh process with ``PYTORCH_CUDA_ALLOC_CONF`` set before
  CUDA starts, beside the simulator's replay of the same requests. A failed request is skipped (and its
  later free), exactly as the simulator's replay does, so the two rows are comparable op for op.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # memviz from this checkout, also in the --replay-one subprocesses

from memviz.units import MiB  # noqa: E402  (after the path line)

WORKLOAD = ROOT / "notebooks" / "data" / "workload_default.pickle"
#: (PYTORCH_CUDA_ALLOC_CONF, cap in bytes or None): lesson 9's recorded-config check, its 6000 MiB what-if
#: and its 6 GiB exercise
REPLAYS = (("", None), ("expandable_segments:True", None), ("", 6000 * MiB),
           ("expandable_segments:True", 6000 * MiB), ("", 6144 * MiB))  # fmt: skip


def _text(outputs: list) -> str:
    """The text a cell printed: its streams and plain-text results, in order."""
    parts = []
    for out in outputs:
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
        elif out.get("output_type") == "error":
            parts.append(f"{out.get('ename')}: {out.get('evalue')}")
    return "".join("".join(p) if isinstance(p, list) else p for p in parts)


def run_notebooks() -> dict:
    """Execute each lesson 01-09 on this machine; per cell: tags, GPU output, stored output, equal."""
    import nbformat
    from nbclient import NotebookClient

    report = {}
    for path in sorted((ROOT / "notebooks").glob("0[1-9]_*.ipynb")):
        stored = nbformat.read(path, as_version=4)
        ran = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        error = None
        try:
            NotebookClient(ran, timeout=600, kernel_name="python3", allow_errors=True,
                           resources={"metadata": {"path": str(path.parent)}}).execute()
        except Exception as exc:  # a dead kernel: keep what ran
            error = f"{type(exc).__name__}: {exc}"
        cells = []
        for index, (old, new) in enumerate(zip(stored.cells, ran.cells, strict=True)):
            if old.cell_type != "code":
                continue
            gpu, sim = _text(new.get("outputs", [])), _text(old.get("outputs", []))
            cells.append({"cell": index, "tags": old.metadata.get("tags", []), "source_head": old.source[:80],
                          "gpu_output": gpu, "stored_output": sim, "equal": gpu == sim})
        report[path.name] = {"seconds": round(time.perf_counter() - start, 1), "error": error, "cells": cells}
        print(f"{path.name}: {report[path.name]['seconds']} s, "
              f"{sum(not c['equal'] for c in cells)} of {len(cells)} code cells print otherwise", flush=True)
    return report


def replay_real(alloc_conf: str, cap_bytes: int | None) -> dict:
    """Replay the workload's requests through torch's allocator in this process (CUDA not yet started)."""
    import torch

    from memviz.sim.limits import fraction_for_cap
    from memviz.sim.replay import EMPTY_CACHE, FREE, FREE_COMPLETED, FREE_REQUESTED, MALLOC, PROBE
    from memviz.snapshots import SnapshotHistory
    from memviz.snapshots.history_ops import compile_requests

    assert os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") == alloc_conf
    ops, where = compile_requests(SnapshotHistory(str(WORKLOAD), progress=False), cap_bytes)
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = 1.0 if cap_bytes is None else fraction_for_cap(cap_bytes, total)
    torch.cuda.set_per_process_memory_fraction(fraction)
    live: dict = {}
    oom_events, other_streams, waited_frees = [], 0, 0
    unsupported: dict[str, int] = {}
    start = time.perf_counter()
    for j, (kind, key, size, stream) in enumerate(ops):
        if kind in (MALLOC, PROBE):
            other_streams += stream != 0
            try:
                tensor = torch.empty(size, dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError:
                oom_events.append(where[j])
                continue
            if kind == MALLOC:
                live[key] = tensor
            del tensor
        elif kind in (FREE, FREE_COMPLETED):
            live.pop(key, None)
        elif kind == FREE_REQUESTED:  # one stream here: the block is free at once
            waited_frees += 1
            live.pop(key, None)
        elif kind == EMPTY_CACHE and key is None:
            torch.cuda.empty_cache()
        else:  # pool and settings ops: this recording has none; say so if it ever does
            unsupported[kind] = unsupported.get(kind, 0) + 1
    seconds = time.perf_counter() - start
    stats = torch.cuda.memory_stats()
    return {"alloc_conf": alloc_conf, "cap_bytes": cap_bytes, "fraction": fraction, "ops": len(ops),
            "num_ooms": len(oom_events), "oom_event_indices": oom_events[:20],
            "peak_reserved_bytes": stats["reserved_bytes.all.peak"],
            "peak_allocated_bytes": stats["allocated_bytes.all.peak"],
            "num_device_alloc": stats["num_device_alloc"], "num_device_free": stats["num_device_free"],
            "num_alloc_retries": stats["num_alloc_retries"], "torch_num_ooms": stats["num_ooms"],
            "requests_on_other_streams": other_streams, "waited_frees": waited_frees,
            "ops_not_replayed": unsupported,
            "seconds": round(seconds, 2), "torch": torch.__version__, "device": torch.cuda.get_device_name()}


def replay_sim(alloc_conf: str, cap_bytes: int | None, total_bytes: int) -> dict:
    """The simulator's replay of the same requests (as lesson 9's WhatIfTable runs it)."""
    from memviz.snapshots.whatif import replay

    run = replay(str(WORKLOAD), alloc_conf, device_total_bytes=total_bytes, cap_bytes=cap_bytes,
                 timeline=False, progress=False)
    return {"num_ooms": run.num_ooms, "oom_event_indices": run.oom_event_indices[:20],
            "peak_reserved_bytes": run.peak_reserved_bytes, "peak_allocated_bytes": run.peak_allocated_bytes,
            "num_device_alloc": run.num_device_alloc, "num_device_free": run.num_device_free,
            "num_alloc_retries": run.num_alloc_retries}


def torch_facts() -> dict:
    """The torch facts lessons 2 and 6 state, read on this machine (runs in a fresh process)."""
    code = """
import json, warnings, torch
torch.cuda.init()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.cuda.memory._set_allocator_settings("expandable_segments:False")
print(json.dumps({"torch": torch.__version__, "memory_stats_keys": len(torch.cuda.memory_stats()),
                  "has_cached_bytes": "cached_bytes" in torch.cuda.memory_stats(),
                  "set_allocator_settings_warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return json.loads(done.stdout.splitlines()[-1]) if done.returncode == 0 else {"error": done.stderr[-2000:]}


def run_replays() -> list[dict]:
    """Each replay in its own process (the config must be set before CUDA starts), beside the simulator's."""
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    rows = []
    for alloc_conf, cap_bytes in REPLAYS:
        env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": alloc_conf}
        cmd = [sys.executable, __file__, "--replay-one", alloc_conf, str(cap_bytes or 0)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
        real = json.loads(done.stdout.splitlines()[-1]) if done.returncode == 0 else {"error": done.stderr[-2000:]}
        sim = replay_sim(alloc_conf, cap_bytes, total)
        same = [k for k in sim if k in real and real[k] != sim[k]]
        rows.append({"alloc_conf": alloc_conf or "default", "cap_MiB": cap_bytes and cap_bytes // MiB,
                     "real": real, "sim": sim, "differ": same})
        print(f"replay {alloc_conf or 'default'} cap {cap_bytes and cap_bytes // MiB} MiB: "
              f"real {real.get('num_ooms')} OOMs, peak {real.get('peak_reserved_bytes', 0) // MiB} MiB; "
              f"sim {sim['num_ooms']} OOMs, peak {sim['peak_reserved_bytes'] // MiB} MiB; differ: {same}", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--skip-notebooks", action="store_true", help="only the what-if replays")
    parser.add_argument("--replay-one", nargs=2, metavar=("ALLOC_CONF", "CAP_BYTES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replay_one:
        conf, cap = args.replay_one
        print(json.dumps(replay_real(conf, int(cap) or None)))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 1
    if args.out is None:
        parser.error("--out DIR is required")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "torch_facts.json").write_text(json.dumps(torch_facts(), indent=1))
    (args.out / "whatif_real.json").write_text(json.dumps(run_replays(), indent=1))
    if not args.skip_notebooks:
        (args.out / "lessons_gpu_outputs.json").write_text(json.dumps(run_notebooks(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Copy the H200 figures lesson 12 prints out of the per-rank recordings into ``memviz/data/h200_dist.json``.

    python -m evaluation.lesson_data [--check]

Reads every ``evaluation/recordings/dist*/runs/<run id>-r<rank>.json.gz`` (``evaluation/record_dist.py``'s
format: see its docstring) and keeps, per run and rank, only what the lesson needs; ``--check`` writes nothing
and exits 1 when the shipped file differs from what the recordings give. Nothing is computed or estimated:
every value is copied from a recording (renamed, or its text parsed into numbers):

- ``meta``: the versions and the device every recording shares (the script refuses recordings that differ);
- ``runs[<run id>]``: the set (``dist`` or ``dist_heldout``), the program, its keyword arguments, world size,
  allocator config and cap (bytes or None);
- ``runs[<run id>]["ranks"][<rank>]``:

  - ``fits``; ``oom``: None, or torch's message up to "Tried to allocate ..." and how many optimizer steps
    had completed before it;
  - ``peak_allocated_bytes`` / ``peak_reserved_bytes``: the run's ``memory_stats()`` peaks;
  - ``steps``: after each ``optimizer.step()``, ``memory_stats()``'s ``allocated_bytes.all.peak`` /
    ``reserved_bytes.all.peak`` (the peaks so far: torch's peaks were never reset) and
    ``allocated_bytes.all.current`` / ``reserved_bytes.all.current``, as ``[peak allocated, peak reserved,
    allocated, reserved]``;
  - ``process_gpu_bytes``: NVML's memory for the process at the end (None where NVML was not read), beside
    ``reserved_at_end_bytes``, the allocator's reserved bytes at that moment: the difference is what the process
    held outside the allocator (the CUDA context and the kernels' module images; the fake group made no NCCL
    communicator);
  - DDP ranks: ``ddp_bucket_sizes`` (the bucket sizes in bytes DDP's logger gave at the first step: before the
    rebuild) and ``ddp_rebuilt_bucket_sizes`` (at the last step: after the rebuild in the second forward),
    ``ddp_bucket_cap_bytes``, ``gradient_as_bucket_view``;
  - FSDP2 ranks: ``fsdp_streams``: FSDP2's four streams' handles (``cudaStream_t``), by role;
  - for the runs of :data:`SEGMENT_RUNS` only: ``segments``, the cache's segments when the program had returned,
    each ``[stream, total_size, allocated_size]``, its stream named ``default`` or by its FSDP2 role (the handle
    looked up in ``fsdp_streams``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RECORDINGS = ROOT / "evaluation" / "recordings"
SETS = ("dist", "dist_heldout")
OUT = ROOT / "memviz" / "data" / "h200_dist.json"
SEGMENT_RUNS = ("dist-mlp-fsdp-ws4", "dist-mlp-fsdp-ws2-noreshard")
"""The runs whose final segments are kept (lesson 12 reads each FSDP2 stream's segments)."""
SOURCE = ("evaluation/recordings/dist*/runs/ (evaluation/record_dist.py on one H200, torch's fake process group, "
          "a fresh process per (run, rank), 3 AdamW steps); copied by evaluation/lesson_data.py")


def _sizes(text: str | None) -> list[int] | None:
    """DDP's logger's ``"36156088, 36036008"`` as ints."""
    return None if text is None else [int(part) for part in text.split(",")]


def _oom(oom: dict | None) -> dict | None:
    if oom is None:
        return None
    message = oom["message"]
    end = message.find(". ", message.find("Tried to allocate"))
    return {"message": message if end < 0 else message[:end + 1], "after_steps": oom["after_steps"]}


def rank_entry(record: dict, keep_segments: bool) -> dict[str, Any]:
    """What the lesson keeps of one (run, rank) recording."""
    steps = [[s["stats"][f"{k}_bytes.all.{w}"] for w, k in (("peak", "allocated"), ("peak", "reserved"),
                                                            ("current", "allocated"), ("current", "reserved"))]
             for s in record["steps"]]  # fmt: skip
    gpu = record["process_gpu"]
    entry: dict[str, Any] = {
        "fits": record["fits"], "oom": _oom(record["oom"]),
        "peak_allocated_bytes": record["peaks"]["allocated_bytes"],
        "peak_reserved_bytes": record["peaks"]["reserved_bytes"],
        "steps": steps, "process_gpu_bytes": gpu["used_bytes"], "reserved_at_end_bytes": gpu["reserved_bytes"],
    }
    ddp = [s["ddp"] for s in record["steps"] if s["ddp"]]
    if ddp:
        if any(len(instances) != 1 for instances in ddp):
            raise ValueError(f"{record['id']}: more than one DDP instance")
        first, last = ddp[0][0], ddp[-1][0]
        entry.update(ddp_bucket_sizes=_sizes(first["bucket_sizes"]),
                     ddp_rebuilt_bucket_sizes=_sizes(last.get("rebuilt_bucket_sizes")),
                     ddp_bucket_cap_bytes=first["bucket_cap_bytes"],
                     gradient_as_bucket_view=bool(first["gradient_as_bucket_view"]))
    if record["fsdp_streams"]:
        entry["fsdp_streams"] = record["fsdp_streams"]
    if keep_segments:
        names = {record["streams"]["default"]: "default"}
        names.update({handle: role for role, handle in (record["fsdp_streams"] or {}).items()})
        entry["segments"] = [[names.get(s["stream"], f"stream {s['stream']}"), s["total_size"], s["allocated_size"]]
                             for s in record["segments"]]
    return entry


def build(recordings: Path = RECORDINGS) -> dict[str, Any]:
    """``h200_dist.json``'s content from the recordings (see the module docstring).

    Raises:
        ValueError: no recordings, or recordings made with different versions or devices.
    """
    meta: dict[str, Any] | None = None
    runs: dict[str, dict] = {}
    for name in SETS:
        for path in sorted((recordings / name / "runs").glob("*.json.gz")):
            record = json.loads(gzip.decompress(path.read_bytes()))
            this = {"device_name": record["device_name"], "total_bytes": record["total_bytes"], **record["versions"],
                    "source": SOURCE}
            if meta is None:
                meta = this
            elif this != meta:
                raise ValueError(f"{path.name}: recorded with {this}, the others with {meta}")
            run = runs.setdefault(record["run_id"], {
                "set": name, "program": record["program"], "kwargs": record["kwargs"],
                "world_size": record["world_size"], "alloc_conf": record["alloc_conf"],
                "cap_bytes": record["cap_bytes"], "ranks": {}})  # fmt: skip
            run["ranks"][str(record["rank"])] = rank_entry(record, record["run_id"] in SEGMENT_RUNS)
    if meta is None:
        raise ValueError(f"no recordings under {recordings}/{{{','.join(SETS)}}}/runs")
    for run in runs.values():
        run["ranks"] = dict(sorted(run["ranks"].items(), key=lambda item: int(item[0])))
    return {"meta": meta, "runs": runs}


def dumps(data: dict[str, Any]) -> str:
    """The file's text: one line per rank, so that it stays small and a diff reads by rank."""
    lines = ["{", f' "meta": {json.dumps(data["meta"])},', ' "runs": {']
    run_ids = list(data["runs"])
    for i, run_id in enumerate(run_ids):
        run = data["runs"][run_id]
        head = json.dumps({k: v for k, v in run.items() if k != "ranks"})[:-1]
        lines.append(f"  {json.dumps(run_id)}: {head}, \"ranks\": {{")
        ranks = list(run["ranks"].items())
        for j, (rank, entry) in enumerate(ranks):
            lines.append(f"   {json.dumps(rank)}: {json.dumps(entry)}" + ("," if j < len(ranks) - 1 else ""))
        lines.append("  }}" + ("," if i < len(run_ids) - 1 else ""))
    lines += [" }", "}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare with the shipped file; write nothing")
    args = p.parse_args(argv)
    text = dumps(build())
    if args.check:
        same = OUT.read_text() == text
        verdict = "the same as the recordings give" if same else "DIFFERS from the recordings"
        print(f"{OUT.relative_to(ROOT)}: {verdict}")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)} ({len(text.encode()) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Probe a real GPU for what the lessons show: the driver's view, an OOM that pins nothing, cache timings.

Run by scripts/gpu-run.sh (its check phase); prints JSON lines. Needs CUDA.
"""

import gc
import json

import torch

from memviz.lab import Lab
from memviz.timing import cache_timings


def show(label, value):
    print(json.dumps({label: value}, default=str))


lab = Lab("cuda", cap="2 GiB")
show("backend", lab.describe())
show("driver_after_init", lab.backend.driver_memory().__dict__)
show("reserved_after_init", torch.cuda.memory_reserved())
lab.allocate("1 GiB", name="a")
before = torch.cuda.memory_allocated()
event = lab.allocate("3 GiB", name="huge")
show("oom_event", {"ok": event.ok, "message": event.oom.message if event.oom else None})
show("allocated_before_after_oom", [before, torch.cuda.memory_allocated()])
gc.collect()
show("allocated_after_gc", torch.cuda.memory_allocated())
lab.allocate("4 MiB", count=600, name="chunk")
kept = len(lab.groups["chunk"])
lab.free(*[f"chunk[{i}]" for i in range(kept) if i % 5])
event = lab.allocate("200 MiB", name="wide")
show("fragmentation_oom", {"ok": event.ok, "kept": kept, "message": event.oom.message if event.oom else None})
show("explain", str(lab.explain_oom()))
show("driver_with_cache", lab.backend.driver_memory().__dict__)
lab.free_all()
lab.empty_cache()
show("snapshot_segments_after_empty", len(lab.snapshot()["segments"]))
show("cache_timings", str(cache_timings()))

"""Record the predictor's truth on a real GPU: memviz/examples.py and evaluation/programs/, a fresh process per run.

    python3 evaluation/record_runs.py --out DIR [--jobs 12] [--deadline-s 170] [--parts plan,chains,probe]

Runs, in parallel processes (each alone in its process, so each starts with an empty cache), the parts
named by ``--parts`` (default ``plan,chains,probe``, what ``evaluation/recordings/`` was first recorded with):

- every entry of ``PLAN``: one program with its keyword arguments, an allocator config
  (``PYTORCH_CUDA_ALLOC_CONF``, set before torch starts) and a cap (``set_per_process_memory_fraction``);
- every entry of ``CHAINS``: the largest batch that fits under a cap, found by doubling/halving then
  bisection, one fresh process per try (each try is also a capped fits/OOM data point);
- ``probe``: cuDNN convolution workspaces per geometry, forward / backward-data / backward-weight, fp32
  and bf16 at batches 1/16/64, and cuBLAS's workspaces per thread (main thread, autograd's thread);
- ``probe2``: the extended convolution probe, one process per (batch, dtype) shard: every convolution of
  the recorded programs (ResNet-18/50 at 224² and 160², the VGG-style convnet at widths 64 and 32), a
  few 3×3 sizes no program has (20², 40²), and (added after the second recording) 4 patchify stems and 4
  3×3 stride-2 RGB stems, at batches 32/128/256 (and 96/192, held out), fp32 and bf16, each request's size
  (``--probe-sources patchify,stem-s2`` for only some);
- ``heldout`` / ``heldout-chains``: ``HELDOUT`` and ``HELDOUT_CHAINS``, the programs of
  ``evaluation/programs/heldout.py`` (never used to fit the predictor) and of programs.py at sizes never
  recorded, under default and expandable segments, caps near the predicted cliff, largest-batch searches.

Each run writes ``DIR/runs/<id>.json.gz``::

    {"id", "program", "kwargs", "alloc_conf", "cap_bytes", "total_bytes", "torch", "device_name",
     "fits", "oom": null | {"message", "step_hint"},
     "peaks": {"allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes"},
     "stats": torch.cuda.memory_stats() at the end,
     "frames": ["file:line:function", ...],
     "events": [[action, addr, size, frame_index or -1, user_frame_index or -1], ...],
     "seconds"}

``events`` is ``torch.cuda.memory._snapshot()["device_traces"][0]`` (alloc, free_requested,
free_completed, segment_alloc, segment_free, segment_map, segment_unmap, oom), with the innermost Python
frame and the innermost frame in the program's file of each entry. Chains write ``DIR/chains.json``
(held-out ones ``DIR/heldout_chains.json``); the probe ``DIR/probe.json.gz``; the extended probe
``DIR/probe2/<batch>-<dtype>.json.gz``::

    {"torch", "device_name", "cudnn", "batch", "dtype", "truncated", "conv": [
        {"c_in", "c_out", "k", "stride", "pad", "hw", "bias", "batch", "dtype", "out_shape", "sources",
         "forward" | "backward_input" | "backward_weight" | "backward_all":
             {"allocs", "requested_bytes", "kept_bytes", "peak_above_start_bytes", "sizes": [bytes, ...]}}],
     "trace_allocs", "counted_allocs"}

(``sizes``: every allocation the call made, in order, the trace's ``size`` of each (to be trusted when
``trace_allocs == counted_allocs``); ``backward_all`` is the call autograd makes, every gradient at once,
the bias included when the layer has one). ``DIR/summary.json`` lists everything.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

GiB = 1 << 30
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: memviz and evaluation from this checkout

#: (id, program, kwargs, alloc_conf, cap in GiB). Caps well above the need leave the run unconstrained;
#: they only keep parallel processes from crowding one GPU.
PLAN: list[tuple[str, str, dict, str, float]] = [
    ("mlp-b256", "mlp_training", {"batch": 256}, "", 24),
    ("mlp-b1024-amp", "mlp_training", {"batch": 1024, "amp": True}, "", 24),
    ("resnet18-b64", "resnet_training", {"batch": 64, "depth": 18}, "", 24),
    ("resnet18-b64-amp", "resnet_training", {"batch": 64, "depth": 18, "amp": True}, "", 24),
    ("resnet18-b128", "resnet_training", {"batch": 128, "depth": 18}, "", 24),
    ("resnet50-b32", "resnet_training", {"batch": 32, "depth": 50}, "", 24),
    ("resnet50-b32-amp", "resnet_training", {"batch": 32, "depth": 50, "amp": True}, "", 24),
    ("resnet50-b16-img160", "resnet_training", {"batch": 16, "depth": 50, "image": 160}, "", 24),
    ("convnet-b128", "convnet_sgd_training", {"batch": 128}, "", 24),
    ("convnet-b256-w32", "convnet_sgd_training", {"batch": 256, "width": 32}, "", 24),
    ("gpt-b8-amp", "gpt_training", {"batch": 8}, "", 24),
    ("gpt-b8-fp32", "gpt_training", {"batch": 8, "amp": False}, "", 24),
    ("gpt-b8-amp-ckpt", "gpt_training", {"batch": 8, "checkpoint": True}, "", 24),
    ("gpt-b16-amp", "gpt_training", {"batch": 16}, "", 24),
    ("gpt-b4-seq1024-amp", "gpt_training", {"batch": 4, "seq": 1024}, "", 24),
    ("gpt-b8-d1024-l8-amp", "gpt_training", {"batch": 8, "d_model": 1024, "n_layer": 8, "n_head": 16}, "", 24),
    ("resnet50-inf-b64", "resnet_inference", {"batch": 64}, "", 24),
    ("resnet18-inf-b256", "resnet_inference", {"batch": 256, "depth": 18}, "", 24),
    ("gpt-inf-b16", "gpt_inference", {"batch": 16}, "", 24),
    ("resnet18-b64-exp", "resnet_training", {"batch": 64, "depth": 18}, "expandable_segments:True", 24),
    ("resnet50-b32-exp", "resnet_training", {"batch": 32, "depth": 50}, "expandable_segments:True", 24),
    ("gpt-b8-amp-exp", "gpt_training", {"batch": 8}, "expandable_segments:True", 24),
    ("gpt-b8-amp-ckpt-exp", "gpt_training", {"batch": 8, "checkpoint": True}, "expandable_segments:True", 24),
    ("resnet50-b32-ms128", "resnet_training", {"batch": 32, "depth": 50}, "max_split_size_mb:128", 24),
    ("gpt-b8-amp-gc", "gpt_training", {"batch": 8},
     "garbage_collection_threshold:0.6,max_split_size_mb:128", 6),
    ("gpt-b8-amp-rp4", "gpt_training", {"batch": 8}, "roundup_power2_divisions:4", 24),
    ("resnet18-b64-rp4", "resnet_training", {"batch": 64, "depth": 18}, "roundup_power2_divisions:4", 24),
    # capped single runs (a cap below the unconstrained peak reserved: the allocator frees and retries)
    ("resnet18-b64-cap2", "resnet_training", {"batch": 64, "depth": 18}, "", 2),
    ("gpt-b8-amp-cap3", "gpt_training", {"batch": 8}, "", 3),
    ("resnet50-b32-cap4", "resnet_training", {"batch": 32, "depth": 50}, "", 4),
    ("resnet50-b32-cap4-exp", "resnet_training", {"batch": 32, "depth": 50}, "expandable_segments:True", 4),
]

MiB = 1 << 20
EXP = "expandable_segments:True"

#: Held-out runs, as PLAN: programs of evaluation/programs/heldout.py, and gpt_training at a size never recorded.
#: The caps in MiB are 3% either side of the smallest cap the predictor said fits (memviz at 58b1c33, H200):
#: a miss there is off the 1.5% cliff band, so it counts.
HELDOUT: list[tuple[str, str, dict, str, float]] = [
    ("ho-vgg11-b32", "vgg_training", {"batch": 32}, "", 24),
    ("ho-vgg11-b32-exp", "vgg_training", {"batch": 32}, EXP, 24),
    ("ho-vgg11-b64-amp", "vgg_training", {"batch": 64, "amp": True}, "", 24),
    ("ho-mbv2-b64", "mobilenet_training", {"batch": 64}, "", 24),
    ("ho-mbv2-b64-exp", "mobilenet_training", {"batch": 64}, EXP, 24),
    ("ho-mbv2-b96-amp", "mobilenet_training", {"batch": 96, "amp": True}, "", 24),
    ("ho-mbv2-inf-b128", "mobilenet_inference", {"batch": 128}, "", 24),
    ("ho-vit-b64-amp", "vit_training", {"batch": 64}, "", 24),
    ("ho-vit-b64-amp-exp", "vit_training", {"batch": 64}, EXP, 24),
    ("ho-vit-b32-fp32", "vit_training", {"batch": 32, "amp": False}, "", 24),
    ("ho-vit-b64-amp-rp4", "vit_training", {"batch": 64}, "roundup_power2_divisions:4", 24),
    ("ho-vit-inf-b256", "vit_inference", {"batch": 256}, "", 24),
    ("ho-bert-b16-amp", "bert_training", {"batch": 16}, "", 24),
    ("ho-bert-b16-amp-exp", "bert_training", {"batch": 16}, EXP, 24),
    ("ho-bert-b8-fp32", "bert_training", {"batch": 8, "amp": False}, "", 24),
    ("ho-bert-b16-amp-ms64", "bert_training", {"batch": 16}, "max_split_size_mb:64", 24),
    ("ho-llama-b4-ckpt", "llama_training", {"batch": 4}, "", 24),
    ("ho-llama-b4-ckpt-exp", "llama_training", {"batch": 4}, EXP, 24),
    ("ho-llama-b2-nockpt", "llama_training", {"batch": 2, "checkpoint": False}, "", 24),
    ("ho-llama-gen-b8", "llama_generate", {"batch": 8}, "", 24),
    ("ho-llama-gen-b8-exp", "llama_generate", {"batch": 8}, EXP, 24),
    ("ho-gpt-b4-s1024-d1024-ckpt", "gpt_training",
     {"batch": 4, "seq": 1024, "d_model": 1024, "n_layer": 8, "n_head": 16, "checkpoint": True}, "", 24),
    ("ho-gpt-b4-s1024-d1024-ckpt-exp", "gpt_training",
     {"batch": 4, "seq": 1024, "d_model": 1024, "n_layer": 8, "n_head": 16, "checkpoint": True}, EXP, 24),
    # caps near the predicted cliff
    ("ho-vgg11-b32-capm3", "vgg_training", {"batch": 32}, "", 3046 / 1024),
    ("ho-vgg11-b32-capp3", "vgg_training", {"batch": 32}, "", 3234 / 1024),
    ("ho-mbv2-b64-capm3", "mobilenet_training", {"batch": 64}, "", 4962 / 1024),
    ("ho-mbv2-b64-capp3", "mobilenet_training", {"batch": 64}, "", 5270 / 1024),
    ("ho-mbv2-b64-exp-capm3", "mobilenet_training", {"batch": 64}, EXP, 4792 / 1024),
    ("ho-vit-b64-amp-capm3", "vit_training", {"batch": 64}, "", 1427 / 1024),
    ("ho-vit-b64-amp-capp3", "vit_training", {"batch": 64}, "", 1515 / 1024),
    ("ho-bert-b16-amp-capm3", "bert_training", {"batch": 16}, "", 4140 / 1024),
    ("ho-bert-b16-amp-capp3", "bert_training", {"batch": 16}, "", 4396 / 1024),
    ("ho-llama-b4-ckpt-capm3", "llama_training", {"batch": 4}, "", 4047 / 1024),
    ("ho-llama-b4-ckpt-exp-capp3", "llama_training", {"batch": 4}, EXP, 4020 / 1024),
    ("ho-gpt-b4-s1024-d1024-ckpt-capm3", "gpt_training",
     {"batch": 4, "seq": 1024, "d_model": 1024, "n_layer": 8, "n_head": 16, "checkpoint": True}, "", 3953 / 1024),
]

#: The second held-out set (``--parts heldout2``): evaluation/programs/heldout_convs.py, written and capped (3%
#: either side of the predicted cliff) before the depthwise / grouped / patchify probe (``probe4``) was recorded or
#: fitted.
HELDOUT2: list[tuple[str, str, dict, str, float]] = [
    ("ho-cnx-b64-amp", "convnext_training", {"batch": 64}, "", 24),
    ("ho-cnx-b64-amp-exp", "convnext_training", {"batch": 64}, EXP, 24),
    ("ho-cnx-b64-amp-rp4", "convnext_training", {"batch": 64}, "roundup_power2_divisions:4", 24),
    ("ho-cnx-b16-fp32", "convnext_training", {"batch": 16, "amp": False}, "", 24),
    ("ho-cnx-inf-b256", "convnext_inference", {"batch": 256}, "", 24),
    ("ho-cnx-b64-amp-capm3", "convnext_training", {"batch": 64}, "", 1595 / 1024),
    ("ho-cnx-b64-amp-capp3", "convnext_training", {"batch": 64}, "", 1693 / 1024),
    ("ho-rnx-b32", "resnext_training", {"batch": 32}, "", 24),
    ("ho-rnx-b32-exp", "resnext_training", {"batch": 32}, EXP, 24),
    ("ho-rnx-b32-ms128", "resnext_training", {"batch": 32}, "max_split_size_mb:128", 24),
    ("ho-rnx-b64-amp", "resnext_training", {"batch": 64, "amp": True}, "", 24),
    ("ho-rnx-b32-capm3", "resnext_training", {"batch": 32}, "", 3028 / 1024),
    ("ho-rnx-b32-capp3", "resnext_training", {"batch": 32}, "", 3216 / 1024),
]

#: The third held-out set (``--parts heldout3``): torchvision's models (evaluation/programs/heldout_torchvision.py, the
#: recording machine's torchvision), never predicted before they were recorded.
HELDOUT3: list[tuple[str, str, dict, str, float]] = [
    (f"ho-tv-{name}", f"torchvision_{kind}", {"model": model, **kwargs}, conf, 24)
    for name, kind, model, kwargs, conf in (
        ("resnet50-b64", "training", "resnet50", {"batch": 64}, ""),
        ("resnet50-b64-exp", "training", "resnet50", {"batch": 64}, EXP),
        ("resnet50-b64-amp-cl", "training", "resnet50", {"batch": 64, "amp": True, "channels_last": True}, ""),
        ("effb0-b64-amp", "training", "efficientnet_b0", {"batch": 64, "amp": True}, ""),
        ("mbv3l-b128-amp", "training", "mobilenet_v3_large", {"batch": 128, "amp": True}, ""),
        ("convnext-t-b32-amp", "training", "convnext_tiny", {"batch": 32, "amp": True}, ""),
        ("convnext-t-b32-amp-exp", "training", "convnext_tiny", {"batch": 32, "amp": True}, EXP),
        ("vit-b16-b32-amp", "training", "vit_b_16", {"batch": 32, "amp": True}, ""),
        ("vit-b16-b32-amp-exp", "training", "vit_b_16", {"batch": 32, "amp": True}, EXP),
        ("swin-t-b32-amp", "training", "swin_t", {"batch": 32, "amp": True}, ""),
        ("densenet121-b32", "training", "densenet121", {"batch": 32}, ""),
        ("regnety16-b64-amp", "training", "regnet_y_1_6gf", {"batch": 64, "amp": True}, ""),
        ("resnet50-inf-b128", "inference", "resnet50", {"batch": 128}, ""),
        ("vit-b16-inf-b128", "inference", "vit_b_16", {"batch": 128}, ""),
        ("effb0-inf-b256", "inference", "efficientnet_b0", {"batch": 256}, ""),
        ("swin-t-inf-b64", "inference", "swin_t", {"batch": 64}, ""),
        ("convnext-t-inf-b128", "inference", "convnext_tiny", {"batch": 128}, ""),
    )
]

#: (id, program, kwargs without batch, alloc_conf, cap in GiB, first guess of a batch that fits, one that does not).
CHAINS: list[tuple[str, str, dict, str, float, int, int]] = [
    ("gpt-amp-cap8", "gpt_training", {}, "", 8, 12, 48),
    ("gpt-amp-cap8-exp", "gpt_training", {}, "expandable_segments:True", 8, 12, 48),
    ("gpt-amp-ckpt-cap8", "gpt_training", {"checkpoint": True}, "", 8, 16, 96),
    ("resnet50-cap6", "resnet_training", {"depth": 50}, "", 6, 24, 128),
    ("resnet50-cap6-exp", "resnet_training", {"depth": 50}, "expandable_segments:True", 6, 24, 128),
    ("resnet18-amp-cap4", "resnet_training", {"depth": 18, "amp": True}, "", 4, 64, 512),
    ("mlp-cap3", "mlp_training", {}, "", 3, 1024, 32768),
    ("convnet-cap2", "convnet_sgd_training", {}, "", 2, 64, 1024),
    ("resnet50-inf-cap2", "resnet_inference", {}, "", 2, 32, 1024),
]

#: Held-out searches, as CHAINS; the guesses are 0.8× and 1.25× the predicted largest batch (memviz at
#: 58b1c33: 51, 152, 31, 21), so a few tries bracket it; a wrong prediction only costs tries.
HELDOUT_CHAINS: list[tuple[str, str, dict, str, float, int, int]] = [
    ("ho-mbv2-cap4", "mobilenet_training", {}, "", 4, 41, 64),
    ("ho-vit-amp-cap3-exp", "vit_training", {}, EXP, 3, 122, 190),
    ("ho-bert-amp-cap6-exp", "bert_training", {}, EXP, 6, 25, 39),
    ("ho-llama-ckpt-cap12", "llama_training", {}, "", 12, 17, 26),
]

#: Largest-batch searches of the second held-out set (``--parts heldout2-chains``), as CHAINS.
HELDOUT2_CHAINS: list[tuple[str, str, dict, str, float, int, int]] = [
    ("ho-cnx-amp-cap4", "convnext_training", {}, "", 4, 160, 240),
    ("ho-rnx-cap4", "resnext_training", {}, "", 4, 44, 66),
]

#: Largest-batch searches of the third held-out set (``--parts heldout3-chains``), as CHAINS.
HELDOUT3_CHAINS: list[tuple[str, str, dict, str, float, int, int]] = [
    ("ho-tv-resnet50-cap8", "torchvision_training", {"model": "resnet50"}, "", 8, 64, 128),
    ("ho-tv-vit-b16-amp-cap8", "torchvision_training", {"model": "vit_b_16", "amp": True}, "", 8, 32, 96),
    ("ho-tv-effb0-amp-cap8-exp", "torchvision_training", {"model": "efficientnet_b0", "amp": True}, EXP, 8, 64, 256),
]


def _programs():
    """The fitted programs (:mod:`memviz.examples`)."""
    from memviz import examples

    return examples


def _program_module(program: str):
    """The module of :mod:`evaluation.programs` that defines ``program``."""
    from evaluation.programs import module_of

    return module_of(program)


def _frame_text(frame: dict) -> str:
    return f"{frame.get('filename', '?')}:{frame.get('line', 0)}:{frame.get('name', '?')}"


def run_one(spec: dict) -> dict:
    """In a fresh process: run one program under the spec's config and cap; return the record."""
    import torch

    programs = _program_module(spec["program"])
    total = torch.cuda.get_device_properties(0).total_memory
    cap = int(spec["cap_bytes"])
    fraction = cap / total
    while int(fraction * total) < cap:
        fraction += 1e-12
    torch.cuda.set_per_process_memory_fraction(min(fraction, 1.0))
    torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=3_000_000)
    fn = programs.PROGRAMS[spec["program"]]
    start = time.perf_counter()
    oom = None
    try:
        fn(**spec["kwargs"])
    except torch.OutOfMemoryError as e:
        oom = {"message": str(e).splitlines()[0][:600]}
    seconds = time.perf_counter() - start
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(None)
    frames: dict[str, int] = {}
    events = []
    prog_file = programs.__file__
    for e in snap["device_traces"][0]:
        fr = e.get("frames") or []
        inner = _frame_text(fr[0]) if fr else None
        user = next((_frame_text(f) for f in fr if f.get("filename") == prog_file), None)
        idx = [frames.setdefault(t, len(frames)) if t else -1 for t in (inner, user)]
        events.append([e["action"], e.get("addr", 0), e.get("size", 0), *idx])
    stats = torch.cuda.memory_stats()
    return {**spec, "total_bytes": total, "torch": torch.__version__, "device_name": torch.cuda.get_device_name(0),
            "fits": oom is None, "oom": oom, "seconds": round(seconds, 3),
            "peaks": {"allocated_bytes": stats["allocated_bytes.all.peak"],
                      "reserved_bytes": stats["reserved_bytes.all.peak"],
                      "active_bytes": stats["active_bytes.all.peak"],
                      "requested_bytes": stats["requested_bytes.all.peak"]},
            "stats": stats, "frames": list(frames), "events": events}


def probe() -> dict:
    """cuDNN convolution and cuBLAS workspaces, measured as requests that are no tensor."""
    import torch
    import torch.nn.functional as F

    ResNet = _programs().ResNet

    out: dict = {"torch": torch.__version__, "device_name": torch.cuda.get_device_name(0),
                 "cudnn": torch.backends.cudnn.version(), "blas": [], "conv": []}

    def counters() -> tuple[int, int, int]:
        s = torch.cuda.memory_stats()
        return s["allocation.all.allocated"], s["requested_bytes.all.allocated"], s["allocated_bytes.all.current"]

    def measure(fn, *args) -> dict:
        torch.cuda.synchronize()
        n0, r0, a0 = counters()
        torch.cuda.reset_peak_memory_stats()
        result = fn(*args)
        torch.cuda.synchronize()
        n1, r1, a1 = counters()
        return {"allocs": n1 - n0, "requested_bytes": r1 - r0, "kept_bytes": a1 - a0,
                "peak_above_start_bytes": torch.cuda.max_memory_allocated() - a0, "result": result}

    # cuBLAS / cuBLASLt: first matmuls on the main thread, then in autograd's backward thread
    a = torch.randn(1024, 1024, device="cuda", requires_grad=True)
    b = torch.randn(1024, 1024, device="cuda")
    cases = [("mm_fp32_main", lambda a, b: (a @ b).shape),
             ("mm_fp32_main_again", lambda a, b: (a @ b).shape),
             ("addmm_fp32_main", lambda a, b: torch.addmm(b, a, b).shape),
             ("mm_bf16_main", lambda a, b: (a.bfloat16() @ b.bfloat16()).shape),
             ("linear_fp32_main", lambda a, b: F.linear(a, b, b[0]).shape),
             ("backward_mm_fp32", lambda a, b: (a @ b).sum().backward()),
             ("backward_mm_fp32_again", lambda a, b: (a @ b).sum().backward())]
    for name, case in cases:
        r = measure(case, a, b)
        r.pop("result")
        out["blas"].append({"case": name, **r})
    with torch.autocast("cuda", dtype=torch.bfloat16):
        r = measure(lambda a, b: (a @ b).float().sum().backward(), a, b)
    r.pop("result")
    out["blas"].append({"case": "backward_mm_bf16_autocast", **r})
    del a, b

    # convolution geometries: every conv of resnet18/50 and of the VGG-style net, at several batches
    geoms = set()
    for depth in (18, 50):
        for m in ResNet(depth).modules():
            if isinstance(m, torch.nn.Conv2d):
                geoms.add((m.in_channels, m.out_channels, m.kernel_size[0], m.stride[0], m.padding[0]))
    for c_in, c_out in ((3, 64), (64, 128), (128, 256), (256, 512), (32, 64), (3, 32), (64, 64)):
        geoms.add((c_in, c_out, 3, 1, 1))
    sizes = {3: [224, 160, 64], 64: [56, 112, 64, 32], 128: [28, 56, 32, 16], 256: [14, 28, 16, 8],
             512: [7, 14, 8], 1024: [14, 7], 2048: [7], 32: [64, 32]}

    def forward(x, w, s, p):
        return F.conv2d(x, w, None, s, p)

    def backward(g, x, w, s, p, mask):
        grads = torch.ops.aten.convolution_backward(g, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, mask)
        return sum(t.nbytes for t in grads if t is not None)

    deadline = time.perf_counter() + 45
    for c_in, c_out, k, s, p in sorted(geoms):
        for hw in sizes.get(c_in, [14]):
            for batch in (1, 16, 64):
                for dtype in (torch.float32, torch.bfloat16):
                    if time.perf_counter() > deadline:
                        out["truncated"] = True
                        return out
                    x = torch.randn(batch, c_in, hw, hw, device="cuda", dtype=dtype)
                    w = torch.randn(c_out, c_in, k, k, device="cuda", dtype=dtype)
                    fwd = measure(forward, x, w, s, p)
                    y = fwd.pop("result")
                    fwd["out_bytes"] = y.nbytes
                    g = torch.randn_like(y)
                    del y
                    res = {"c_in": c_in, "c_out": c_out, "k": k, "stride": s, "pad": p, "hw": hw, "batch": batch,
                           "dtype": str(dtype).removeprefix("torch."), "out_shape": list(g.shape), "forward": fwd}
                    for part, mask in (("backward_input", [True, False, False]),
                                       ("backward_weight", [False, True, False])):
                        res[part] = measure(backward, g, x, w, s, p, mask)
                    out["conv"].append(res)
                    del x, w, g
    return out


PROBE2_BATCHES = (32, 128, 256, 96, 192)
"""The extended probe's batches: 32/128/256 to fit on (with the first probe's 1/16/64), 96 and 192 held out
to check the fitted rules between them."""
PROBE2_DTYPES = ("float32", "bfloat16")


def conv_geometries() -> list[dict]:
    """Every distinct 2-D convolution of the recorded programs, with the input size it runs at, a few 3×3
    sizes no program has, and patchify stems (kernel = stride): ``{"c_in", "c_out", "k", "stride", "pad",
    "hw", "bias", "sources"}``, the programs' own first (the convnet, ResNet-18/50 at 224², at 160²)."""
    import torch

    ResNet = _programs().ResNet
    found: dict[tuple, dict] = {}

    def add(c_in: int, c_out: int, k: int, stride: int, pad: int, hw: int, bias: bool, source: str,
            groups: int = 1, channels_last: bool = False) -> None:
        key = (c_in, c_out, k, stride, pad, hw, bias, groups, channels_last)
        entry = found.setdefault(key, {"c_in": c_in, "c_out": c_out, "k": k, "stride": stride, "pad": pad, "hw": hw,
                                       "bias": bias, "sources": []})
        if groups != 1:
            entry["groups"] = groups
        if channels_last:
            entry["channels_last"] = True
        if source not in entry["sources"]:
            entry["sources"].append(source)

    for width in (64, 32):  # convnet_sgd_training: 3×3 convolutions with bias on 64², 32², 16², 8²
        c, hw = 3, 64
        for out in (width, 2 * width, 4 * width, 8 * width):
            add(c, out, 3, 1, 1, hw, True, f"convnet-w{width}")
            c, hw = out, hw // 2

    def add_model(make_model: Callable, image: int, source: str) -> None:
        """Every convolution of the model (built on the meta device) at the input size it meets."""
        with torch.device("meta"):
            model = make_model()
            hooks = [m.register_forward_pre_hook(
                lambda m, args: add(m.in_channels, m.out_channels, m.kernel_size[0], m.stride[0], m.padding[0],
                                    args[0].shape[-1], m.bias is not None, source, groups=m.groups))
                for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
            model(torch.empty(1, 3, image, image))
            for h in hooks:
                h.remove()

    for image in (224, 160):
        for depth in (18, 50):
            add_model(lambda d=depth: ResNet(d), image, f"resnet{depth}-{image}")
    for c in (64, 128, 256, 512):
        for hw in (20, 40):
            add(c, c, 3, 1, 1, hw, False, "grid")
    # RGB stems the first two recordings lacked (the held-out ViT and MobileNetV2 showed the 7×7/2 and 3×3/1
    # stem rules do not carry): patchify stems (ViT 16×16, ConvNeXt/Swin 4×4) and 3×3 stride-2 stems
    for c_out, k in ((384, 16), (768, 16), (96, 4), (128, 4)):
        add(3, c_out, k, k, 0, 224, True, "patchify")
    for c_out, hw in ((32, 224), (64, 224), (32, 160), (24, 192)):
        add(3, c_out, 3, 2, 1, hw, False, "stem-s2")
    # added for the fourth recording (probe4), none of them a geometry of evaluation/programs/heldout.py's or
    # heldout_convs.py's networks, so those stay held out: more patchify stems (other widths, 8/14/32 patches),
    # 2×2/2 downsampling between aligned channels, depthwise 3/5/7 (stride 1 and 2), grouped 3×3 (8/32/64 groups)
    for c_out, k in ((192, 16), (256, 16), (512, 16), (1024, 16), (384, 8), (768, 8), (384, 14), (768, 14),
                     (768, 32), (64, 4), (192, 4)):
        add(3, c_out, k, k, 0, 224, True, "patchify2")
    for c, hw in ((64, 56), (128, 28), (256, 14), (512, 7)):
        add(c, 2 * c, 2, 2, 0, hw, True, "patch-merge")
    for k in (3, 5, 7):
        for c, hw in ((64, 56), (128, 28), (256, 14), (512, 7)):
            add(c, c, k, 1, k // 2, hw, True, "depthwise", groups=c)
    for c, hw, k in ((64, 112, 3), (128, 56, 3), (256, 28, 3), (128, 56, 5)):
        add(c, c, k, 2, k // 2, hw, False, "depthwise", groups=c)
    for c, hw, stride, groups in ((64, 56, 1, 32), (192, 28, 1, 32), (384, 14, 1, 32), (768, 7, 1, 32),
                                  (256, 56, 2, 32), (256, 28, 1, 8), (512, 14, 1, 64)):
        add(c, c, 3, stride, 1, hw, False, "grouped", groups=groups)
    # added for the sixth recording (probe5): the same depthwise convolutions with channels-last input and
    # weight (PyTorch then takes cuDNN for them, select_conv_backend), and the fitted ResNet-50's at 224² in
    # channels-last; with --probe-batches below 32 and odd, where cuDNN's engines for depthwise differ
    depthwise = [g for g in found.values() if "depthwise" in g["sources"]]
    for g in depthwise:
        add(g["c_in"], g["c_out"], g["k"], g["stride"], g["pad"], g["hw"], g["bias"], "depthwise-cl",
            groups=g["groups"], channels_last=True)
    for g in [g for g in found.values() if "resnet50-224" in g["sources"]]:
        add(g["c_in"], g["c_out"], g["k"], g["stride"], g["pad"], g["hw"], g["bias"], "resnet50-224-cl",
            channels_last=True)
    # added for the seventh recording (probe6): the held-out MobileNetV2's convolutions at 224² (1×1 expansions
    # and projections over channel counts that are not powers of two, contiguous depthwise 3×3), to be probed
    # with the ResNet-50's at batches that are not multiples of 8, where ho-mbv2-cap4-b41/b46 asked cuDNN
    # workspaces no probe had shown (MobileNetV2 is no longer held out for the rules read off it)
    add_model(_program_module("mobilenet_training").MobileNetV2, 224, "mobilenetv2-224")
    return list(found.values())


def probe_conv(batch: int, dtype_name: str, deadline_s: float, sources: set[str] | None = None) -> dict:
    """cuDNN's requests for every geometry of :func:`conv_geometries` at one batch and dtype
    (``cudnn.benchmark=False``, the default): forward, backward-input, backward-weight alone, and the
    call autograd makes (every gradient at once); each request's size from the allocator's trace. ``sources``:
    only the geometries with one of these sources (all when None)."""
    import torch

    dtype = getattr(torch, dtype_name)
    out: dict = {"torch": torch.__version__, "device_name": torch.cuda.get_device_name(0),
                 "cudnn": torch.backends.cudnn.version(), "batch": batch, "dtype": dtype_name, "truncated": False,
                 "conv": []}
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=1_000_000)
    base = torch.cuda.memory_stats()["allocation.all.allocated"]
    spans: list[tuple[dict, int, int]] = []  # (the measurement, first allocation number, count)

    def measure(fn, *args) -> tuple[dict, object]:
        torch.cuda.synchronize()
        s0 = torch.cuda.memory_stats()
        torch.cuda.reset_peak_memory_stats()
        result = fn(*args)
        torch.cuda.synchronize()
        s1 = torch.cuda.memory_stats()
        rec = {"allocs": s1["allocation.all.allocated"] - s0["allocation.all.allocated"],
               "requested_bytes": s1["requested_bytes.all.allocated"] - s0["requested_bytes.all.allocated"],
               "kept_bytes": s1["allocated_bytes.all.current"] - s0["allocated_bytes.all.current"],
               "peak_above_start_bytes": torch.cuda.max_memory_allocated() - s0["allocated_bytes.all.current"]}
        spans.append((rec, s0["allocation.all.allocated"] - base, rec["allocs"]))
        return rec, result

    def backward(g, x, w, s, p, mask, bias, groups):
        grads = torch.ops.aten.convolution_backward(g, x, w, [w.shape[0]] if bias else None, [s, s], [p, p], [1, 1],
                                                    False, [0, 0], groups, mask)
        return sum(t.nbytes for t in grads if t is not None)

    stop_at = time.perf_counter() + deadline_s
    for geom in conv_geometries():
        if sources is not None and not sources & set(geom["sources"]):
            continue
        if time.perf_counter() > stop_at:
            out["truncated"] = True
            break
        c_in, c_out, k, s, p, hw, bias = (geom[n] for n in ("c_in", "c_out", "k", "stride", "pad", "hw", "bias"))
        groups = geom.get("groups", 1)
        fmt = torch.channels_last if geom.get("channels_last") else torch.contiguous_format
        x = torch.randn(batch, c_in, hw, hw, device="cuda", dtype=dtype).to(memory_format=fmt)
        w = torch.randn(c_out, c_in // groups, k, k, device="cuda", dtype=dtype).to(memory_format=fmt)
        b = torch.randn(c_out, device="cuda", dtype=dtype) if bias else None
        fwd, y = measure(torch.nn.functional.conv2d, x, w, b, s, p, 1, groups)
        fwd["out_bytes"] = y.nbytes
        g = torch.randn_like(y)
        del y
        res = {**geom, "batch": batch, "dtype": dtype_name, "out_shape": list(g.shape), "forward": fwd}
        for part, mask in (("backward_input", [True, False, False]), ("backward_weight", [False, True, False]),
                           ("backward_all", [c_in != 3, True, bias])):
            res[part], res[part]["result"] = measure(backward, g, x, w, s, p, mask, bias, groups)
        out["conv"].append(res)
        del x, w, b, g
        torch.cuda.empty_cache()  # the shards share the GPU with the runs: hold no cache between geometries
    sizes = [e["size"] for e in torch.cuda.memory._snapshot()["device_traces"][0] if e["action"] == "alloc"]
    torch.cuda.memory._record_memory_history(None)
    out["trace_allocs"] = len(sizes)  # equal to counted_allocs, or the sizes are not to be trusted
    out["counted_allocs"] = torch.cuda.memory_stats()["allocation.all.allocated"] - base
    for rec, first, count in spans:
        rec["sizes"] = sizes[first:first + count]
    return out


def _spawn(spec: dict, out_dir: Path, timeout_s: float) -> dict:
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=spec["alloc_conf"], PYTHONPATH=str(ROOT))
    if not spec["alloc_conf"]:
        env.pop("PYTORCH_CUDA_ALLOC_CONF")
    path = out_dir / "runs" / f"{spec['id']}.json.gz"
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, __file__, "--one", json.dumps(spec), "--to", str(path)], env=env,
                              capture_output=True, text=True, timeout=timeout_s)
        ok = proc.returncode == 0
        err = proc.stderr[-2000:] if not ok else ""
    except subprocess.TimeoutExpired:
        ok, err = False, "timeout"
    wall = time.perf_counter() - t0
    if not ok:
        return {"id": spec["id"], "error": err, "wall_s": round(wall, 1)}
    with gzip.open(path, "rt") as f:
        rec = json.load(f)
    return {"id": spec["id"], "fits": rec["fits"], "peaks": rec["peaks"], "wall_s": round(wall, 1),
            "events": len(rec["events"])}


def _chain(chain: tuple, out_dir: Path, stop_at: float) -> dict:
    cid, program, kwargs, conf, cap_gib, lo_guess, hi_guess = chain
    tries: dict[int, bool] = {}

    def fits(batch: int) -> bool | None:
        if batch in tries:
            return tries[batch]
        if time.perf_counter() > stop_at:
            return None
        spec = {"id": f"{cid}-b{batch}", "program": program, "kwargs": {**kwargs, "batch": batch},
                "alloc_conf": conf, "cap_bytes": int(cap_gib * GiB)}
        r = _spawn(spec, out_dir, 120)
        if "error" in r:
            return None
        tries[batch] = r["fits"]
        return r["fits"]

    lo, hi = lo_guess, hi_guess
    while (f := fits(lo)) is False and lo > 1:
        hi, lo = lo, max(1, lo // 2)
    while f is True and fits(hi) is True:
        lo, hi = hi, hi * 2
    result = {"id": cid, "program": program, "kwargs": kwargs, "alloc_conf": conf, "cap_bytes": int(cap_gib * GiB)}
    while hi - lo > 1:
        mid = (lo + hi) // 2
        m = fits(mid)
        if m is None:
            result["incomplete"] = True
            break
        lo, hi = (mid, hi) if m else (lo, mid)
    if tries.get(lo) is True and tries.get(hi) is False and hi - lo == 1:
        result["max_batch"] = lo
    result["tries"] = {str(k): v for k, v in sorted(tries.items())}
    return result


PARTS = ("plan", "chains", "probe", "probe2", "heldout", "heldout-chains", "heldout2", "heldout2-chains", "heldout3",
         "heldout3-chains")


def _spec(run: tuple) -> dict:
    run_id, program, kwargs, conf, cap_gib = run
    return {"id": run_id, "program": program, "kwargs": kwargs, "alloc_conf": conf, "cap_bytes": int(cap_gib * GiB)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--deadline-s", type=float, default=170, help="chains and the probes stop starting work then")
    ap.add_argument("--parts", default="plan,chains,probe", help=f"comma-separated, of {','.join(PARTS)}")
    ap.add_argument("--one")
    ap.add_argument("--to", type=Path)
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--probe2", help="one shard of the extended probe: BATCH-DTYPE (e.g. 128-float32)")
    ap.add_argument("--probe-sources", help="probe2: only geometries of these comma-separated sources "
                                             "(e.g. patchify,stem-s2); default all")
    ap.add_argument("--probe-batches", help="probe2: comma-separated batches instead of "
                    + ",".join(map(str, PROBE2_BATCHES)))
    ap.add_argument("--dry-run", action="store_true", help="list what would run, start nothing")
    args = ap.parse_args()
    if args.one:
        rec = run_one(json.loads(args.one))
        args.to.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(args.to, "wt") as f:
            json.dump(rec, f, separators=(",", ":"))
        return
    if args.probe or args.probe2:
        if args.probe2:
            batch, dtype = args.probe2.split("-")
            sources = set(args.probe_sources.split(",")) if args.probe_sources else None
            result = probe_conv(int(batch), dtype, args.deadline_s, sources)
        else:
            result = probe()
        with gzip.open(args.to, "wt") as f:
            json.dump(result, f, separators=(",", ":"))
        return
    parts = args.parts.split(",")
    unknown = set(parts) - set(PARTS)
    if unknown:
        ap.error(f"unknown parts {sorted(unknown)}; choose from {','.join(PARTS)}")
    runs = [_spec(r) for r in (PLAN if "plan" in parts else []) + (HELDOUT if "heldout" in parts else [])
            + (HELDOUT2 if "heldout2" in parts else []) + (HELDOUT3 if "heldout3" in parts else [])]
    batches = tuple(int(b) for b in args.probe_batches.split(",")) if args.probe_batches else PROBE2_BATCHES
    chains = {"chains": CHAINS if "chains" in parts else [],
              "heldout_chains": (HELDOUT_CHAINS if "heldout-chains" in parts else [])
              + (HELDOUT2_CHAINS if "heldout2-chains" in parts else [])
              + (HELDOUT3_CHAINS if "heldout3-chains" in parts else [])}
    probes = (["probe"] if "probe" in parts else []) + \
        ([f"{b}-{d}" for b in batches for d in PROBE2_DTYPES] if "probe2" in parts else [])
    if args.dry_run:
        geometries = 0  # counted (which builds the ResNets, torch) only when the extended probe would run
        if "probe2" in parts:
            wanted = set(args.probe_sources.split(",")) if args.probe_sources else None
            geometries = sum(wanted is None or bool(wanted & set(g["sources"])) for g in conv_geometries())
        print(json.dumps({"runs": [r["id"] for r in runs], **{k: [c[0] for c in v] for k, v in chains.items()},
                          "probes": probes, "probe2_geometries": geometries}, indent=1))
        return
    out = args.out
    (out / "runs").mkdir(parents=True, exist_ok=True)
    (out / "probe2").mkdir(exist_ok=True)
    stop_at = time.perf_counter() + args.deadline_s
    probe_procs = []
    for name in probes:
        to = out / "probe.json.gz" if name == "probe" else out / "probe2" / f"{name}.json.gz"
        flag = ["--probe"] if name == "probe" else ["--probe2", name, "--deadline-s", str(args.deadline_s)]
        if name != "probe" and args.probe_sources:
            flag += ["--probe-sources", args.probe_sources]
        err = (out / f"probe-{name}.err").open("w")
        probe_procs.append((subprocess.Popen([sys.executable, __file__, *flag, "--to", str(to)],
                                             env=dict(os.environ, PYTHONPATH=str(ROOT)), stderr=err), err))
    summary: dict = {"runs": [], "chains": [], "heldout_chains": []}
    with ThreadPoolExecutor(args.jobs) as pool:
        chain_futs = {k: [pool.submit(_chain, c, out, stop_at - 20) for c in v] for k, v in chains.items()}
        run_futs = [pool.submit(_spawn, spec, out, 120) for spec in runs]
        for fut in run_futs:
            summary["runs"].append(fut.result())
            print(json.dumps(summary["runs"][-1]), flush=True)
        for key, futs in chain_futs.items():
            for fut in futs:
                summary[key].append(fut.result())
                print(json.dumps(summary[key][-1]), flush=True)
    for proc, err in probe_procs:
        try:
            proc.wait(timeout=max(1, stop_at - time.perf_counter() + 30))
        except subprocess.TimeoutExpired:
            proc.kill()
        err.close()
    for key in chains:
        if chains[key]:
            (out / f"{key}.json").write_text(json.dumps(summary[key], indent=1))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

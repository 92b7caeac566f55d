"""Predict a fixed set of programs and print what the predictions were, to compare torch builds.

    python3 scripts/predict_digest.py [--out FILE]

Run it with the CPU build of torch and with a CUDA build whose GPU is hidden (``CUDA_VISIBLE_DEVICES=""``, or
a machine without one): the predictions must be the same — a CUDA build never touches its runtime while
predicting. Each line: program, peaks, fits, the number of allocator calls and a digest of the call log.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import memviz
from evaluation.programs import hf
from memviz import examples

CASES = {
    "mlp-adamw": (examples.mlp_training, {"batch": 256}),
    "resnet18-amp": (examples.resnet_training, {"batch": 32, "depth": 18, "amp": True}),
    "gpt-amp-ckpt": (examples.gpt_training, {"batch": 4, "checkpoint": True}),
    "hf-gpt2-bf16": (hf.PROGRAMS["gpt2_finetune"], {"batch": 2, "seq": 128, "precision": "bf16"}),
    "hf-lora-llama": (hf.PROGRAMS["lora_finetune"], {"batch": 2, "seq": 128, "size": "160m"}),
}


def digest(p: memviz.predictor.Prediction) -> str:
    h = hashlib.sha256()
    for e in p.events:
        h.update(f"{e.action}|{e.nbytes}|{e.category}|{e.op}|{e.phase}\n".encode())
    return h.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    result = {"torch": torch.__version__, "cuda_built": torch.backends.cuda.is_built(), "cases": {}}
    for name, (fn, kwargs) in CASES.items():
        p = memviz.predict(fn, device="H200", **kwargs)
        result["cases"][name] = {"fits": p.fits, "allocated": p.peak_allocated_bytes,
                                 "reserved": p.peak_reserved_bytes, "calls": len(p.events), "digest": digest(p)}
        print(name, result["cases"][name], flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

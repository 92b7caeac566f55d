"""The programs lesson 13 predicts (memviz.examples' language-model programs), at the sizes it predicts them: recorded
on the H200 so that the lesson shows the GPU's peaks beside the predictions. Record:
``python3 evaluation/record_programs.py --module evaluation.programs.lessons --out DIR``; their blind prediction is
docs/predict-blind-lessons.txt."""

from __future__ import annotations

from memviz.examples import causal_lm_finetune, causal_lm_generate

__all__ = ["CHAINS", "PROGRAMS", "RUNS"]

PROGRAMS = {fn.__name__: fn for fn in (causal_lm_finetune, causal_lm_generate)}

_FT = {"batch": 8, "seq": 512, "layers": 4}
RUNS: list[dict] = [
    {"id": "l13-full", "program": "causal_lm_finetune", "kwargs": _FT, "alloc_conf": "", "cap_gib": None},
    {"id": "l13-full-ckpt", "program": "causal_lm_finetune", "kwargs": {**_FT, "checkpointing": True},
     "alloc_conf": "", "cap_gib": None},
    {"id": "l13-lora", "program": "causal_lm_finetune", "kwargs": {**_FT, "lora": True}, "alloc_conf": "",
     "cap_gib": None},
    {"id": "l13-lora-ckpt", "program": "causal_lm_finetune", "kwargs": {**_FT, "lora": True, "checkpointing": True},
     "alloc_conf": "", "cap_gib": None},
    {"id": "l13-full-b2-s2048", "program": "causal_lm_finetune", "kwargs": {**_FT, "batch": 2, "seq": 2048},
     "alloc_conf": "", "cap_gib": None},
    {"id": "l13-generate-dynamic", "program": "causal_lm_generate",
     "kwargs": {"batch": 8, "prompt": 128, "new_tokens": 16, "layers": 4, "cache": "dynamic"}, "alloc_conf": "",
     "cap_gib": None},
    {"id": "l13-generate-static", "program": "causal_lm_generate",
     "kwargs": {"batch": 8, "prompt": 128, "new_tokens": 16, "layers": 4, "cache": "static"}, "alloc_conf": "",
     "cap_gib": None},
]
CHAINS: list[dict] = []

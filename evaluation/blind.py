"""Predict a program set's recording plan before looking at its recordings: the blind figures.

    python -m evaluation.blind --module evaluation.programs.hf [--only ID ...] > docs/predict-blind-hf.txt

For every entry of the module's ``RUNS`` (``id, program, kwargs, alloc_conf, cap_gib``) it predicts on the H200
preset under the run's config and cap (none: the whole device less the CUDA context) and prints one line
``id: fits True, allocated N B, reserved N B, 1.23 s`` — or ``id: cannot predict: <error>`` — and for every
``CHAINS`` entry the largest batch (``id: largest batch N``). It reads no recording. :mod:`evaluation.recorded`
compares these lines with the recordings afterwards.
"""

from __future__ import annotations

import argparse
import importlib
import time
from typing import Any

GiB = 1 << 30

__all__ = ["predict_chain", "predict_run"]


def _cap(entry: dict[str, Any]) -> int | None:
    cap = entry.get("cap_gib")
    return None if cap is None else int(cap * GiB)


def predict_run(module: Any, entry: dict[str, Any]) -> str:
    """One plan entry's blind line."""
    from memviz.predictor import predict

    from .recorded import fresh_process_state

    fresh_process_state()
    start = time.perf_counter()
    try:
        p = predict(module.PROGRAMS[entry["program"]], device="H200", cap=_cap(entry),
                    alloc_conf=entry.get("alloc_conf") or None, **entry["kwargs"])
    except Exception as e:  # a blind figure too: the program could not be predicted
        return f"{entry['id']}: cannot predict: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
    notes = f" notes: {' | '.join(p.notes)}" if p.notes else ""
    return (f"{entry['id']}: fits {p.fits}, allocated {p.peak_allocated_bytes} B, reserved {p.peak_reserved_bytes} B, "
            f"{time.perf_counter() - start:.2f} s{notes}")


def predict_chain(module: Any, entry: dict[str, Any]) -> str:
    """One largest-batch search's blind line."""
    from memviz.predictor import max_batch

    program, kwargs = module.PROGRAMS[entry["program"]], entry["kwargs"]
    try:
        best = max_batch(lambda b: program(batch=b, **kwargs), device="H200", cap=_cap(entry),
                         alloc_conf=entry.get("alloc_conf") or None, lo=max(1, entry.get("start_batch", 1) // 4))
    except Exception as e:
        return f"{entry['id']}: cannot predict: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
    return f"{entry['id']}: largest batch {best}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", required=True, help="a program set with RUNS (and CHAINS)")
    parser.add_argument("--only", nargs="*", default=None, help="ids containing any of these")
    parser.add_argument("--no-chains", action="store_true")
    args = parser.parse_args(argv)
    module = importlib.import_module(args.module)
    wanted = (lambda i: True) if not args.only else (lambda i: any(o in i for o in args.only))
    for entry in module.RUNS:
        if wanted(entry["id"]):
            print(predict_run(module, entry), flush=True)
    if not args.no_chains:
        for entry in getattr(module, "CHAINS", []):
            if wanted(entry["id"]):
                print(predict_chain(module, entry), flush=True)


if __name__ == "__main__":
    main()

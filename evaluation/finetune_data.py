"""Copy the H200 figures lesson 13 prints out of its programs' recordings into ``memviz/data/h200_finetune.json``.

    python -m evaluation.finetune_data [--check]

Reads ``evaluation/recordings/lessons/runs/<id>.json.gz`` (``evaluation/record_programs.py``'s format) and keeps, per
run, the program, its keyword arguments, whether it fit and its peak allocated / reserved bytes, plus the versions
every recording shares. Nothing is computed: every value is copied from a recording. ``--check`` writes nothing and
exits 1 when the shipped file differs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDINGS = ROOT / "evaluation" / "recordings" / "lessons" / "runs"
TARGET = ROOT / "memviz" / "data" / "h200_finetune.json"


def build() -> dict:
    runs, meta = {}, None
    for path in sorted(RECORDINGS.glob("*.json.gz")):
        record = json.loads(gzip.decompress(path.read_bytes()))
        versions = {"device": record["device_name"], **record["versions"]}
        if meta is not None and versions != meta:
            raise SystemExit(f"{path.name}: recorded with other versions than the rest: {versions} vs {meta}")
        meta = versions
        runs[record["id"]] = {"program": record["program"], "kwargs": record["kwargs"], "fits": record["fits"],
                              "peak_allocated_bytes": record["peaks"]["allocated_bytes"],
                              "peak_reserved_bytes": record["peaks"]["reserved_bytes"]}
    return {"meta": meta, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = json.dumps(build(), indent=1, sort_keys=True) + "\n"
    if args.check:
        return 0 if TARGET.read_text() == text else 1
    TARGET.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The cuDNN workspace rules against the H200 probes (``evaluation/recordings/h200_probe*.json.gz``).

Each probe measured, per convolution geometry and pass (forward, backward-input, backward-weight), what cuDNN
allocated beyond the pass's result; :func:`rows` pairs each measurement with what the rules of
:mod:`memviz.predictor.rules.cudnn_conv` say for the same geometry. ``python -m evaluation.probes`` prints the
error of the rules per probe and family, on the geometries they were read off (fitted) and on the others (held out).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from memviz.predictor.rules.cudnn_conv import conv_workspace_bytes, depthwise_workspace_bytes, grouped_workspace_bytes

__all__ = ["PHASES", "PROBES", "error", "family", "held_out", "rows"]

RECORDINGS = Path(__file__).resolve().parent / "recordings"
PROBES = ("h200_probe.json.gz", "h200_probe2.json.gz", "h200_probe3.json.gz", "h200_probe4.json.gz",
          "h200_probe5.json.gz", "h200_probe6.json.gz")
PHASES = ("forward", "backward_input", "backward_weight")

Row = tuple[dict, str, int, int]
"""(geometry, pass, real workspace bytes, predicted workspace bytes)."""


def rows(probe: str) -> list[Row]:
    """Every measurement of ``probe`` (a file name of :data:`PROBES`) with the rules' prediction."""
    data = json.loads(gzip.decompress((RECORDINGS / probe).read_bytes()))
    out = []
    for g in data["conv"]:
        groups, channels_last = g.get("groups", 1), g.get("channels_last", False)
        es = 4 if g["dtype"] == "float32" else 2
        n, c_out, h_out, w_out = g["out_shape"]
        input_bytes = g["batch"] * g["c_in"] * g["hw"] ** 2 * es
        output_bytes = n * c_out * h_out * w_out * es
        weight_bytes = c_out * g["c_in"] // groups * g["k"] ** 2 * es
        for phase in PHASES:
            m = g[phase]
            real = m["requested_bytes"] - m.get("out_bytes", m.get("result", 0))
            if groups == 1:
                pred = conv_workspace_bytes(phase, g["c_in"], c_out, (g["k"],) * 2, (g["stride"],) * 2, es,
                                            input_bytes, output_bytes, weight_bytes, n * h_out * w_out, n,
                                            channels_last)
            elif groups == g["c_in"]:
                pred = depthwise_workspace_bytes(phase, c_out, (g["k"],) * 2, es, input_bytes, n, channels_last)
            else:
                pred = grouped_workspace_bytes(phase, g["c_in"], groups, es, input_bytes, output_bytes, weight_bytes)
            out.append((g, phase, real, pred))
    return out


def held_out(probe: str, g: dict) -> bool:
    """Whether no rule was read off this measurement: the second probe's batches 96 and 192 and its 20²/40² grid
    sizes, the first probe's 160×160 RGB stems (checks of the stem rules read off 224² and 64²)."""
    if probe == "h200_probe2.json.gz":
        return g["batch"] in (96, 192) or "grid" in g["sources"]
    if probe == "h200_probe.json.gz":
        return g["c_in"] == 3 and g["hw"] == 160
    return False


def family(g: dict) -> str:
    """The rule family a geometry falls in: depthwise, grouped, patchify, stem, channels-last, 1x1, dense."""
    groups = g.get("groups", 1)
    if groups > 1:
        return "depthwise" if groups == g["c_in"] else "grouped"
    if g.get("channels_last"):
        return "channels-last"
    if g["c_in"] == 3:
        return "patchify" if g["k"] == g["stride"] else "stem"
    return "1x1" if g["k"] == 1 else "dense"


def error(measurements: list[Row]) -> float:
    """Σ|predicted − real| / Σ real over ``measurements`` (0 when they ask nothing and none is predicted)."""
    total = sum(real for _, _, real, _ in measurements)
    miss = sum(abs(pred - real) for _, _, real, pred in measurements)
    return miss / total if total else float(miss > 0)


def main() -> None:
    print("| probe | family | fitted: measurements | error | held out: measurements | error |")
    print("|---|---|---|---|---|---|")
    for probe in PROBES:
        by_family: dict[str, tuple[list[Row], list[Row]]] = {}
        for row in rows(probe):
            fitted, held = by_family.setdefault(family(row[0]), ([], []))
            (held if held_out(probe, row[0]) else fitted).append(row)
        for name, (fitted, held) in sorted(by_family.items()):
            cells = [f"{len(group)} | {error(group) * 100:.1f}%" if group else "0 | " for group in (fitted, held)]
            print(f"| {probe} | {name} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()

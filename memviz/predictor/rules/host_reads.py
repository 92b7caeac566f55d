"""Values torch's own code reads from device tensors in an ordinary program, answered as a healthy GPU run.

A prediction computes no values. Where torch itself reads one to decide (GradScaler's overflow check, a
distribution validating its arguments), the memory does not depend on the answer, and a healthy run on the GPU
reads the answer given here. Keyed by ``(file under torch/, function, Tensor method)``; ``apply(frame)`` gets the
asking frame. The program's own reads (``loss.item()``) are not here.
"""

from __future__ import annotations

from . import Rule

__all__ = ["RULES"]

RULES = (
    Rule("GradScaler's overflow check reads a healthy step", "host_reads", "host_read",
         (("amp/grad_scaler.py", "_maybe_opt_step", "item"),), lambda frame: 0.0, "source",
         "torch/amp/grad_scaler.py (_maybe_opt_step: found_inf)"),
    Rule("GradScaler's scale and growth tracker read unchanged", "host_reads", "host_read",
         (("amp/grad_scaler.py", "get_scale", "item"),), lambda frame: float(frame.f_locals["self"]._init_scale),
         "source", "torch/amp/grad_scaler.py (get_scale, state_dict): no step overflowed, so no step lowered the "
         "scale (accelerate compares the scale before and after update() to see a skipped step: none is)"),
    Rule("GradScaler's growth tracker reads 0", "host_reads", "host_read",
         (("amp/grad_scaler.py", "_get_growth_tracker", "item"),), lambda frame: 0, "source",
         "torch/amp/grad_scaler.py (_get_growth_tracker)"),
    Rule("a distribution's argument and sample checks pass", "host_reads", "host_read",
         (("distributions/distribution.py", "__init__", "__bool__"),
          ("distributions/distribution.py", "_validate_sample", "__bool__")), lambda frame: True, "source",
         "torch/distributions/distribution.py (validate_args, on by default): a valid program's pass"),
)

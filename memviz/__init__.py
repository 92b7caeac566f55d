"""memviz: watch PyTorch's CUDA caching allocator, on a real GPU or an exact simulator.

Parts, one module each:

- :mod:`memviz.sim` — a pure-Python replica of c10's CUDACachingAllocator (no torch needed).
- :mod:`memviz.backends` — one interface over ``torch.cuda`` and the simulator.
- :mod:`memviz.lab` — :class:`Lab`: named tensors, actions, events, OOM as data.
- :mod:`memviz.widgets` — live gauges, timeline, segment map and controls; :func:`dashboard`.
- :mod:`memviz.snapshots` — load, scrub, replay and export PyTorch memory snapshots.
"""

from memviz.lab import Lab

__all__ = ["Lab", "__version__", "dashboard"]

__version__ = "0.1.0"


def dashboard(lab: Lab | None = None, **lab_kwargs):
    """The whole dashboard (gauges, timeline, segment map, controls, log) on ``lab`` or a new ``Lab(**lab_kwargs)``."""
    from memviz.widgets import dashboard as make

    return make(lab, **lab_kwargs)

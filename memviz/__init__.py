"""memviz: watch PyTorch's CUDA caching allocator, on a real GPU or an exact simulator.

Parts, one module each:

- :mod:`memviz.sim` — a pure-Python replica of c10's CUDACachingAllocator (no torch needed).
- :mod:`memviz.backends` — one interface over ``torch.cuda`` and the simulator.
- :mod:`memviz.lab` — :class:`Lab`: named tensors, actions, events, OOM as data.
- :mod:`memviz.widgets` — live gauges, timeline, segment map and controls; :func:`dashboard`.
- :mod:`memviz.snapshots` — load, scrub, replay and export PyTorch memory snapshots.
- :mod:`memviz.predictor` — :func:`predict` and :func:`max_batch`: will a program fit, with no GPU.
- :mod:`memviz.watching` — :func:`watch` a training loop live while its cell runs (``%%memviz`` after
  ``%load_ext memviz``), :func:`step` markers, :func:`record` a job's memory for a notebook to follow.

Everything a lesson uses is importable from here (``__all__``; tests/test_exported_members.py locks it).
The widget names (``dashboard``, ``SnapshotViewer``, ``WhatIfTable``) load :mod:`memviz.widgets` on first
use, so ``import memviz`` imports neither ipywidgets, plotly nor torch.
"""

from importlib import import_module as _import_module
from importlib import metadata as _metadata
from typing import Any as _Any

from memviz.backends import cuda_available
from memviz.compare import compare_configs
from memviz.errors import DataDependentError, InputError, MemvizError, OutOfMemoryError, SnapshotError
from memviz.glossary import FAMILIES, stats_table
from memviz.lab import Lab
from memviz.layout import segment_table
from memviz.shapes import tensor_request
from memviz.sim import RECORDED_CONFIGS
from memviz.snapshots import SnapshotHistory, dump_snapshot, dumps_snapshot, load_snapshot, what_if
from memviz.timing import cache_timings, recorded_h200
from memviz.units import format_bytes
from memviz.watching.steps import step

__all__ = [
    "FAMILIES",
    "RECORDED_CONFIGS",
    "DataDependentError",
    "InputError",
    "Lab",
    "MemvizError",
    "OutOfMemoryError",
    "SnapshotError",
    "SnapshotHistory",
    "SnapshotViewer",
    "WhatIfTable",
    "__version__",
    "cache_timings",
    "compare_configs",
    "cuda_available",
    "dashboard",
    "dump_snapshot",
    "dumps_snapshot",
    "fit_panel",
    "format_bytes",
    "load_ipython_extension",
    "load_snapshot",
    "max_batch",
    "predict",
    "predicting",
    "record",
    "recorded_h200",
    "segment_table",
    "stats_table",
    "step",
    "tensor_request",
    "watch",
    "what_if",
]

_LAZY = {"dashboard": "memviz.widgets", "SnapshotViewer": "memviz.widgets", "WhatIfTable": "memviz.widgets",
         "max_batch": "memviz.predictor", "predict": "memviz.predictor", "predicting": "memviz.predictor",
         "fit_panel": "memviz.widgets.fit_panel", "watch": "memviz.watching.watch",
         "record": "memviz.watching.record"}
"""Names whose module imports ipywidgets and plotly, or torch (the predictor), or numpy (watching): loaded on first
access (PEP 562)."""


def load_ipython_extension(ipython: _Any) -> None:
    """``%load_ext memviz``: registers the ``%%memviz`` cell magic, which watches a cell's memory live while it
    runs (:mod:`memviz.watching.magic`)."""
    from memviz.watching.magic import load_ipython_extension as load

    load(ipython)


_DISTRIBUTIONS = ("memviz-lab", "memviz")  # pyproject's [project] name, then the name it had before


def _version() -> str:
    """The installed distribution's version (pyproject.toml is the one source; importlib.metadata reads it)."""
    for dist in _DISTRIBUTIONS:
        try:
            return _metadata.version(dist)
        except _metadata.PackageNotFoundError:
            pass
    for dist in _metadata.packages_distributions().get(__name__, ()):  # installed under yet another name
        return _metadata.version(dist)
    return "0+unknown"  # a source tree that was never installed (pip install -e . installs it)


__version__ = _version()


def __getattr__(name: str) -> _Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

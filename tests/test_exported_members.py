"""The surface the lessons teach: ``memviz.__all__`` is locked here (httpx's pattern).

Adding or removing a public name is a decision: change this list with it. Helpers adding the predictor
(``predict``, ``max_batch``) and ``fit_panel`` add them here too; watching live added ``watch``, ``step``,
``record`` and ``load_ipython_extension`` (``%load_ext memviz``).
"""

import subprocess
import sys
import types

import memviz

EXPORTED = [
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


def test_all_is_exactly_the_taught_surface() -> None:
    assert memviz.__all__ == EXPORTED


def test_nothing_public_is_left_out_of_all() -> None:
    """httpx's check: every public name of the package is in ``__all__`` (submodules aside)."""
    public = {name for name, value in vars(memviz).items()
              if not name.startswith("_") and not isinstance(value, types.ModuleType)}
    assert public <= set(memviz.__all__), public - set(memviz.__all__)


def test_every_exported_name_resolves_and_is_documented() -> None:
    for name in memviz.__all__:
        value = getattr(memviz, name)
        if callable(value):
            assert value.__doc__, f"memviz.{name} has no docstring"
    assert isinstance(memviz.__version__, str) and memviz.__version__[0].isdigit()


def test_exported_members_come_from_their_modules() -> None:
    from memviz.compare import compare_configs
    from memviz.snapshots import SnapshotHistory, load_snapshot
    from memviz.widgets import SnapshotViewer

    assert memviz.compare_configs is compare_configs and memviz.load_snapshot is load_snapshot
    assert memviz.SnapshotHistory is SnapshotHistory and memviz.SnapshotViewer is SnapshotViewer


def test_import_memviz_loads_no_widget_or_gpu_library() -> None:
    code = ("import sys, memviz; heavy = ('torch', 'ipywidgets', 'plotly', 'anywidget');"
            " print([m for m in heavy if m in sys.modules]); assert 'dashboard' in dir(memviz)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_version_comes_from_the_distribution_pyproject_names() -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    name = re.search(r'^name = "([^"]+)"', text, re.M).group(1)
    assert name in memviz._DISTRIBUTIONS

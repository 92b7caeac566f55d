"""Test-run configuration shared by tests/ and the notebooks that pytest validates with nbval."""

import pprint

import pytest

try:
    import nbval.kernel
except ImportError:  # pytest without nbval (e.g. only the unit tests): nothing to patch
    nbval = None


class _Pformat:
    """``pprint.pformat(obj)``, computed only when a log record is actually emitted.

    nbval formats every kernel message for a debug log line even when debug logging is off; plotly's
    FigureWidget ships its ~5 MB JavaScript bundle in each widget's first message, so that formatting
    alone cost about a second per notebook.
    """

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def __str__(self) -> str:
        return pprint.pformat(self.obj)


if nbval is not None:
    nbval.kernel.pformat = _Pformat


# Wall seconds each file took in the full suite (`-n auto` on the 2-core dev box, both workers busy; measured
# with benchmarks/bench_suite.py --table). Only the order matters: files start longest first, so the two
# workers end together. Files not listed take the default of their kind; a file whose cost changed a lot
# only schedules less well until it is measured again (nothing is skipped or reordered within a file).
FILE_COST_S = {
    "tests/browser": 61.7,  # the browser files share one worker (see the scheduler below): one scope
    "notebooks/10_what_a_training_step_holds.ipynb": 19.4,
    "tests/test_hostile_load.py": 15.5,
    "notebooks/09_your_own_run.ipynb": 13.5,
    "tests/test_sim_golden.py": 10.2,
    "tests/test_fit_panel.py": 9.6,
    "tests/test_hostile_lab.py": 8.0,
    "tests/test_torchrun_example.py": 8.0,  # estimated: two torchrun ranks on CPU (process start dominates)
    "tests/test_predict_recorded.py": 7.0,
    "tests/test_snapshot_viewer.py": 7.0,
    "tests/test_widgets.py": 7.0,
    "notebooks/03_what_keeps_memory_alive.ipynb": 4.8,
    "tests/test_sim_properties.py": 4.7,
    "tests/test_snapshots_whatif.py": 4.3,
    "notebooks/01_start_here.ipynb": 4.1,
    "notebooks/04_why_a_cache.ipynb": 4.0,
    "notebooks/02_allocated_vs_reserved.ipynb": 4.0,
    "tests/test_sim_addresses.py": 3.8,
    "notebooks/07_the_fixes.ipynb": 3.8,
    "notebooks/11_streams_graphs_and_pools.ipynb": 3.6,
    "notebooks/12_more_than_one_gpu.ipynb": 8.0,  # estimated: 10 s alone under a load of 4
    "notebooks/13_will_my_fine_tune_fit.ipynb": 9.0,  # 7.1 s of nbval alone
    "notebooks/06_empty_cache_can_and_cannot.ipynb": 3.4,
    "notebooks/08_when_to_empty_cache.ipynb": 3.4,
    "notebooks/05_fragmentation.ipynb": 3.1,
    "tests/test_predict_recorder.py": 2.8,
    "tests/test_parity.py": 2.8,
    "tests/test_snapshots_whatif_gc.py": 2.7,
    "tests/test_lab_launch.py": 2.7,
    "tests/test_sim_streams_properties.py": 2.4,
    "tests/test_predict.py": 2.2,
    "tests/test_sim_stats.py": 1.8,
    "tests/test_predict_workspaces.py": 1.8,
    "tests/test_snapshots_load.py": 1.6,
    "tests/test_lab.py": 1.4,
    "tests/test_snapshots_history.py": 1.3,
    "tests/test_shapes.py": 1.1,
    "tests/test_sim_limits.py": 1.1,
    "tests/test_fragmentation_empty_cache.py": 1.0,
}
DEFAULT_COST_S = {"browser": 30.0, "notebook": 4.0, "other": 0.3}  # a file not in FILE_COST_S


def _scope(nodeid: str) -> str:
    """The unit the scheduler hands a worker: the file, or ``tests/browser`` for every browser test."""
    return "tests/browser" if nodeid.startswith("tests/browser/") else nodeid.split("::")[0]


def expected_cost_s(nodeid: str) -> float:
    """Expected wall seconds of the scheduling unit that holds this test (FILE_COST_S, else a default)."""
    scope = _scope(nodeid)
    if scope in FILE_COST_S:
        return FILE_COST_S[scope]
    kind = "browser" if scope == "tests/browser" else "notebook" if scope.endswith(".ipynb") else "other"
    return DEFAULT_COST_S[kind]


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own; a no-op without xdist
def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadfile``: every browser test file on one worker, so one JupyterLab server and one
    Chromium serve them all (each start costs a few seconds of CPU); other files are scheduled one per file."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class OneBrowserSession(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    return OneBrowserSession(config, log)


def pytest_collection_modifyitems(items: list) -> None:
    # Longest unit first (longest-processing-time list scheduling): xdist (`--dist loadfile
    # --no-loadscope-reorder`) hands the next unit in this order to whichever worker is free, so the last
    # ones to start are the short ones and the workers finish together. The sort is stable and ties go
    # by name: a file's tests stay together, in their own order.
    items.sort(key=lambda item: (-expected_cost_s(item.nodeid), _scope(item.nodeid)))

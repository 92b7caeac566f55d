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


def _expected_cost(item) -> int:
    """Rank for scheduling: the browser test (~20 s), then notebooks (~5 s each), then unit-test files."""
    path = str(item.path)
    if "/tests/browser/" in path:
        return 0
    return 1 if path.endswith(".ipynb") else 2


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own; a no-op without xdist
def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadfile``: every browser test file on one worker, so one JupyterLab server and one
    Chromium serve them all (each start costs a few seconds of CPU); other files are scheduled one per file."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class OneBrowserSession(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "tests/browser" if nodeid.startswith("tests/browser/") else super()._split_scope(nodeid)

    return OneBrowserSession(config, log)


def pytest_collection_modifyitems(items: list) -> None:
    # Longest first, so two xdist workers (`--dist loadfile --no-loadscope-reorder`) finish together
    # instead of one starting the 20 s browser test when the other is nearly done.
    items.sort(key=_expected_cost)

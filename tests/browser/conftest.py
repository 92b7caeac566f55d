"""Fixtures for tests that drive a real JupyterLab in headless Chromium (``@pytest.mark.browser``).

One JupyterLab server and one Chromium per test session, and one tab, in which JupyterLab loads once: each
test opens its notebook in the running app (a JupyterLab load costs ~7 s of Chromium's CPU on 2 cores). A file
that must start in a page that has loaded nothing yet sets ``FRESH_PAGE = True``: it runs first and gets a
new tab if the session's has been used. The work is done by
plain functions in ``jlab.py`` (importable without pytest: the benchmarks use them too); the fixtures
here are thin wrappers. Quick start for a new test file in this folder::

    import pytest

    pytestmark = pytest.mark.browser

    def test_dashboard_button(lab):
        lab.open("dash.ipynb", ["import ipywidgets as w", "b = w.Button(description='Go'); b"], run=True)
        lab.click("Go")                                   # real click on the ipywidgets Button "Go"
        lab.wait_text(".my-label", "done")                # CSS inside the shown notebook
        assert lab.kernel("print(state)").strip() == "x"  # ask the kernel itself
        lab.screenshot("dashboard")                       # test-artifacts/dashboard.png

Fixtures:

* ``lab_server`` (session): a :class:`jlab.JupyterServer`; ``.root`` is its root dir,
  ``.write_notebook(name, cells)`` / ``.copy_notebook("notebooks/x.ipynb")`` put notebooks there,
  ``.api("api/sessions")`` calls its REST API. Killed (process group, kernels too) at the end.
* ``lab_context`` (session): the Playwright persistent Chromium context (fresh temp profile).
* ``lab_page`` (per test): the session's tab, which accepts dialogs and records console errors
  (``jlab.console_errors(page)``, for every test it served), sized ``jlab.VIEWPORT`` at the start of each
  test. At teardown: a screenshot ``test-artifacts/<test>-FAILED.png`` if the test failed (and the next
  test gets a new tab), the notebooks are closed and every kernel is shut down. Set up the page before it
  first navigates (e.g. ``jlab.late_large_modules``) in the first test of a file with ``FRESH_PAGE = True``.
* ``lab`` (per test): ``jlab.Lab(lab_server, lab_page, reuse_app=True)``: ``open``, ``run_all``, ``run_cell``,
  ``click``, ``text``/``texts``, ``wait_text``, ``js``/``wait_js``, ``kernel``, ``measure_click``,
  ``screenshot``, all documented in ``jlab.py``.

The plain helpers are re-exported here and importable in tests as ``from jlab import ...``.

Skipping: without ``/usr/bin/chromium`` (or the ``playwright`` package) browser tests skip with the
reason, unless ``MEMVIZ_REQUIRE_BROWSER=1`` (CI sets it): then they fail, saying what is missing. Every
test in this folder gets the ``browser`` marker (``-m "not browser"`` deselects them).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from jlab import (  # noqa: F401 - re-exported for tests and for `import conftest`
    ARTIFACTS_DIR,
    CHROMIUM,
    VIEWPORT,
    HarnessError,
    JupyterServer,
    Lab,
    button,
    cell_errors,
    cell_outputs,
    chromium_available,
    click_button,
    close_browser,
    close_documents,
    console_errors,
    kernel_eval,
    kernel_state,
    launch_browser,
    measure_click,
    new_page,
    open_notebook,
    output_text,
    run_all,
    run_cell,
    screenshot,
    showing_lab,
    start_server,
    text_of,
    texts_of,
    wait_for_js,
    wait_for_text,
    wait_kernel_idle,
    write_notebook,
)

HERE = Path(__file__).resolve().parent
_REPORT_KEY = pytest.StashKey[dict]()


def browser_unavailable_reason() -> str | None:
    """Why browser tests cannot run here, or None if they can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the Python package 'playwright' is not installed (pip install -r requirements-dev.txt)"
    if not chromium_available():
        return (
            f"{CHROMIUM} is missing (apt-get install -y --no-install-recommends chromium fonts-dejavu-core;"
            " never `playwright install`)"
        )
    return None


def require_browser() -> bool:
    """True when browser tests must run (``MEMVIZ_REQUIRE_BROWSER=1``, as in CI)."""
    return os.environ.get("MEMVIZ_REQUIRE_BROWSER", "") == "1"


def _wants_fresh_page(item) -> bool:
    return bool(getattr(getattr(item, "module", None), "FRESH_PAGE", False))


def pytest_collection_modifyitems(config, items):
    # Files that need a page that has loaded nothing run first, in the session's tab while it is still unused
    # (stable: every other order is kept; the root conftest's longest-first sort keeps it too).
    items.sort(key=lambda item: not _wants_fresh_page(item))
    for item in items:
        if Path(item.path).parent == HERE or HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.browser)
            # anywidget 0.11 gives a widget model a fixed 2 s to initialize in the page, and logs
            # "[anywidget] Failed to initialize model." when a starved CPU misses it (seen once in three
            # runs at load ~3 on 2 cores). That one failure, and no other, gets one rerun
            # (pytest-rerunfailures); a second time fails.
            item.add_marker(pytest.mark.flaky(reruns=1, only_rerun=["Failed to initialize model"]))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    item.stash.setdefault(_REPORT_KEY, {})[rep.when] = rep
    return rep


@pytest.fixture(scope="session")
def browser_available() -> None:
    """Skip (or, with MEMVIZ_REQUIRE_BROWSER=1, fail) when Chromium or Playwright is missing."""
    reason = browser_unavailable_reason()
    if reason is None:
        return
    if require_browser():
        pytest.fail(f"MEMVIZ_REQUIRE_BROWSER=1 but {reason}", pytrace=False)
    pytest.skip(f"browser tests need Chromium: {reason}")


@pytest.fixture(scope="session")
def _lab_session(browser_available):
    """Server and Chromium for the session, started side by side (the server boots meanwhile)."""
    server = start_server(wait=False)
    try:
        pw, ctx = launch_browser()
    except BaseException:
        server.stop()
        raise
    try:
        server.wait_ready()
        yield server, ctx
    finally:
        close_browser(pw, ctx)
        server.stop()


@pytest.fixture(scope="session")
def lab_server(_lab_session) -> JupyterServer:
    """The session's JupyterLab server (see ``jlab.start_server``)."""
    return _lab_session[0]


@pytest.fixture(scope="session")
def lab_context(_lab_session):
    """The session's headless Chromium: a Playwright persistent context with a fresh profile."""
    return _lab_session[1]


@pytest.fixture(scope="session")
def _session_tab(lab_context):
    """The session's tab: ``{"page", "used", "fresh_files"}``; ``lab_page`` replaces the page after a failed
    test or for a ``FRESH_PAGE`` file once the page has been used."""
    tab = {"page": new_page(lab_context), "used": False, "fresh_files": set()}
    yield tab
    tab["page"].close()


@pytest.fixture
def lab_page(request, lab_server, lab_context, _session_tab):
    """The session's tab for one test, at the default viewport; screenshot on failure (then a new tab for
    the next test); closes the notebooks and shuts the kernels down after."""
    path = request.node.path
    if _wants_fresh_page(request.node) and path not in _session_tab["fresh_files"]:
        _session_tab["fresh_files"].add(path)
        if _session_tab["used"]:
            _session_tab["page"].close()
            _session_tab["page"] = new_page(lab_context)
    page = _session_tab["page"]
    _session_tab["used"] = True
    page.set_viewport_size(VIEWPORT)
    yield page
    reports = request.node.stash.get(_REPORT_KEY, {})
    if any(r.failed for r in reports.values()):
        name = re.sub(r"[^\w.-]+", "_", request.node.name)
        try:
            path = screenshot(page, f"{name}-FAILED")
            print(f"\nscreenshot of the failed test: {path}")
        except Exception as exc:  # a crashed page must not hide the real failure
            print(f"\n(no failure screenshot: {exc})")
        errors = console_errors(page)
        if errors:
            print("browser console errors:\n  " + "\n  ".join(errors[-20:]))
        page.close()
        _session_tab["page"] = new_page(lab_context)
    elif showing_lab(page, lab_server):
        close_documents(page)
    lab_server.shutdown_kernels()


@pytest.fixture
def lab(lab_server, lab_page) -> Lab:
    """``jlab.Lab``: the session's server plus this test's tab, with the helpers as methods; ``open``
    reuses the JupyterLab the tab has loaded."""
    return Lab(lab_server, lab_page, reuse_app=True)

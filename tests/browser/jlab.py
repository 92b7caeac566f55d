"""Drive a real JupyterLab in headless Chromium: plain functions, no pytest needed.

``conftest.py`` wraps these in thin fixtures for the browser tests; ``benchmarks/bench_browser.py``
imports them directly (with ``tests/browser`` on ``sys.path``). The pieces:

* :func:`start_server` -> :class:`JupyterServer`: ``python -m jupyterlab`` (this interpreter) on
  127.0.0.1, a free port, a random token, its own temp ``root_dir`` and private Jupyter
  config/data/runtime/IPython dirs, and everything that talks to the network or prompts turned off
  (news, update check, PyPI extension manager, LSP autodetection, terminals). ``window.jupyterapp``
  is exposed (``--LabApp.expose_app_in_browser``) so the helpers run JupyterLab *commands* and read
  the notebook *model* instead of clicking menus: faster, and immune to layout changes.
* :func:`launch_browser`: Playwright + Debian's ``/usr/bin/chromium`` (never ``playwright install``) in
  a persistent context with a fresh temp profile; :func:`new_page` adds a tab that accepts dialogs and
  records console errors.
* Notebook helpers on a page: :func:`open_notebook` (waits for a *steady* idle kernel), :func:`run_all`,
  :func:`kernel_eval` (run code in the notebook's kernel over the Jupyter protocol), widget helpers
  :func:`click_button`, :func:`text_of`, :func:`wait_for_text`, :func:`measure_click`, and
  :func:`screenshot` (``test-artifacts/``, gitignored).
* :class:`Lab` bundles a server and a page with the same helpers as methods (the ``lab`` fixture).

Known pitfall this exists for: a click or Run All sent while the kernel is still starting (or while the
front end is still connecting its websocket / the widget manager is still hooking up) is silently lost.
:func:`open_notebook` therefore waits until the kernel has been idle and connected *continuously* for
``steady_s`` (1 s), as seen by the page and by the server's ``/api/sessions`` both.

Typical use::

    server = start_server()
    pw, ctx = launch_browser()
    page = new_page(ctx)
    server.write_notebook("t.ipynb", ["import ipywidgets as w", "b = w.Button(description='Go'); b"])
    open_notebook(page, server, "t.ipynb")
    run_all(page, server)                     # raises HarnessError if a cell raised
    click_button(page, "Go")
    kernel_eval(page, "print(1 + 1)")         # -> "2\\n"
    screenshot(page, "t")                     # -> test-artifacts/t.png
    close_browser(pw, ctx); server.stop()
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS_DIR = Path(os.environ.get("MEMVIZ_ARTIFACTS", REPO_ROOT / "test-artifacts"))
CHROMIUM = os.environ.get("MEMVIZ_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-dev-shm-usage",
]
VIEWPORT = {"width": 1400, "height": 1000}
# Front-end plugins whose server side is off (they would only log warnings).
DISABLED_LAB_PLUGINS = ["@jupyterlab/terminal-extension"]


class HarnessError(AssertionError):
    """The browser or JupyterLab did not reach the expected state; the message says what and where."""


def _poll(fn, timeout: float, interval: float, what: str, details=None):
    """Call ``fn()`` until it returns something truthy (returned); HarnessError after ``timeout`` s."""
    __tracebackhide__ = True
    deadline = time.monotonic() + timeout
    while True:
        result = fn()
        if result:
            return result
        if time.monotonic() > deadline:
            extra = details() if details else ""
            raise HarnessError(f"timed out after {timeout:g}s waiting for {what}. {extra}".strip())
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------- server


@dataclass
class JupyterServer:
    """A JupyterLab server started by :func:`start_server`.

    ``url`` (ends with '/'), ``token``, ``root`` (its ``root_dir``: put notebooks here), ``home`` (temp
    dir holding root/, the private Jupyter dirs and ``server.log``).
    """

    proc: subprocess.Popen
    port: int
    token: str
    root: Path
    home: Path
    log_path: Path
    _log_file: Any = field(repr=False, default=None)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def api(self, path: str, method: str = "GET", body: Any = None, timeout: float = 10) -> Any:
        """Call the Jupyter Server REST API (``path`` like ``"api/sessions"``); returns parsed JSON."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path.lstrip("/"),
            data=data,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def wait_ready(self, timeout: float = 60) -> JupyterServer:
        """Wait until ``/api/status`` answers; HarnessError with the log tail if it dies or times out."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise HarnessError(
                    f"JupyterLab exited with code {self.proc.returncode} while starting:\n{self.log_tail()}"
                )
            with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
                if "started" in (self.api("api/status", timeout=2) or {}):
                    return self
            if time.monotonic() > deadline:
                raise HarnessError(f"JupyterLab did not answer /api/status in {timeout:g}s:\n{self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self, n: int = 40) -> str:
        """The last ``n`` lines of the server's stdout+stderr."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no server log)"

    def write_notebook(self, name: str, cells: list[str]) -> Path:
        """Write a notebook of these cells into the server root (see :func:`write_notebook`)."""
        return write_notebook(self.root / name, cells)

    def copy_notebook(self, src: str | Path, name: str | None = None) -> Path:
        """Copy a notebook (path absolute or relative to the repo, e.g. ``notebooks/x.ipynb``) into root."""
        src = Path(src)
        if not src.is_absolute():
            src = REPO_ROOT / src
        dst = self.root / (name or src.name)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        return dst

    def session_for(self, name: str) -> dict | None:
        """The server's session record for notebook ``name`` (None while it has none)."""
        for s in self.api("api/sessions"):
            if s.get("path") == name:
                return s
        return None

    def start_session(self, name: str, kernel: str = "python3") -> dict:
        """Create (or get) the notebook's session, starting its kernel now (``POST /api/sessions``).

        The page then attaches to this kernel instead of starting one after it has loaded, so the
        kernel boots while JupyterLab's front end loads.
        """
        body = {"path": name, "name": Path(name).name, "type": "notebook", "kernel": {"name": kernel}}
        return self.api("api/sessions", method="POST", body=body)

    def shutdown_kernels(self) -> None:
        """Delete every session (shutting its kernel down); frees the 2 cores between tests."""
        with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
            for s in self.api("api/sessions"):
                with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
                    self.api(f"api/sessions/{s['id']}", method="DELETE")

    def stop(self) -> None:
        """Stop the server and its kernels, then delete its temp dir.

        Kernels run in process groups of their own (jupyter_client), so: shut them down over REST,
        SIGTERM the server's group (the server also shuts kernels down), and finally SIGKILL any
        process still naming this server's private runtime dir (a kernel the server lost).
        """
        if self.proc.poll() is None:
            self.shutdown_kernels()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        for pid in _pids_mentioning(str(self.home / "runtime")):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if self._log_file:
            self._log_file.close()
        shutil.rmtree(self.home, ignore_errors=True)


def _pids_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (Linux /proc; empty elsewhere)."""
    pids = []
    for d in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if text in (d / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(d.name))
    return [p for p in pids if p != os.getpid()]


def write_notebook(path: str | Path, cells: list[str]) -> Path:
    """Write an nbformat-4 notebook with the python3 kernelspec (so no kernel-picker dialog).

    ``cells`` are code-cell sources; a source that starts with ``"#md\\n"`` becomes a markdown cell.
    """
    nb_cells = []
    for i, src in enumerate(cells):
        if src.startswith("#md\n"):
            nb_cells.append({"id": f"c{i}", "cell_type": "markdown", "metadata": {}, "source": src[4:]})
        else:
            nb_cells.append({"id": f"c{i}", "cell_type": "code", "metadata": {}, "source": src,
                             "outputs": [], "execution_count": None})  # fmt: skip
    nb = {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
            "language_info": {"name": "python"},
        },
        "cells": nb_cells,
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb, indent=1))
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(*, wait: bool = True, timeout: float = 60, python: str = sys.executable) -> JupyterServer:
    """Start JupyterLab quietly and offline in a fresh temp dir; by default wait for ``/api/status``.

    With ``wait=False`` it returns at once (start Chromium meanwhile, then call ``.wait_ready()``).
    Always ``.stop()`` it: that kills the process group, kernels included.
    """
    home = Path(tempfile.mkdtemp(prefix="memviz-lab-"))
    root = home / "root"
    for d in ("root", "config/labconfig", "data", "runtime", "ipython", "settings", "workspaces"):
        (home / d).mkdir(parents=True)
    # No news consent toast, no update check (both would ask the network).
    notif = home / "settings/@jupyterlab/apputils-extension/notification.jupyterlab-settings"
    notif.parent.mkdir(parents=True)
    notif.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    (home / "config/labconfig/page_config.json").write_text(
        json.dumps({"disabledExtensions": dict.fromkeys(DISABLED_LAB_PLUGINS, True)})
    )
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    for var in ("JUPYTER_PATH", "JUPYTER_CONFIG_PATH", "JUPYTER_TOKEN", "JUPYTER_PREFER_ENV_PATH"):
        env.pop(var, None)
    env.update(
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_DATA_DIR=str(home / "data"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        IPYTHONDIR=str(home / "ipython"),
        JUPYTER_PLATFORM_DIRS="1",
        PYDEVD_DISABLE_FILE_VALIDATION="1",
        PYTHONUNBUFFERED="1",
        MPLBACKEND="Agg",
    )
    cmd = [
        python, "-m", "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",  # what --ServerApp.token sets, without its deprecation warning
        f"--ServerApp.root_dir={root}",
        "--ServerApp.allow_root=True",  # CI runs as root
        "--ServerApp.terminals_enabled=False",
        "--LanguageServerManager.autodetect=False",  # jupyter_lsp stays (the front end asks it), idle
        "--ServerApp.log_level=WARN",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",  # the default 'pypi' manager queries PyPI
        "--LabApp.expose_app_in_browser=True",  # window.jupyterapp, used by the helpers below
        f"--LabApp.user_settings_dir={home / 'settings'}",
        f"--LabApp.workspaces_dir={home / 'workspaces'}",
    ]  # fmt: skip
    log_path = home / "server.log"
    log_file = open(log_path, "w")  # noqa: SIM115 - closed by stop()
    proc = subprocess.Popen(
        cmd, cwd=home, env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: stop() signals the group
    )  # fmt: skip
    server = JupyterServer(proc, port, token, root, home, log_path, log_file)
    if wait:
        try:
            server.wait_ready(timeout)
        except BaseException:
            server.stop()
            raise
    return server


# --------------------------------------------------------------------------------------------- browser


def chromium_available() -> bool:
    """True if the Chromium binary the harness drives (``/usr/bin/chromium``) is there."""
    return os.access(CHROMIUM, os.X_OK)


def launch_browser(profile_dir: str | Path | None = None, *, viewport: dict | None = None):
    """Start Playwright and headless Chromium (``launch_persistent_context``, fresh temp profile).

    Returns ``(playwright, context)``; close both with :func:`close_browser` (which deletes the temp
    profile; a ``profile_dir`` you pass is kept).
    """
    from playwright.sync_api import sync_playwright

    if not chromium_available():
        raise HarnessError(f"{CHROMIUM} not found: apt-get install -y --no-install-recommends chromium")
    profile = Path(profile_dir) if profile_dir else Path(tempfile.mkdtemp(prefix="memviz-chromium-"))
    pw = sync_playwright().start()
    try:
        ctx = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport=viewport or VIEWPORT,
        )
    except BaseException:
        pw.stop()
        shutil.rmtree(profile, ignore_errors=True)
        raise
    ctx.set_default_timeout(30_000)
    if profile_dir is None:
        ctx.memviz_profile = profile  # a temp dir of ours: close_browser removes it
    return pw, ctx


def close_browser(pw, ctx) -> None:
    """Close the Chromium context and Playwright, and delete the temp profile."""
    profile = getattr(ctx, "memviz_profile", None)
    with contextlib.suppress(Exception):
        ctx.close()
    with contextlib.suppress(Exception):
        pw.stop()
    if profile:
        shutil.rmtree(profile, ignore_errors=True)


def new_page(ctx):
    """A new tab that accepts dialogs (e.g. "leave page?") and records console errors and page errors.

    Read the record with :func:`console_errors`.
    """
    page = ctx.new_page()
    record: list[str] = []
    page.memviz_console = record
    page.on("dialog", lambda d: d.accept())
    page.on("console", lambda m: record.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: record.append(f"pageerror: {e}"))
    return page


def console_errors(page) -> list[str]:
    """Console errors and uncaught page errors seen so far on a page made by :func:`new_page`."""
    return list(getattr(page, "memviz_console", []))


_LATE_MODULES_JS = """(() => {
  const create = URL.createObjectURL.bind(URL);
  window.memvizLargeModules = 0;
  URL.createObjectURL = (blob) => {
    const url = create(blob);
    if (!(blob instanceof Blob) || blob.size < 1e6) return url;
    window.memvizLargeModules += 1;
    const late = `await new Promise((r) => setTimeout(r, DELAY_MS));\\nexport * from "${url}";\\n` +
                 `export { default } from "${url}";\\n`;
    return create(new Blob([late], { type: "text/javascript" }));
  };
})();"""


def late_large_modules(page, delay_ms: int = 2500) -> None:
    """Make every ES module over 1 MB that the page imports from a ``blob:`` URL (plotly's 5 MB FigureWidget
    front end, as anywidget loads it) resolve ``delay_ms`` late, with the page idle meanwhile: what a blob
    fetch starved by a busy machine does. anywidget 0.11 gives a model 2 s to get ready and then drops its
    messages, so with plotly's own loader a figure comes up blank every time (``memviz.widgets.figure``).
    ``window.memvizLargeModules`` counts those imports. Call before the page navigates."""
    page.add_init_script(script=_LATE_MODULES_JS.replace("DELAY_MS", str(int(delay_ms))))


# ------------------------------------------------------------------------------------------- notebooks

# JS prelude: `panel` is the NotebookPanel shown in the main area (window.jupyterapp is exposed).
_JS_PANEL = """
const app = window.jupyterapp;
const panel = app && app.shell.currentWidget;
const ok = !!(panel && panel.sessionContext && panel.content && panel.context);
const withTimeout = (promise, ms, what) => {
  let timer;
  const expired = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not finished after ${ms} ms`)), ms);
  });
  return Promise.race([promise, expired]).finally(() => clearTimeout(timer));
};
"""


def _panel_js(params: str, body: str) -> str:
    """A JS function ``params => {...}`` whose body starts with the ``_JS_PANEL`` prelude."""
    return f"{params} => {{{_JS_PANEL}{body}}}"


def kernel_state(page) -> dict:
    """The shown notebook's kernel as the page sees it: path, ready, kernelId, status, connection."""
    return page.evaluate(
        _panel_js(
            "()",
            """
        if (!ok) return {path: null};
        const sc = panel.sessionContext, k = sc.session && sc.session.kernel;
        return {path: panel.context.path, ready: sc.isReady, kernelId: k ? k.id : null,
                status: k ? k.status : null, connection: k ? k.connectionStatus : null,
                dialog: !!document.querySelector('.jp-Dialog')};
        """,
        )
    )


def wait_kernel_idle(page, server: JupyterServer | None = None, *, steady_s: float = 1.0,
                     timeout: float = 60) -> None:  # fmt: skip
    """Wait until the shown notebook's kernel has been idle and connected for ``steady_s`` in a row.

    Checked in the page (``status == 'idle'``, ``connectionStatus == 'connected'``) and, given
    ``server``, by the server too (``/api/sessions``: same kernel, ``execution_state == 'idle'``).
    """
    since: list[float | None] = [None]
    seen: list[Any] = [None]

    def steady():
        st = seen[0] = kernel_state(page)
        good = bool(st.get("ready")) and st.get("status") == "idle" and st.get("connection") == "connected"
        if good and server is not None:
            sess = server.session_for(st["path"])
            seen[0] = {**st, "server_state": sess and sess["kernel"]["execution_state"]}
            good = bool(sess) and sess["kernel"]["id"] == st["kernelId"]
            good = good and sess["kernel"]["execution_state"] == "idle"
        now = time.monotonic()
        since[0] = (since[0] or now) if good else None
        return good and now - since[0] >= steady_s

    _poll(steady, timeout, 0.1, f"the kernel to be idle for {steady_s:g}s", lambda: f"Last: {seen[0]}")


_JS_CLOSE_DOCUMENTS = """() => {
  const app = window.jupyterapp;
  for (const w of [...app.shell.widgets('main')]) {
    if (w.context && w.context.model) w.context.model.dirty = false;  // no "save your work?" dialog
    w.close();
  }
  return [...app.shell.widgets('main')].filter(w => w.context).length === 0;
}"""


def showing_lab(page, server: JupyterServer) -> bool:
    """True when ``page`` has this server's JupyterLab loaded (``window.jupyterapp`` started)."""
    return page.url.startswith(server.url + "lab") and page.evaluate("() => !!window.jupyterapp?.shell")


def close_documents(page, *, timeout: float = 10) -> None:
    """Close every notebook and document in JupyterLab's main area, discarding unsaved changes (kernels
    keep running: :meth:`JupyterServer.shutdown_kernels` ends them)."""
    _poll(lambda: page.evaluate(_JS_CLOSE_DOCUMENTS), timeout, 0.1, "the open documents to close")


def open_notebook(page, server: JupyterServer, name: str, *, steady_s: float = 1.0, timeout: float = 60,
                  collapse_left: bool = True, prestart_kernel: bool = True,
                  reuse_app: bool = False) -> None:  # fmt: skip
    """Open ``lab/tree/<name>`` (fresh workspace) and wait for a *steady* idle kernel.

    ``name`` is relative to the server root (write or copy it there first). With ``prestart_kernel``
    the kernel is started through the REST API before the page loads (saves ~1 s; the page attaches
    to it). Accepts a dialog if one shows (e.g. a kernel picker). ``collapse_left`` hides the file
    browser so widgets get the width (else it is shown, as in a fresh workspace). When it returns,
    clicks and Run All reach the kernel.

    With ``reuse_app``, a page that already shows this server's JupyterLab is not reloaded: its
    documents are closed (:func:`close_documents`) and ``name`` is opened in the running app (the
    ``docmanager:open`` command, as a double click in the file browser does). A JupyterLab load costs
    the renderer ~3.5 s of CPU, plus ~1.5 s for plotly's front end in the first figure.
    """
    if not (server.root / name).is_file():
        raise HarnessError(f"{name} is not in the server root {server.root}: write or copy it first")
    if prestart_kernel:
        server.start_session(name)
    if reuse_app and showing_lab(page, server):
        close_documents(page)
        page.evaluate("(path) => { const app = window.jupyterapp; app.shell.expandLeft();"
                      " app.commands.execute('docmanager:open', {path}); }", name)
    else:
        url = f"{server.url}lab/tree/{urllib.parse.quote(name)}?reset&token={server.token}"
        page.goto(url, wait_until="domcontentloaded")

    def shown():
        st = kernel_state(page)
        if st.get("dialog"):
            with contextlib.suppress(Exception):
                page.locator(".jp-Dialog .jp-mod-accept").first.click(timeout=1000)
        return st.get("path") == name

    _poll(shown, timeout, 0.1, f"JupyterLab to show {name}", lambda: f"Last: {kernel_state(page)}")
    if collapse_left:
        page.evaluate("() => window.jupyterapp.shell.collapseLeft()")
    wait_kernel_idle(page, server, steady_s=steady_s, timeout=timeout)


def cell_errors(page) -> list[str]:
    """``"[cell i] ename: evalue"`` for every error output in the shown notebook (from its model)."""
    return page.evaluate(
        _panel_js(
            "()",
            """
        if (!ok) return ['no notebook is shown'];
        const errs = [];
        panel.content.widgets.forEach((cell, i) => {
          if (cell.model.type !== 'code') return;
          for (const out of cell.model.outputs.toJSON())
            if (out.output_type === 'error') errs.push(`[cell ${i}] ${out.ename}: ${out.evalue}`);
        });
        return errs;
        """,
        )
    )


def cell_outputs(page, index: int) -> list[dict]:
    """The nbformat outputs of code/markdown cell ``index`` of the shown notebook (from its model)."""
    return page.evaluate(
        _panel_js(
            "(i)",
            """
        if (!ok) throw new Error('no notebook is shown');
        const cell = panel.content.widgets[i];
        return cell.model.type === 'code' ? cell.model.outputs.toJSON() : [];
        """,
        ),
        index,
    )


def run_cell(page, index: int, server: JupyterServer | None = None, *, timeout: float = 60) -> list[dict]:
    """Run code cell ``index`` of the shown notebook (``notebook:run-cell``); returns its outputs.

    Waits for the kernel to be idle before and after; raises HarnessError if the cell raised.
    """
    wait_kernel_idle(page, server, steady_s=0.3, timeout=timeout)
    page.evaluate(
        _panel_js(
            "async ([i, timeoutMs])",
            """
        if (!ok) throw new Error('no notebook is shown');
        app.shell.activateById(panel.id);
        panel.content.activeCellIndex = i;
        panel.content.deselectAll();
        await withTimeout(app.commands.execute('notebook:run-cell'), timeoutMs, 'run_cell');
        """,
        ),
        [index, int(timeout * 1000)],
    )
    wait_kernel_idle(page, server, steady_s=0.3, timeout=timeout)
    outputs = cell_outputs(page, index)
    errs = [f"{o['ename']}: {o['evalue']}" for o in outputs if o.get("output_type") == "error"]
    if errs:
        raise HarnessError(f"cell {index} raised: " + "; ".join(errs))
    return outputs


def output_text(outputs: list[dict]) -> str:
    """The stdout text plus ``text/plain`` results of a list of nbformat outputs, concatenated."""
    parts = []
    for o in outputs:
        if o.get("output_type") == "stream" and o.get("name") == "stdout":
            parts.append(o["text"] if isinstance(o["text"], str) else "".join(o["text"]))
        elif o.get("output_type") in ("execute_result", "display_data"):
            txt = o.get("data", {}).get("text/plain", "")
            parts.append(txt if isinstance(txt, str) else "".join(txt))
    return "".join(parts)


def _cells_state(page) -> dict:
    return page.evaluate(
        _panel_js(
            "()",
            """
        if (!ok) return {code: 0, done: 0, running: -1};
        let code = 0, done = 0;
        for (const cell of panel.content.widgets) {
          if (cell.model.type !== 'code') continue;
          code += 1;
          if (cell.model.executionCount != null) done += 1;
        }
        const running = [...panel.node.querySelectorAll('.jp-InputPrompt')]
          .filter(p => p.textContent.includes('[*]')).length;
        return {code, done, running};
        """,
        )
    )


def run_all(page, server: JupyterServer | None = None, *, timeout: float = 120,
            check_errors: bool = True) -> None:  # fmt: skip
    """Run All on the shown notebook (command ``notebook:run-all-cells``) and wait until it finished.

    Finished means: the command's promise resolved, every code cell has an execution count, no
    ``[*]`` prompt is left, and the kernel is idle for 0.3 s. Raises HarnessError listing the errors
    if a cell raised (unless ``check_errors=False``). Empty code cells count as unexecuted: avoid them.
    """
    wait_kernel_idle(page, server, steady_s=0.3, timeout=timeout)
    page.evaluate(
        _panel_js(
            "async (timeoutMs)",
            """
        if (!ok) throw new Error('no notebook is shown');
        app.shell.activateById(panel.id);
        await withTimeout(app.commands.execute('notebook:run-all-cells'), timeoutMs, 'run_all');
        """,
        ),
        int(timeout * 1000),
    )

    def finished():
        st = _cells_state(page)
        return st["code"] > 0 and st["done"] == st["code"] and st["running"] == 0

    _poll(finished, timeout, 0.1, "all cells to finish", lambda: f"Cells: {_cells_state(page)}")
    wait_kernel_idle(page, server, steady_s=0.3, timeout=timeout)
    if check_errors and (errs := cell_errors(page)):
        raise HarnessError("cells raised: " + "; ".join(errs))


def kernel_eval(page, code: str, *, timeout: float = 30) -> str:
    """Execute ``code`` in the shown notebook's kernel (an ``execute_request`` on its connection).

    Returns its stdout plus the ``text/plain`` of its result; HarnessError if it raised. Nothing is
    added to the notebook. This is how a test asserts kernel-side state behind what the DOM shows.
    """
    res = page.evaluate(
        _panel_js(
            "async ([code, timeoutMs])",
            """
        if (!ok) throw new Error('no notebook is shown');
        const kernel = panel.sessionContext.session.kernel;
        let out = '', err = null;
        const fut = kernel.requestExecute({code, silent: false, store_history: false});
        fut.onIOPub = (msg) => {
          const t = msg.header.msg_type, c = msg.content;
          if (t === 'stream' && c.name === 'stdout') out += c.text;
          else if (t === 'execute_result') out += (c.data['text/plain'] || '') + '\\n';
          else if (t === 'error') err = c.ename + ': ' + c.evalue;
        };
        try { await withTimeout(fut.done, timeoutMs, 'kernel_eval'); }
        catch (e) { err = err || String(e); }
        return {out, err};
        """,
        ),
        [code, int(timeout * 1000)],
    )
    if res["err"]:
        raise HarnessError(f"kernel raised {res['err']} running:\n{code}")
    return res["out"]


# --------------------------------------------------------------------------------------------- widgets


def notebook_locator(page, selector: str):
    """Locator for ``selector`` inside the notebook panel shown now (hidden panels never match)."""
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").locator(selector)


def button(page, description: str):
    """Locator for the ipywidgets Button whose text is exactly ``description``."""
    exact = re.compile(r"^\s*" + re.escape(description) + r"\s*$")
    return notebook_locator(page, "button.jupyter-button").filter(has_text=exact)


def click_button(page, description: str, *, timeout: float = 10) -> None:
    """Click the one ipywidgets Button with this description, like a user (real mouse click)."""
    loc = button(page, description)
    loc.first.wait_for(state="visible", timeout=timeout * 1000)
    if (n := loc.count()) != 1:
        raise HarnessError(f"expected exactly one button {description!r}, found {n}")
    loc.click(timeout=timeout * 1000)


_JS_TEXT = "el => (el.innerText ?? el.textContent ?? '').trim()"  # innerText is undefined on SVG text


def text_of(page, selector: str, *, timeout: float = 10) -> str:
    """Text (stripped ``innerText``; ``textContent`` for SVG) of the first match in the shown notebook."""
    loc = notebook_locator(page, selector).first
    loc.wait_for(state="attached", timeout=timeout * 1000)
    return loc.evaluate(_JS_TEXT, timeout=timeout * 1000)


def texts_of(page, selector: str) -> list[str]:
    """Texts of every match of ``selector`` in the shown notebook (possibly none)."""
    return notebook_locator(page, selector).evaluate_all(f"els => els.map({_JS_TEXT})")


def wait_for_text(page, selector: str, expected: str, *, timeout: float = 10) -> str:
    """Wait until ``text_of(page, selector) == expected``; HarnessError shows the last text seen."""
    last: list[str | None] = [None]

    def check():
        with contextlib.suppress(Exception):
            last[0] = text_of(page, selector, timeout=1)
        return last[0] == expected

    _poll(check, timeout, 0.05, f"{selector} to read {expected!r}", lambda: f"Last text: {last[0]!r}")
    return expected


def wait_for_js(page, expression: str, arg: Any = None, *, timeout: float = 10) -> Any:
    """Wait until JS function ``expression`` (``"(arg) => ..."``) returns truthy; returns that value."""
    return page.wait_for_function(expression, arg=arg, timeout=timeout * 1000, polling=50).json_value()


_JS_ARM_PROBE = """
([selector, expect, timeoutMs]) => {
  const root = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)') || document.body;
  const read = () => {
    const el = root.querySelector(selector);
    return el ? (el.innerText ?? el.textContent ?? '').trim() : null;
  };
  const before = read();
  const re = expect === null ? null : new RegExp(expect);
  const done = (t) => t !== null && (re ? re.test(t) : t !== before);
  let t0 = null;
  document.addEventListener('click', () => { if (t0 === null) t0 = performance.now(); },
                            {capture: true, once: true});
  window.__memvizProbe = new Promise((resolve) => {
    let finished = false;
    const finish = (text) => {
      if (finished) return;
      finished = true; obs.disconnect(); clearInterval(iv); clearTimeout(to);
      const tDom = performance.now();
      requestAnimationFrame(() => requestAnimationFrame(() => resolve({
        ok: true, before, text, dom_ms: tDom - t0, frame_ms: performance.now() - t0})));
    };
    const check = () => { if (t0 !== null) { const t = read(); if (done(t)) finish(t); } };
    const obs = new MutationObserver(check);
    obs.observe(root, {subtree: true, childList: true, characterData: true, attributes: true});
    const iv = setInterval(check, 5);
    const to = setTimeout(() => { if (!finished) { finished = true; obs.disconnect(); clearInterval(iv);
      resolve({ok: false, before, text: read(), clicked: t0 !== null}); } }, timeoutMs);
  });
  return before;
}
"""


def measure_click(page, description: str, selector: str, *, expect: str | None = None,
                  timeout: float = 10) -> dict:  # fmt: skip
    """Click Button ``description`` and time it until ``selector``'s text shows the update.

    Done when the text matches regex ``expect`` (or, with ``expect=None``, differs from before the
    click). Timed in the page from the trusted click event (capture listener) to the DOM mutation that
    shows it (``dom_ms``) and to two animation frames later, i.e. painted (``frame_ms``). Returns
    ``{"dom_ms", "frame_ms", "before", "text", "ok"}``; HarnessError if it never shows.
    """
    page.evaluate(_JS_ARM_PROBE, [selector, expect, int(timeout * 1000)])
    click_button(page, description, timeout=timeout)
    res = page.evaluate("() => window.__memvizProbe")
    if not res.get("ok"):
        raise HarnessError(f"after clicking {description!r}, {selector} never showed the update: {res}")
    return res


def screenshot(page, name: str | Path, *, full_page: bool = False) -> Path:
    """Save a PNG as ``test-artifacts/<name>.png`` (gitignored; ``MEMVIZ_ARTIFACTS`` overrides the dir)."""
    path = Path(name)
    if not path.is_absolute():
        path = ARTIFACTS_DIR / path
    if path.suffix != ".png":
        path = path.with_name(path.name + ".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=full_page)
    return path


# ------------------------------------------------------------------------------------------ convenience


@dataclass
class Lab:
    """A server and a page, with the helpers above as methods (what the ``lab`` fixture gives)."""

    server: JupyterServer
    page: Any
    reuse_app: bool = False  # open() leaves a loaded JupyterLab running (see open_notebook)

    def notebook(self, name: str, cells: list[str]) -> Path:
        """Write a notebook into the server root (see :func:`write_notebook`)."""
        return self.server.write_notebook(name, cells)

    def open(self, name: str, cells: list[str] | None = None, *, run: bool = False, **kw) -> Lab:
        """Optionally write ``cells`` to ``name``, open it (steady idle kernel), optionally Run All."""
        if cells is not None:
            self.notebook(name, cells)
        open_notebook(self.page, self.server, name, **{"reuse_app": self.reuse_app, **kw})
        if run:
            self.run_all()
        return self

    def run_all(self, **kw) -> None:
        run_all(self.page, self.server, **kw)

    def click(self, description: str, **kw) -> None:
        click_button(self.page, description, **kw)

    def text(self, selector: str, **kw) -> str:
        return text_of(self.page, selector, **kw)

    def texts(self, selector: str) -> list[str]:
        return texts_of(self.page, selector)

    def wait_text(self, selector: str, expected: str, **kw) -> str:
        return wait_for_text(self.page, selector, expected, **kw)

    def wait_js(self, expression: str, arg: Any = None, **kw) -> Any:
        return wait_for_js(self.page, expression, arg, **kw)

    def js(self, expression: str, arg: Any = None) -> Any:
        """``page.evaluate``: run a JS function in the page."""
        return self.page.evaluate(expression, arg)

    def run_cell(self, index: int, **kw) -> list[dict]:
        """Re-run one code cell; its nbformat outputs (see :func:`output_text`)."""
        return run_cell(self.page, index, self.server, **kw)

    def kernel(self, code: str, **kw) -> str:
        """Run ``code`` in the notebook's kernel; its stdout (see :func:`kernel_eval`)."""
        return kernel_eval(self.page, code, **kw)

    def measure_click(self, description: str, selector: str, **kw) -> dict:
        return measure_click(self.page, description, selector, **kw)

    def screenshot(self, name: str | Path, **kw) -> Path:
        return screenshot(self.page, name, **kw)

"""``scripts/lab.sh``'s launch (``scripts/lab_launch.py``), run for real: a JupyterLab server on a port that is
taken must move to a free one and say so, with the matching ``ssh -L`` line; as root it passes
``--allow-root`` and says so; and the URL it prints opens lesson 1 on that server."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "scripts" / "lab_launch.py"


def test_lab_sh_runs_the_launcher_after_setup():
    script = (ROOT / "scripts" / "lab.sh").read_text()
    assert "scripts/setup.sh lab" in script and "scripts/lab_launch.py" in script and "exec" in script


def test_a_busy_port_moves_to_a_free_one_and_the_url_opens_lesson_one(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        env = {**os.environ, **{key: str(tmp_path / key) for key in ("JUPYTER_CONFIG_DIR", "JUPYTER_RUNTIME_DIR",
                                                                     "JUPYTER_DATA_DIR", "IPYTHONDIR")}}  # fmt: skip
        env.pop("JUPYTER_TOKEN", None)
        proc = subprocess.Popen(
            [sys.executable, str(LAUNCH), "--no-browser", "--ip=127.0.0.1", f"--port={taken}",
             "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
             "--ServerApp.terminals_enabled=False"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
            start_new_session=True,
        )  # fmt: skip
        try:
            lines = [proc.stdout.readline() for _ in range(4 if os.geteuid() == 0 else 3)]
            said = "".join(lines)
            url = re.search(r"lesson 1: (\S+)", said)[1]
            port = int(re.search(r":(\d+)/lab/", url)[1])
            assert port != taken and f"port {taken} is in use; JupyterLab listens on {port} instead" in said
            assert f"ssh -N -L {port}:localhost:{port} " in said
            assert ("running as root: passing --allow-root" in said) == (os.geteuid() == 0)
            assert url.startswith(f"http://127.0.0.1:{port}/lab/tree/notebooks/01_start_here.ipynb?token=")
            token = url.split("token=")[1]
            deadline = time.monotonic() + 60
            while True:  # the server is up when its API answers
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2):
                        break
                except (urllib.error.URLError, OSError):
                    assert proc.poll() is None, proc.stdout.read()
                    assert time.monotonic() < deadline, "JupyterLab did not start in 60 s"
                    time.sleep(0.2)
            with urllib.request.urlopen(url, timeout=10) as page:  # the printed URL: JupyterLab's page
                assert page.status == 200 and b"jupyter-config-data" in page.read()
            api = f"http://127.0.0.1:{port}/api/contents/notebooks/01_start_here.ipynb?content=0&token={token}"
            with urllib.request.urlopen(api, timeout=10) as reply:  # ... and lesson 1 is at that path
                assert json.load(reply)["type"] == "notebook"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            proc.stdout.close()


@pytest.mark.parametrize("euid", [0, 1000])
def test_the_command_line_for_root_and_others(euid):
    sys.path.insert(0, str(LAUNCH.parent))
    try:
        import lab_launch
    finally:
        sys.path.remove(str(LAUNCH.parent))
    cmd, messages = lab_launch.command(["--no-browser", "--IdentityProvider.token=abc"], euid=euid, token=None)
    assert ("--allow-root" in cmd) == (euid == 0) and cmd.count("--allow-root") <= 1
    assert f"--ServerApp.root_dir={ROOT}" in cmd
    assert "--LabApp.default_url=/lab/tree/notebooks/01_start_here.ipynb" in cmd
    assert not any(a.startswith("--IdentityProvider.token=") and a != "--IdentityProvider.token=abc" for a in cmd)
    assert any(m.endswith("/lab/tree/notebooks/01_start_here.ipynb?token=abc") for m in messages)

"""Start JupyterLab on the lessons: the command line ``scripts/lab.sh`` runs after setting up.

    python scripts/lab_launch.py [jupyter lab arguments...]     (e.g. --no-browser --ip=127.0.0.1)

What it adds to ``jupyter lab``, and says so:

- the server's root is the repository, as on Binder, and the URL it prints opens lesson 1
  (``lab/tree/notebooks/01_start_here.ipynb``, the path the README's Binder badge uses);
- it picks the port itself: ``--port`` (default 8888) or, when that one is taken, the next free one, and
  prints the real one with the matching ``ssh -L`` line (Jupyter would move to another port by itself, and
  an ``ssh -L 8888:…`` line written for 8888 would then reach the wrong server);
- it makes the login token (unless you gave one), so the URL can be printed before the server starts;
- run as root (Docker, most cloud VMs) it passes ``--allow-root``, which Jupyter otherwise demands.

``--dry-run`` prints the command instead of running it. Uses only the standard library.
"""

from __future__ import annotations

import getpass
import os
import secrets
import shlex
import socket
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LESSON_ONE = "notebooks/01_start_here.ipynb"
DEFAULT_PORT = 8888
PORTS_TRIED = 50
TOKEN_OPTIONS = ("--IdentityProvider.token", "--ServerApp.token", "--NotebookApp.token")


def say(message: str) -> None:
    print(f"memviz lab: {message}", flush=True)


def option(args: list[str], name: str) -> str | None:
    """The value of ``--name=value`` or ``--name value`` in ``args`` (the last one given), else None."""
    value = None
    for i, arg in enumerate(args):
        if arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
        elif arg == name and i + 1 < len(args):
            value = args[i + 1]
    return value


def without(args: list[str], name: str) -> list[str]:
    """``args`` less every ``--name=value`` and ``--name value``."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
        elif arg.startswith(name + "="):
            continue
        elif arg == name and i + 1 < len(args):
            skip = True
        else:
            out.append(arg)
    return out


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str, start: int) -> int:
    """The first port from ``start`` that is free on ``host`` (and on the loopback, where a tunnel lands)."""
    for port in range(start, start + PORTS_TRIED):
        if port_is_free(host, port) and (host in ("127.0.0.1", "localhost") or port_is_free("127.0.0.1", port)):
            return port
    raise SystemExit(f"memviz lab: no free port in {start}-{start + PORTS_TRIED - 1}; pass --port=N with a free one")


def command(args: list[str], *, euid: int, token: str | None = None) -> tuple[list[str], list[str]]:
    """``(argv, messages)``: the ``jupyter lab`` command for ``args``, and what to tell the user about it."""
    messages: list[str] = []
    args = list(args)
    if euid == 0 and "--allow-root" not in args:
        args.append("--allow-root")
        messages.append("running as root: passing --allow-root to jupyter lab")
    host = option(args, "--ip") or "localhost"
    asked = option(args, "--port")
    try:
        start = int(asked) if asked is not None else DEFAULT_PORT
    except ValueError:
        raise SystemExit(f"memviz lab: --port must be a number, not {asked!r}") from None
    port = free_port("127.0.0.1" if host == "localhost" else host, start)
    if port != start:
        messages.append(f"port {start} is in use; JupyterLab listens on {port} instead")
    args = [*without(args, "--port"), f"--port={port}", "--ServerApp.port_retries=0"]
    given = next((v for v in (option(args, o) for o in TOKEN_OPTIONS) if v is not None), None)
    token = given if given is not None else os.environ.get("JUPYTER_TOKEN") or token or secrets.token_hex(24)
    if given is None:
        args.append(f"--IdentityProvider.token={token}")
    if option(args, "--ServerApp.root_dir") is None and option(args, "--notebook-dir") is None:
        args.append(f"--ServerApp.root_dir={REPO}")
        args.append(f"--LabApp.default_url=/lab/tree/{LESSON_ONE}")
    shown = "localhost" if host in ("0.0.0.0", "::", "", "*") else host
    query = f"?token={token}" if token else ""
    messages.append(f"lesson 1: http://{shown}:{port}/lab/tree/{LESSON_ONE}{query}")
    messages.append(f"from another machine: ssh -N -L {port}:localhost:{port} {getpass.getuser()}@"
                    f"{socket.gethostname()}, then open the URL above on your machine")  # fmt: skip
    return [sys.executable, "-m", "jupyterlab", *args], messages


def main(argv: list[str]) -> int:
    dry = "--dry-run" in argv
    argv = [a for a in argv if a != "--dry-run"]
    cmd, messages = command(argv, euid=os.geteuid() if hasattr(os, "geteuid") else 1)
    for message in messages:
        say(message)
    if dry:
        print(shlex.join(cmd))
        return 0
    os.chdir(REPO)
    os.execv(cmd[0], cmd)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env bash
# Set up memviz and open the lessons in JupyterLab. Extra arguments go to `jupyter lab`
# (e.g. --no-browser --ip=127.0.0.1 on a remote GPU VM). scripts/lab_launch.py starts it: the server's root
# is this repository, the URL it prints opens lesson 1, a busy port moves to a free one (printed, with the
# matching ssh -L line), and as root it passes --allow-root (and says so).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh lab
py=${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}; py=${py:-${CONDA_PREFIX:+$CONDA_PREFIX/bin/python}}; py=${py:-.venv/bin/python}
exec "$py" scripts/lab_launch.py "$@"

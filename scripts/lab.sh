#!/usr/bin/env bash
# Set up memviz and open the lessons in JupyterLab. Extra arguments go to `jupyter lab`
# (e.g. --no-browser --ip=0.0.0.0 on a remote GPU VM).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh lab
py=${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}; py=${py:-${CONDA_PREFIX:+$CONDA_PREFIX/bin/python}}; py=${py:-.venv/bin/python}
exec "$py" -m jupyterlab notebooks/01_start_here.ipynb "$@"

#!/usr/bin/env bash
# Set up memviz with its test tools, then run every test: ruff, the pytest suite (tests/, browser tests
# included) and every notebook under `pytest --nbval`, spread over the CPUs (pytest-xdist; one file, so one
# notebook, stays on one worker; files start longest first, see conftest.py). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
py=${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}; py=${py:-${CONDA_PREFIX:+$CONDA_PREFIX/bin/python}}; py=${py:-.venv/bin/python}
"$py" -m ruff check .
exec "$py" -m pytest -n auto --dist loadfile --no-loadscope-reorder "$@"

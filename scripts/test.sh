#!/usr/bin/env bash
# Set up memviz with its test tools, then run every test: ruff, the pytest suite (tests/, browser tests
# included) and every notebook under `pytest --nbval`, spread over the CPUs (pytest-xdist; one file, so one
# notebook, stays on one worker; files start longest first, see conftest.py). Extra arguments go to pytest.
#
# Setup (`scripts/setup.sh test`, ~10 s of pip even when nothing is missing) runs only when what it installs
# from changed since it last succeeded here (a stamp in the environment; MEMVIZ_SETUP=1 forces it).
# Bytecode is written even where PYTHONDONTWRITEBYTECODE is set: pytest then keeps each test module's
# rewritten asserts between runs instead of rewriting all of them in every worker (~4 s of CPU each).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}; py=${py:-${CONDA_PREFIX:+$CONDA_PREFIX/bin/python}}; py=${py:-.venv/bin/python}
inputs=$(cat requirements.txt requirements-dev.txt pyproject.toml scripts/setup.sh | cksum)
stamp=$(dirname "$py")/../.memviz-test-setup
if [ "${MEMVIZ_SETUP:-0}" = 1 ] || [ ! -x "$py" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$inputs" ]; then
  bash scripts/setup.sh test
  echo "$inputs" > "$stamp"
fi
unset PYTHONDONTWRITEBYTECODE
"$py" -m ruff check .
exec "$py" -m pytest -n auto --dist loadfile --no-loadscope-reorder "$@"

#!/usr/bin/env bash
# Set up memviz: a Python environment with torch, the widgets, JupyterLab and memviz itself.
#
#   bash scripts/setup.sh [lab|test]     (default: lab; "test" adds what the test suite needs)
#
# Where it installs: the active virtualenv or conda env if there is one, else ./.venv (created here).
# Which torch: an importable torch is kept as it is (your CUDA build stays). If the Python that makes
# ./.venv already has torch, the venv sees it (--system-site-packages). Otherwise a machine with an
# NVIDIA GPU gets PyPI's default (CUDA) build and a machine without one gets a CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-lab}
case "$what" in lab) req=requirements.txt ;; test) req=requirements-dev.txt ;;
  *) echo "usage: bash scripts/setup.sh [lab|test]" >&2; exit 2 ;; esac

if [ -n "${VIRTUAL_ENV:-}" ]; then py="$VIRTUAL_ENV/bin/python"
elif [ -n "${CONDA_PREFIX:-}" ]; then py="$CONDA_PREFIX/bin/python"
else
  base=${PYTHON:-python3}
  if [ ! -x .venv/bin/python ]; then
    if "$base" -c "import torch" 2>/dev/null; then
      echo "memviz setup: $base already has torch; .venv will use it (--system-site-packages)"
      "$base" -m venv --system-site-packages .venv
    else
      "$base" -m venv .venv
    fi
  fi
  py=.venv/bin/python
fi
pip=("$py" -m pip install --disable-pip-version-check -q)

# Run a pip command with its "WARNING: Retrying (Retry(...))" lines (an index slow to answer: pip tries again
# and carries on) summed up in one line instead: they look like failures and are not.
quiet_retries() {
  local log status=0 n
  log=$(mktemp)
  "$@" 2> "$log" || status=$?
  n=$(grep -c "Retrying (Retry(" "$log" || true)
  grep -v "Retrying (Retry(" "$log" >&2 || true
  rm -f "$log"
  if [ "$n" -gt 0 ]; then
    echo "memviz setup: pip retried a slow package index $n times (harmless: it went on, see the result below)"
  fi
  return "$status"
}

if "$py" -c "import torch" 2>/dev/null; then
  echo "memviz setup: keeping torch $("$py" -c 'import torch; print(torch.__version__)')"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "memviz setup: NVIDIA GPU found; installing PyPI's CUDA build of torch"
  "${pip[@]}" "torch>=2.11"
else
  echo "memviz setup: no NVIDIA GPU; installing a CPU build of torch (the simulator stands in for the GPU)"
  quiet_retries "${pip[@]}" --retries 1 --extra-index-url https://download.pytorch.org/whl/cpu "torch==2.13.*"
fi
quiet_retries "${pip[@]}" -r "$req" -e .
echo "memviz setup: ready ($("$py" -c 'import sys; print(sys.prefix)'))"

#!/usr/bin/env bash
# Check memviz on a real CUDA GPU: the CUDA-vs-simulator parity tests, a driver-view probe, and every
# notebook under `pytest --nbval`. Uses the machine's python3 (with its own CUDA torch). Wheels for
# what that machine lacks (ipywidgets, plotly, nbval, ...) may lie in .whl/ (see ../shared/tools).
# Logs go to $OUT (default ./gpu-check-out).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check-out}; mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  site=$(mktemp -d)
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl || exit 1
  export PYTHONPATH="$site:$PWD" PATH="$site/bin:$PATH"
  python3 -m ipykernel install --user --name python3 >/dev/null
else
  export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee "$out/nvidia-smi.txt"
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))" | tee "$out/torch.txt"
rc=0
python3 -m pytest -p no:cacheprovider -o addopts="" -m cuda -v -s tests/ 2>&1 | tee "$out/cuda-tests.log" \
  || rc=1
python3 scripts/gpu_probe.py 2>&1 | tee "$out/probe.log" || rc=1
if [ "${NOTEBOOKS:-1}" = 1 ] && python3 -c "import nbval" 2>/dev/null; then
  python3 -m pytest -p no:cacheprovider -o addopts="" --nbval --nbval-current-env notebooks/ -v 2>&1 \
    | tee "$out/nbval.log" || rc=1
fi
exit $rc

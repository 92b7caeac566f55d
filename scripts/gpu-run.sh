#!/usr/bin/env bash
# One batch on a real GPU machine (the device tool's H200): the checks, then the recordings, each phase
# bounded in time, everything it writes packed into one file ($OUT/gpu-run.tgz: the device tool brings
# back only a few files). Uses the machine's python3 with its own CUDA torch; wheels for what it lacks
# (ipywidgets, plotly, nbval, ...) from .whl/ (../shared/tools/gpu-wheels.sh fetches them).
#
#   bash scripts/gpu-run.sh check     # = cuda predict probe nbval: the tests marked cuda (parity, the fit panel's
#                                     # run for real), the predictor's tests, a driver probe, every lesson under nbval
#   bash scripts/gpu-run.sh record    # scripts/record_streams.py and evaluation/record_runs.py (fresh processes)
#   bash scripts/gpu-run.sh record-runs  # evaluation/record_runs.py alone
#   bash scripts/gpu-run.sh lessons   # scripts/record_lessons_gpu.py: every lesson's GPU output, lesson 9's what-ifs for real
#   bash scripts/gpu-run.sh execute   # notebooks in $EXECUTE (default lessons 10, 11) executed, kept with their outputs
#   bash scripts/gpu-run.sh ranks     # scripts/gpu_ranks_check.py: the torchrun example's per-rank snapshots, in the RankViewer
#   bash scripts/gpu-run.sh field     # the programs people run, a fresh process each, three recorders at once:
#                                     # evaluation/programs/hf*.py (record_programs.py), dist*.py (record_dist.py, one
#                                     # process per rank), then scripts/record_snapshots.py and evaluation/programs/zoo.py
#   bash scripts/gpu-run.sh watch     # scripts/gpu_watch_check.py: a training loop watched live (peaks, OOM, overhead)
#   bash scripts/gpu-run.sh check lessons record
#   bash scripts/gpu-run.sh watch 'field&' cuda predict nbval wait   # NAME& runs in the background until "wait"
#
# RECORD_RUNS_ARGS / RECORD_STREAMS_ARGS / RECORD_LESSONS_ARGS add to the recorders' arguments (WATCH_ARGS to the
# watch check's), NBVAL_PATHS (default notebooks/) names what nbval runs; BUDGET_S (default 570) is the whole run's
# wall-clock budget: each phase gets what is left, so the pack is always written.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-run-out}; mkdir -p "$out/logs"
start=$(date +%s); budget=${BUDGET_S:-570}
left() { echo $(( budget - ($(date +%s) - start) - 20 )); }
pack() {  # one archive in 15 MiB parts (the device tool brings back files of at most 16 MiB): cat gpu-run.tgz.part-* | tar -xz
  tar -czf - -C "$out" --exclude 'gpu-run.tgz.part-*' . 2>/dev/null | split -b 15m - "$out/gpu-run.tgz.part-"
  ls -la "$out"
}
trap pack EXIT

if ls .whl/*.whl >/dev/null 2>&1; then
  site=$(mktemp -d)
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl || exit 1
  export PYTHONPATH="$site:$PWD" PATH="$site/bin:$PATH"
  python3 -m ipykernel install --user --name python3 >/dev/null
else
  export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv > "$out/logs/nvidia-smi.txt"
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))" \
  > "$out/logs/torch.txt" 2>&1
nproc > "$out/logs/nproc.txt"
python3 -m pip list 2>/dev/null | grep -iE "^(torch|transformers|peft|accelerate|timm|torchvision|nvidia-ml-py) " \
  > "$out/logs/versions.txt"

phase() {  # phase NAME COMMAND...: run with the time left, log to logs/NAME.log, status to logs/status.txt
  local name=$1; shift
  local t; t=$(left)
  if [ "$t" -lt 15 ]; then echo "$name skipped (no time)" >> "$out/logs/status.txt"; return; fi
  local t0; t0=$(date +%s)
  timeout -k 5 "$t" "$@" > "$out/logs/$name.log" 2>&1
  echo "$name rc=$? ${t0}..$(date +%s) ($(( $(date +%s) - t0 )) s)" >> "$out/logs/status.txt"
}

pytest_gpu=(python3 -m pytest -p no:cacheprovider -o addopts="" -v -rs)
phases=("$@"); phases=("${phases[@]/#check/cuda predict probe nbval}")
run_phase() {
  local what=$1
  case $what in
    cuda) phase cuda-tests "${pytest_gpu[@]}" -m cuda -s tests/ ;;
    predict) phase predict-tests "${pytest_gpu[@]}" tests/test_predict*.py tests/test_fit_panel.py ;;
    probe) phase probe python3 scripts/gpu_probe.py ;;
    nbval) phase nbval "${pytest_gpu[@]}" --nbval --nbval-current-env --nbval-cell-timeout=180 ${NBVAL_PATHS:-notebooks/} ;;
    lessons)  # lessons 01-09 executed here (each cell's GPU output kept) and lesson 9's what-ifs on the real allocator
      phase lessons python3 scripts/record_lessons_gpu.py --out "$out/lessons" ${RECORD_LESSONS_ARGS:-}
      ;;
    execute)  # the notebooks in $EXECUTE (default lessons 10 and 11) run top to bottom here, kept with their outputs
      mkdir -p "$out/executed"
      phase execute python3 -c "
import sys, nbformat
from pathlib import Path
from nbclient import NotebookClient
for name in sys.argv[2:]:
    nb = nbformat.read(name, 4)
    NotebookClient(nb, timeout=300, kernel_name='python3', allow_errors=True,
                   resources={'metadata': {'path': 'notebooks'}}).execute()
    nbformat.write(nb, Path(sys.argv[1]) / Path(name).name)
    print('executed', name)
" "$out/executed" ${EXECUTE:-notebooks/10_*.ipynb notebooks/11_*.ipynb}
      ;;
    record)
      mkdir -p "$out/streams" "$out/runs"
      # both recorders run at once (each run is its own process, under its own cap; stats are per process)
      phase record-streams python3 scripts/record_streams.py --out "$out/streams" ${RECORD_STREAMS_ARGS:-} &
      phase record-runs python3 evaluation/record_runs.py --out "$out/runs" ${RECORD_RUNS_ARGS:-} &
      wait
      ;;
    record-runs) mkdir -p "$out/runs"; phase record-runs python3 evaluation/record_runs.py --out "$out/runs" ${RECORD_RUNS_ARGS:-} ;;
    ranks) phase ranks python3 scripts/gpu_ranks_check.py --out "$out/ranks" ;;
    watch) phase watch python3 scripts/gpu_watch_check.py --out "$out/watch" ${WATCH_ARGS:-} ;;  # e.g. WATCH_ARGS="--parts overhead --budget-s 150"
    field)  # three recorders side by side, each set's deadline within the budget; every run is its own process.
      # HF_ONLY / HFHO_ONLY: files of run and chain ids to record (default: the whole plan); FIELD_DIST=0 skips the
      # distributed sets; RECORD_SINGLE_ARGS replaces the single-snapshot recorder's arguments (FIELD_ZOO=0: no zoo)
      t=$(left); each=$(( t / 2 - 10 ))
      only() { [ -n "${1:-}" ] && echo "--only $(cat "$1")"; }
      ( phase record-hf python3 evaluation/record_programs.py --module evaluation.programs.hf --out "$out/hf" \
          --jobs ${FIELD_JOBS:-6} --deadline-s $each $(only "${HF_ONLY:-}")
        phase record-hf-heldout python3 evaluation/record_programs.py --module evaluation.programs.hf_heldout \
          --out "$out/hf_heldout" --jobs ${FIELD_JOBS:-6} --deadline-s $(( $(left) - 15 )) $(only "${HFHO_ONLY:-}") ) &
      if [ "${FIELD_DIST:-1}" = 1 ]; then
        ( phase record-dist python3 evaluation/record_dist.py --module evaluation.programs.dist --out "$out/dist" \
            --jobs ${FIELD_JOBS:-6} --deadline-s $each
          phase record-dist-heldout python3 evaluation/record_dist.py --module evaluation.programs.dist_heldout \
            --out "$out/dist_heldout" --jobs ${FIELD_JOBS:-6} --deadline-s $(( $(left) - 15 )) ) &
      fi
      ( phase record-single python3 scripts/record_snapshots.py ${RECORD_SINGLE_ARGS:---out "$out/single" --jobs 3 --deadline-s $each}
        [ "${FIELD_ZOO:-1}" = 1 ] && phase record-zoo python3 evaluation/record_programs.py \
          --module evaluation.programs.zoo --out "$out/zoo" --jobs 2 --deadline-s 120 ) &
      wait
      ;;
    plan)  # one program set's recording plan (PLAN_MODULE, default lesson 13's programs), a fresh process per run
      phase record-plan python3 evaluation/record_programs.py --module ${PLAN_MODULE:-evaluation.programs.lessons} \
        --out "$out/plan" --jobs 4 --deadline-s $(( $(left) - 15 )) ;;
    hidden)  # the predictor on this machine's CUDA build with the GPU hidden: the same predictions as the CPU build's
      phase hidden env CUDA_VISIBLE_DEVICES= python3 scripts/predict_digest.py --out "$out/logs/digest-hidden.json" ;;
    *) echo "unknown phase $what" >> "$out/logs/status.txt" ;;
  esac
}
for what in ${phases[*]}; do  # "NAME&" runs a phase in the background, "wait" waits for those
  case $what in
    *"&") run_phase "${what%&}" & ;;
    wait) wait ;;
    *) run_phase "$what" ;;
  esac
done
wait

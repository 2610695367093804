#!/usr/bin/env bash
# Sets everything up and runs the main job: a small language model trained
# and evaluated, static and dynamic (examples/ptb_word.py, preset "tiny"),
# saved to runs/main/model.keras (with its vocabulary), ending with a
# generated sample.
# Without --data-dir it trains on the package's embedded synthetic corpus (a
# few minutes on 2 CPU cores, no network); with --data-dir DIR on the Penn
# Treebank files there. Extra arguments go to examples/ptb_word.py (run that
# script directly to have it download Penn Treebank instead).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh plot
export KERAS_BACKEND="${KERAS_BACKEND:-tensorflow}" TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
corpus=(--no-download)
for arg in "$@"; do
  case "$arg" in --data-dir|--data-dir=*) corpus=() ;; esac
done
exec .venv/bin/python examples/ptb_word.py --results-json runs/main/results.json --save-model runs/main/model.keras --plot runs/main/curves.png ${corpus[@]+"${corpus[@]}"} "$@"

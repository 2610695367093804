#!/usr/bin/env bash
# Sets everything up and runs the main job: a small language model trained
# and evaluated, static and dynamic (examples/ptb_word.py, preset "tiny").
# Without --data-dir it downloads Penn Treebank, or falls back to the embedded
# corpus when offline. Extra arguments go to examples/ptb_word.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export KERAS_BACKEND="${KERAS_BACKEND:-tensorflow}" TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
exec .venv/bin/python examples/ptb_word.py --results-json runs/main/results.json "$@"

#!/usr/bin/env bash
# Sets everything up and runs the main job: a small language model trained
# and evaluated, static and dynamic (examples/ptb_word.py, preset "tiny"),
# saved to runs/main/model.keras (with its vocabulary), ending with a
# sample: a prompt from the test text and the model's continuation.
#
#   bash scripts/main.sh                                  # the embedded corpus
#   bash scripts/main.sh --text FILE [--level word|char|byte]   # your own text
#   bash scripts/main.sh --data-dir ../shared/data/ptb    # Penn Treebank files
#   KERAS_BACKEND=jax bash scripts/main.sh                # on JAX (or torch)
#
# Without --data-dir or --text it trains on the package's embedded
# synthetic corpus (no network). Extra arguments go to examples/ptb_word.py
# (run that script directly to have it download Penn Treebank instead). The
# backend's extra (jax, torch) is installed with the plot extra.
set -euo pipefail
cd "$(dirname "$0")/.."
backend="${KERAS_BACKEND:-tensorflow}"
case "$backend" in
  tensorflow) extras=plot ;;
  jax | torch) extras="plot,$backend" ;;
  *)
    echo "main.sh: expected KERAS_BACKEND to be tensorflow, jax or torch. Received: $backend" >&2
    exit 2
    ;;
esac
bash scripts/setup.sh "$extras"
# A CPU-only run: TensorFlow's C++ start-up notes and the failed CUDA probe
# (cuInit) are errors only on a machine with a GPU it cannot use.
export KERAS_BACKEND="$backend" TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"
source scripts/allocator.sh  # 2 MB pages for the large temporaries
corpus=(--no-download)
for arg in "$@"; do
  case "$arg" in --data-dir | --data-dir=* | --text | --text=*) corpus=() ;; esac
done
exec .venv/bin/python examples/ptb_word.py --results-json runs/main/results.json \
  --save-model runs/main/model.keras --plot runs/main/curves.png \
  ${corpus[@]+"${corpus[@]}"} "$@"

#!/usr/bin/env bash
# Sets up and runs the test suite on every Keras backend (TensorFlow, JAX,
# PyTorch), one after the other; KERAS_BACKEND=jax (say) runs one only.
# Extra arguments go to pytest. Fails if the suite fails on any backend.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test || exit 1
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"
backends="${KERAS_BACKEND:-tensorflow jax torch}"
failed=()
for backend in $backends; do
  echo "=== KERAS_BACKEND=$backend ==="
  KERAS_BACKEND="$backend" .venv/bin/python -m pytest "$@" || failed+=("$backend")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "test.sh: the suite failed on: ${failed[*]}"
  exit 1
fi
echo "test.sh: the suite passed on: $backends"

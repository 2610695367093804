#!/usr/bin/env bash
# Sets up and runs the test suite on every Keras backend (TensorFlow, JAX,
# PyTorch), one after the other; KERAS_BACKEND=jax (say) runs one only.
# Extra arguments go to pytest. Fails if the suite fails on any backend.
#
# Without test paths among the arguments, each folder of tests/ (and the
# top-level test files together) runs in its own pytest process: one
# process for the whole suite on JAX crashed in XLA's CPU compiler
# (segmentation fault in backend_compile_and_load, after ~500 tests, never
# in the same test and never in a smaller run), and separate processes
# also keep each backend's compiled-program caches small.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test || exit 1
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"
backends="${KERAS_BACKEND:-tensorflow jax torch}"

has_paths=0
for arg in "$@"; do
  case "$arg" in -*) ;; *) [ -e "${arg%%::*}" ] && has_paths=1 ;; esac
done
if [ "$has_paths" = 1 ]; then
  groups=("")
else
  groups=()
  for dir in tests/*/; do
    ls "$dir"*_test.py >/dev/null 2>&1 && groups+=("${dir%/}")
  done
  groups+=("$(ls tests/*_test.py | tr '\n' ' ')")
fi

failed=()
for backend in $backends; do
  echo "=== KERAS_BACKEND=$backend ==="
  ok=1
  for group in "${groups[@]}"; do
    [ -n "$group" ] && echo "--- $group"
    # shellcheck disable=SC2086  # the group is a list of paths
    KERAS_BACKEND="$backend" .venv/bin/python -m pytest "$@" $group
    rc=$?
    # 5: no tests collected in this group (e.g. all deselected by -k).
    if [ $rc -ne 0 ] && [ $rc -ne 5 ]; then ok=0; fi
  done
  [ $ok = 1 ] || failed+=("$backend")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "test.sh: the suite failed on: ${failed[*]}"
  exit 1
fi
echo "test.sh: the suite passed on: $backends"

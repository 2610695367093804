#!/usr/bin/env bash
# Sets up and runs the test suite on every Keras backend (TensorFlow, JAX,
# PyTorch), two at a time on a machine with 2 cores or more (TEST_JOBS=1:
# one after the other); KERAS_BACKEND=jax (say) runs one only.
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

# One backend's suite, group after group; exit status 1 if any group failed.
run_backend() {
  local backend=$1 ok=1 group rc
  shift
  echo "=== KERAS_BACKEND=$backend ==="
  for group in "${groups[@]}"; do
    [ -n "$group" ] && echo "--- $group"
    # shellcheck disable=SC2086  # the group is a list of paths
    KERAS_BACKEND="$backend" .venv/bin/python -m pytest "$@" $group
    rc=$?
    # 5: no tests collected in this group (e.g. all deselected by -k).
    if [ $rc -ne 0 ] && [ $rc -ne 5 ]; then ok=0; fi
  done
  [ $ok = 1 ]
}

# TEST_JOBS backends at once (default: 2 with several backends and at least
# 2 cores, else 1). Most of a test's time is tracing and compiling, one
# thread at a time, so a second backend uses the core the first leaves
# idle. Each backend's output is kept apart and printed whole when it ends.
read -r -a backend_list <<< "$backends"
jobs_default=1
if [ ${#backend_list[@]} -gt 1 ] && [ "$(nproc 2>/dev/null || echo 1)" -ge 2 ]; then
  jobs_default=2
fi
jobs=${TEST_JOBS:-$jobs_default}
# Side by side, each backend keeps to one thread: PyTorch's default pool
# spins while it waits, and beside another busy process a step took several
# times as long (docs/scaling.md, "PyTorch's threads on a shared machine").
if [ "$jobs" -gt 1 ]; then
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
  export TF_NUM_INTRAOP_THREADS="${TF_NUM_INTRAOP_THREADS:-1}"
  export XLA_FLAGS="${XLA_FLAGS:-} --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
fi

# Compiled programs are kept on disk for this run only (TEST_COMPILE_CACHE=0:
# not at all), so that the many pytest processes and the killed-and-resumed
# workers they start compile a tiny model's step once rather than in each:
# JAX's persistent compilation cache, and TensorFlow's for XLA (the
# evaluators' steps). The key of an entry is the program and the compiler's
# flags, so a hit runs what a miss would have compiled; nothing is kept
# between runs (a fresh directory each time, removed at the end).
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
if [ "${TEST_COMPILE_CACHE:-1}" = 1 ]; then
  export JAX_COMPILATION_CACHE_DIR="$scratch/jax"
  export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
  export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
  mkdir -p "$scratch/tensorflow"
  export TF_XLA_FLAGS="${TF_XLA_FLAGS:-} --tf_xla_persistent_cache_directory=$scratch/tensorflow"
fi

failed=()
if [ "$jobs" -le 1 ]; then
  for backend in "${backend_list[@]}"; do
    run_backend "$backend" "$@" || failed+=("$backend")
  done
else
  logs="$scratch/logs"
  mkdir -p "$logs"
  declare -A pid_of=()
  print_finished() {
    local backend
    for backend in "${!pid_of[@]}"; do
      if ! kill -0 "${pid_of[$backend]}" 2>/dev/null; then
        wait "${pid_of[$backend]}" || failed+=("$backend")
        cat "$logs/$backend.log"
        unset "pid_of[$backend]"
      fi
    done
  }
  for backend in "${backend_list[@]}"; do
    while [ ${#pid_of[@]} -ge "$jobs" ]; do
      sleep 2
      print_finished
    done
    run_backend "$backend" "$@" > "$logs/$backend.log" 2>&1 &
    pid_of[$backend]=$!
  done
  while [ ${#pid_of[@]} -gt 0 ]; do
    sleep 2
    print_finished
  done
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "test.sh: the suite failed on: ${failed[*]}"
  exit 1
fi
echo "test.sh: the suite passed on: $backends"

#!/usr/bin/env bash
# Sets up and runs the test suite on every Keras backend (TensorFlow, JAX,
# PyTorch), two pytest processes at a time on a machine with 2 cores or
# more (TEST_JOBS=1: one after the other); KERAS_BACKEND=jax (say) runs one
# backend only. Extra arguments go to pytest. Fails if the suite fails on
# any backend. TEST_DRY_RUN=1 prints each pytest command line instead of
# running it.
#
# Without test paths among the arguments, each folder of tests/ (and the
# top-level test files together) runs in its own pytest process, once per
# backend: one process for the whole suite on JAX crashed in XLA's CPU
# compiler (segmentation fault in backend_compile_and_load, after ~500
# tests, never in the same test and never in a smaller run), and separate
# processes also keep each backend's compiled-program caches small. These
# (backend, folder) runs are taken longest first (tests/group_seconds.txt,
# measured) by TEST_JOBS workers, so that both cores stay busy to the end.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test || exit 1
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"
source scripts/allocator.sh  # 2 MB pages for the large temporaries
backends="${KERAS_BACKEND:-tensorflow jax torch}"
read -r -a backend_list <<< "$backends"

has_paths=0
for arg in "$@"; do
  case "$arg" in -*) ;; *) [ -e "${arg%%::*}" ] && has_paths=1 ;; esac
done
# The folders of quick tests share one process per backend (starting one
# costs 7-8 s: importing the backend and collecting the tests); each other
# folder has its own. On TensorFlow and PyTorch, which compile little in the
# suite, more folders share it; on JAX only the quickest (see above: one JAX
# process for many compiled tests crashed).
shared_folders() {
  local quick="tests/data tests/losses tests/metrics tests/optimizers tests/samplers"
  case "$1" in
    jax) echo "$quick" ;;
    tensorflow) echo "$quick tests/benchmarks tests/generation tests/layers tests/models" ;;
    *) echo "$quick tests/benchmarks tests/evaluation tests/generation tests/layers tests/models tests/tuning" ;;
  esac
}
# On JAX, besides, a few of the smaller folders share a process two or three
# at a time (each process starts in 4-9 s; the largest group stays under
# ~200 tests, far from the ~500 after which one process crashed).
merged_folders() {
  case "$1" in
    jax) printf '%s\n' "tests/callbacks tests/generation tests/tuning" "tests/benchmarks tests/examples" ;;
  esac
}
groups=()     # every distinct group (a list of paths) of any backend
run_list=()   # "backend index" (index into groups)
add_run() {   # backend, group
  local i
  for i in "${!groups[@]}"; do
    if [ "${groups[$i]}" = "$2" ]; then run_list+=("$1 $i"); return; fi
  done
  groups+=("$2")
  run_list+=("$1 $((${#groups[@]} - 1))")
}
for backend in "${backend_list[@]}"; do
  if [ "$has_paths" = 1 ]; then
    add_run "$backend" ""
    continue
  fi
  shared="$(shared_folders "$backend")"
  add_run "$backend" "$shared"
  merged=""
  while IFS= read -r group; do
    [ -n "$group" ] || continue
    add_run "$backend" "$group"
    merged="$merged $group"
  done <<< "$(merged_folders "$backend")"
  for dir in tests/*/; do
    dir="${dir%/}"
    [[ " $shared $merged " == *" $dir "* ]] && continue
    ls "$dir"/*_test.py >/dev/null 2>&1 && add_run "$backend" "$dir"
  done
  add_run "$backend" "$(ls tests/*_test.py | tr '\n' ' ')"
done
# Tests marked `once_per_suite` (tests/conftest.py) run on the last backend.
export TEST_ONCE_BACKEND="${TEST_ONCE_BACKEND:-${backend_list[-1]}}"

# TEST_JOBS pytest processes at once (default: 2 on a machine with at least
# 2 cores, else 1). Most of a test's time is tracing and compiling, one
# thread at a time, so a second process uses the core the first leaves idle.
jobs_default=1
if [ "$(nproc 2>/dev/null || echo 1)" -ge 2 ] && [ ${#run_list[@]} -gt 1 ]; then
  jobs_default=2
fi
jobs=${TEST_JOBS:-$jobs_default}
# Side by side, each process keeps to one thread: PyTorch's default pool
# spins while it waits, and beside another busy process a step took several
# times as long (docs/scaling.md, "PyTorch's threads on a shared machine").
# TensorFlow keeps one intra-op thread (its inter-op threads still run ops).
# The XLA flags do not shrink JAX's pool, which XLA sizes to the cores a
# process may use (tests/benchmarks/harness_test.py); they stay as the
# suite's timings were measured with them.
if [ "$jobs" -gt 1 ]; then
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
  export TF_NUM_INTRAOP_THREADS="${TF_NUM_INTRAOP_THREADS:-1}"
  export XLA_FLAGS="${XLA_FLAGS:-} --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
fi

# The suite's quick modes (tests/conftest.py, docs/testing.md): TensorFlow
# runs op by op what the tests do not mark compiled; JAX compiles without
# most of XLA's optimisation passes — here also in the processes the tests
# start (training workers, the studies' scripts), which do not read the
# conftest. TEST_COMPILE=all: everything compiled and optimised.
if [ "${TEST_COMPILE:-marked}" = marked ]; then
  export JAX_DISABLE_MOST_OPTIMIZATIONS="${JAX_DISABLE_MOST_OPTIMIZATIONS:-1}"
fi

# Compiled programs are kept on disk, so that the many pytest processes and
# the killed-and-resumed workers they start compile a tiny model's step once
# rather than in each, and a later run of the suite on this machine compiles
# only what changed: JAX's persistent compilation cache, and TensorFlow's for
# XLA (the evaluators' steps). The key of an entry is the program and the
# compiler's flags (and the backend's version), so a hit runs exactly what a
# miss would have compiled. TEST_COMPILE_CACHE=keep (the default) keeps them
# in TEST_COMPILE_CACHE_DIR (default ~/.cache/keras-mogrifier/test-compile),
# one folder per version of jaxlib and TensorFlow, emptied when it passes
# 2 GiB (JAX's own limit, jax_compilation_cache_max_size, is left off: its
# bookkeeping — a lock and an access-time file per entry — made a process
# with thousands of one-operation programs 2.3× slower, measured);
# =run keeps them for this run only (a fresh directory, removed at the end);
# =0 turns them off. Measured (docs/testing.md): JAX's tests/models 146 s
# with the cache empty, 70 s with it filled by a run before.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cache_mode="${TEST_COMPILE_CACHE:-keep}"
[ "$cache_mode" = 1 ] && cache_mode=run
cache=""
case "$cache_mode" in
  keep)
    versions=$(.venv/bin/python -c "
import importlib.metadata as m
print('-'.join(p + m.version(p) for p in ('jaxlib', 'tensorflow')))" 2>/dev/null || echo unknown)
    root="${TEST_COMPILE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/keras-mogrifier/test-compile}"
    cache="$root/$versions"
    if [ -d "$cache" ] && [ "$(du -sm "$cache" 2>/dev/null | cut -f1)" -gt 2048 ]; then
      rm -rf "$cache"
    fi
    mkdir -p "$cache" 2>/dev/null || cache="$scratch"
    ;;
  run) cache="$scratch" ;;
  0) ;;
  *) echo "test.sh: expected TEST_COMPILE_CACHE to be keep, run or 0; received: $cache_mode" >&2
     exit 2 ;;
esac
if [ -n "$cache" ]; then
  mkdir -p "$cache/jax" "$cache/tensorflow"
  export JAX_COMPILATION_CACHE_DIR="$cache/jax"
  export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
  export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
  export TF_XLA_FLAGS="${TF_XLA_FLAGS:-} --tf_xla_persistent_cache_directory=$cache/tensorflow"
fi

# The runs, longest first: "seconds backend index" (index into groups).
seconds_of() {  # measured seconds of a (backend, group); 0 if not listed
  awk -v b="$1" -v g="$2" '$1 == b && $2 == g { print $3; found = 1 } END { if (!found) print 0 }' \
    tests/group_seconds.txt 2>/dev/null || echo 0
}
: > "$scratch/runs"
for run in "${run_list[@]}"; do
  read -r backend i <<< "$run"
  # shellcheck disable=SC2086  # e.g. tests/data+tests/losses+...
  key=$(echo ${groups[$i]} | tr ' ' '+')
  [[ "$key" == *.py+* ]] && key="top-level"  # tests/*_test.py
  echo "$(seconds_of "$backend" "${key:-all}") $backend $i" >> "$scratch/runs"
done
sort -k1,1nr -s "$scratch/runs" -o "$scratch/runs"
# One NUL-terminated argument each; none at all when none were given (a
# bare `printf '%s\0'` would write one empty argument, which pytest reads
# as the current directory: every process would run the whole suite).
: > "$scratch/pytest_args"
[ $# -gt 0 ] && printf '%s\0' "$@" > "$scratch/pytest_args"
printf '%s\n' "${groups[@]}" > "$scratch/groups"
mkdir -p "$scratch/logs" "$scratch/failed"

# One run: pytest on one group for one backend; its output is printed whole
# when it ends (never interleaved with another's), and a failure is noted.
run_one() {
  local backend=$1 index=$2 group args log rc start
  group=$(sed -n "$((index + 1))p" "$SUITE_SCRATCH/groups")
  mapfile -d '' args < "$SUITE_SCRATCH/pytest_args"
  log="$SUITE_SCRATCH/logs/$backend.$index.log"
  if [ -n "${TEST_DRY_RUN:-}" ]; then  # print the command line, run nothing
    # shellcheck disable=SC2086
    ( flock 9; echo "=== plan: KERAS_BACKEND=$backend$(printf ' %q' pytest "${args[@]}" $group)" ) \
      9> "$SUITE_SCRATCH/print.lock"
    return 0
  fi
  start=$SECONDS
  # shellcheck disable=SC2086  # the group is a list of paths
  KERAS_BACKEND="$backend" .venv/bin/python -m pytest "${args[@]}" $group > "$log" 2>&1
  rc=$?
  # 5: no tests collected in this group (e.g. all deselected by -k).
  if [ $rc -ne 0 ] && [ $rc -ne 5 ]; then touch "$SUITE_SCRATCH/failed/$backend"; fi
  (
    flock 9
    echo "=== KERAS_BACKEND=$backend ${group:-(the given tests)}: exit $rc, $((SECONDS - start)) s"
    cat "$log"
  ) 9> "$SUITE_SCRATCH/print.lock"
}
export -f run_one
export SUITE_SCRATCH="$scratch"

awk '{ print $2, $3 }' "$scratch/runs" | xargs -P "$jobs" -L 1 bash -c 'run_one "$@"' _

if [ -n "${TEST_DRY_RUN:-}" ]; then
  echo "test.sh: dry run: nothing ran (GLIBC_TUNABLES=$GLIBC_TUNABLES)"
  exit 0
fi
failed=()
for backend in "${backend_list[@]}"; do
  [ -e "$scratch/failed/$backend" ] && failed+=("$backend")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "test.sh: the suite failed on: ${failed[*]}"
  exit 1
fi
echo "test.sh: the suite passed on: $backends"

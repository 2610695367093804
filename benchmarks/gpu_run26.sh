#!/usr/bin/env bash
# Issue 26's three re-measurements on the device, side by side on one GPU:
# the ladder (benchmarks/test_time_adaptation.py), the PTB search of dynamic
# evaluation (tuning/search_dyneval.py) and the reverse-copy study's 12
# points (examples/reverse_copy_study.py, one process each; gathered here
# with --merge). Staged as gpu/run26.sh beside gpu/keras_mogrifier, gpu/benchmarks,
# gpu/examples, gpu/tuning (copies of the repository's), gpu/ptb (Penn Treebank),
# gpu/lstm.keras (runs/ptb_small6/lstm.keras) and the wheels in .whl/ (keras, h5py,
# keras-tuner, kt-legacy, grpcio, protobuf, namex, optree: see benchmarks/gpu_run.sh).
# From the repository root: bash gpu/run26.sh OUTPUT_DIR
set -uo pipefail
out="$(cd "${1:?the output folder}" && pwd)"
PY=${PY:-python3}
budget=${BUDGET:-470}
if [ -z "${NO_INSTALL:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  nvidia-smi --query-gpu=name,memory.total --format=csv
fi
cd gpu
export PYTHONPATH="/tmp/site:$PWD" KERAS_BACKEND=jax PYTHONUNBUFFERED=1 \
  XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=3
$PY -c "import keras, h5py, jax, keras_tuner, keras_mogrifier; print('keras', keras.__version__, 'jax', jax.__version__, jax.devices())" || exit 1
w=/tmp/w26; rm -rf $w; mkdir -p $w/rc
date -u +"start %FT%TZ"
timeout $budget $PY benchmarks/test_time_adaptation.py --model lstm.keras --data-dir ptb \
  --json $w/ladder.json --curves $w/ladder_curves.npz \
  --device "one NVIDIA H200, JAX; the GPU shared with the search and the reverse-copy study's 12 processes" \
  ${LADDER_ARGS:-} > $w/ladder.log 2>&1 &
timeout $budget $PY tuning/search_dyneval.py --model lstm.keras --data-dir ptb --max-trials 10 \
  --max-tokens 10000 --statistics-tokens 200000 --test-tokens 20000 --directory /tmp/search26 \
  --overwrite --verbose 2 --results-json $w/search_dyneval_ptb_small6.json \
  ${SEARCH_ARGS:-} > $w/search.log 2>&1 &
cd examples
for L in ${RC_LENGTHS:-5 10 15 20}; do for c in lstm mogrifier_lstm rlstm; do
  timeout $budget $PY reverse_copy_study.py --cells $c --lengths $L --vocabulary-size 100 \
    --parameters 100000 --train-examples 20000 --evaluation-examples 2000 --epochs 6 \
    --trials 4 --tuner-dir /tmp/rc26/${c}_L$L --results-json $w/rc/${c}_L$L.json \
    ${RC_ARGS:-} > $w/rc/${c}_L$L.log 2>&1 &
done; done
cd ..
wait
date -u +"end %FT%TZ"
tail -n 12 $w/ladder.log $w/search.log; tail -n 2 $w/rc/*.log
tar -C /tmp -czf "$out/w26.tgz" w26
cp $w/ladder.json $w/search_dyneval_ptb_small6.json "$out/" 2>/dev/null
ls -la "$out"

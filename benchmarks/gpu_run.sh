#!/usr/bin/env bash
# The device command of benchmarks/gpu.py, staged as gpu/run.sh beside
# gpu/gpu_bench.py (a copy of benchmarks/gpu.py), gpu/backends.py, gpu/_harness.py,
# gpu/keras_mogrifier/ (the package) and gpu/ptb/ (Penn Treebank), with
# the wheels of keras and what the GPU image lacks in .whl/. Run from the
# repository root: bash gpu/run.sh OUTPUT_DIR [gpu_bench.py options]
# (TIMEOUT=seconds bounds gpu_bench.py; default 470)
set -uo pipefail
out="$(cd "${1:?the output folder}" && pwd)"; shift
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
nvidia-smi
cd gpu
export PYTHONPATH="/tmp/site:$PWD"
KERAS_BACKEND=jax python3 -c "import keras, keras_mogrifier; print('keras', keras.__version__, keras_mogrifier.__file__)"
timeout "${TIMEOUT:-470}" python3 gpu_bench.py --json "$out/gpu.json" "$@"

"""What `torch.compile` of the cell step buys PyTorch's static evaluation (issue 29).

An experiment, not a library feature: the package's time loop
(`keras_mogrifier.backend.torch.rnn`) is patched to run the cell's step
through `torch.compile` (no-grad calls only), and `DynamicEvaluator.evaluate(...,
adapt=False)` over 500 tokens (batch 1, segments of 5, a 2 × 256 model over a
10k vocabulary, one torch thread) is timed eager, compiled, and eager again,
with the loss of each pass (the compiled pass must give the eager loss).

    KERAS_BACKEND=torch python benchmarks/torch_compile_step.py "cpu" out.json

Run on the lent H200 machine, 2026-11-26 (PyTorch 2.11, Keras 3.15.1), two
processes side by side, each pinned to its own core: one on the CPU
(`CUDA_VISIBLE_DEVICES= taskset -c 2 python torch_compile_step.py "cpu ..."
step_cpu.json`) and one on the GPU (`taskset -c 4 ...  step_cuda.json`);
results in `benchmarks/results/torch_compile/`.
"""

import json
import sys
import time

import numpy as np
import torch
torch.set_num_threads(1)
from keras_mogrifier import LanguageModel
from keras_mogrifier.evaluation import DynamicEvaluator
import keras_mogrifier.backend.torch as bt
out = {"device": sys.argv[1], "torch": torch.__version__, "rows": []}
path = sys.argv[2]
def save():
    json.dump(out, open(path, "w"), indent=1)
for cell in ("rlstm", "lstm"):
    m = LanguageModel(10000, units=256, num_layers=2, batch_size=1, cell=cell)
    m.build((1, 35))
    ev = DynamicEvaluator(m, segment_length=5)
    ids = np.random.RandomState(0).randint(0, 10000, size=501)
    ev.evaluate(ids, adapt=False, verbose=0)
    def timed():
        t = time.perf_counter(); r = ev.evaluate(ids, adapt=False, verbose=0)
        return 1000 * (time.perf_counter() - t) / 500, float(r["loss"])
    row = {"cell": cell, "eager": [timed() for _ in range(3)]}
    orig = bt.rnn
    cache = {}
    def rnn(step_function, inputs, initial_states, **kw):
        if torch.is_grad_enabled() or kw.get("mask") is not None or kw.get("constants"):
            return orig(step_function, inputs, initial_states, **kw)
        key = step_function.__code__
        if key not in cache:
            cache[key] = torch.compile(step_function, dynamic=False)
        return orig(cache[key], inputs, initial_states, **kw)
    bt.rnn = rnn
    t = time.perf_counter(); ev.evaluate(ids, adapt=False, verbose=0)
    row["compile_pass_s"] = time.perf_counter() - t
    row["compiled"] = [timed() for _ in range(3)]
    bt.rnn = orig
    row["eager_again"] = [timed() for _ in range(2)]
    out["rows"].append(row); save()
    print(json.dumps(row), flush=True)
    torch._dynamo.reset()

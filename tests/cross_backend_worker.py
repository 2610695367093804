"""Run by tests/cross_backend_test.py in a fresh process per Keras backend.

    python cross_backend_worker.py compute OUT_DIR   # logits, dyneval loss, .keras files
    python cross_backend_worker.py load OUT_DIR FILE...  # predictions of saved models

The backend is the `KERAS_BACKEND` of the process. Every model gets the same
weights on every backend: each weight is drawn from a NumPy generator seeded
by its path, so nothing depends on a backend's random number generator.
"""

import json
import os
import sys
import zlib

import keras
import numpy as np

import keras_mogrifier as km

VOCAB = 23
CELL_KINDS = ("lstm", "mogrifier_lstm", "rlstm", "mogrifier_rlstm")
IDS = np.random.default_rng(0).integers(0, VOCAB, (2, 9)).astype("int32")
STREAM = np.random.default_rng(1).integers(0, VOCAB, 31).astype("int32")


def build(cell, dual=False):
    model = km.LanguageModel(
        VOCAB, units=8, num_layers=2, cell=cell, mogrifier_rounds=3,
        mogrifier_rank=2, dual=dual, batch_size=2,
    )
    model.build((2, None))
    for v in model.weights:
        if v.path.split("/", 1)[-1].startswith("state_") or not v.trainable:
            continue
        rng = np.random.default_rng(zlib.crc32(v.path.split("/", 1)[-1].encode()))
        v.assign(rng.uniform(-0.5, 0.5, size=v.shape).astype("float32"))
    return model


def statistics(evaluator):
    out = {}
    for v in evaluator.adapted_variables():
        rng = np.random.default_rng(zlib.crc32(("ms/" + v.path).encode()))
        out[v.path] = (10.0 ** rng.uniform(-3, -1, size=v.shape)) ** 2
    return out


def compute(out_dir):
    backend = keras.backend.backend()
    results = {}
    for cell in CELL_KINDS:
        for dual in (False, True):
            name = f"{cell}{'_dual' if dual else ''}"
            model = build(cell, dual)
            model.reset_states()
            results[f"logits/{name}"] = keras.ops.convert_to_numpy(model(IDS))
            model.reset_states()
            model.save(os.path.join(out_dir, f"{backend}_{name}.keras"))
    model = build("mogrifier_rlstm").with_options(batch_size=1)
    evaluator = km.DynamicEvaluator(model, learning_rate=3e-3, decay_rate=0.05)
    evaluator.gradient_statistics = statistics(evaluator)
    report = evaluator.evaluate(STREAM, verbose=0, return_token_losses=True)
    results["dynamic/token_losses"] = report["token_losses"]
    results["dynamic/loss"] = np.asarray(report["loss"])
    static = evaluator.evaluate(STREAM, verbose=0, adapt=False, return_token_losses=True)
    results["static/token_losses"] = static["token_losses"]
    np.savez(os.path.join(out_dir, f"{backend}_results.npz"), **results)


def load(out_dir, files):
    backend = keras.backend.backend()
    predictions = {}
    for path in files:
        model = keras.saving.load_model(path)
        model.reset_states()
        predictions[os.path.basename(path)] = keras.ops.convert_to_numpy(model(IDS))
    np.savez(os.path.join(out_dir, f"{backend}_loaded.npz"), **predictions)
    with open(os.path.join(out_dir, f"{backend}_loaded.json"), "w") as f:
        json.dump(sorted(predictions), f)


if __name__ == "__main__":
    mode, out_dir, *rest = sys.argv[1:]
    if mode == "compute":
        compute(out_dir)
    else:
        load(out_dir, rest)

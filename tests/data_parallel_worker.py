"""Run by tests/data_parallel_test.py in a process with two virtual devices.

    python data_parallel_worker.py OUT.npz

TensorFlow gets two logical CPU devices, JAX two host-platform devices
(`XLA_FLAGS=--xla_force_host_platform_device_count=2`, set by the test
before JAX starts). A stateful `LanguageModel` with D = 2 dropout samples
(dropout off, so that both trainings see the same network) trains a few
steps on one device and, with the same weights and the same global batches,
data-parallel over the two; the losses, the weights and the carried state
(per stream and per sample copy) are written for the test to compare.
"""

import os
import sys
import zlib

import keras

if keras.backend.backend() == "tensorflow":
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2
    )

import numpy as np  # noqa: E402

import keras_mogrifier as km  # noqa: E402
from keras_mogrifier.backend import get_backend_module  # noqa: E402

VOCAB, BATCH, TIME, SAMPLES, STEPS = 31, 4, 6, 2, 3


def make_model():
    model = km.LanguageModel(
        VOCAB, units=8, num_layers=2, cell="mogrifier_rlstm", mogrifier_rounds=2,
        mogrifier_rank=2, samples=SAMPLES, batch_size=BATCH,
    )
    model.build((BATCH, None))
    for v in model.trainable_variables:
        seed = zlib.crc32(v.path.split("/", 1)[-1].encode())
        v.assign(np.random.default_rng(seed).uniform(-0.3, 0.3, v.shape).astype("float32"))
    model.compile(
        optimizer=keras.optimizers.SGD(0.5), loss=km.IWAEDropoutLoss(),
        jit_compile=False if keras.backend.backend() == "tensorflow" else "auto",
    )
    return model


class Losses(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.values = []

    def on_train_batch_end(self, batch, logs=None):
        self.values.append(float(logs["loss"]))


def carried_state(model, replicas):
    """State rows in the single-device layout: `(layers·2, D·B, units)`.

    Row `d·B + s` holds copy `d` of stream `s`. On TensorFlow each replica
    keeps its own copy of the state variables (the rows of the streams it
    trains, in the same copy-major layout); on JAX the variables already hold
    the global batch.
    """
    out = []
    for v in model.recurrent_state_variables:
        if keras.backend.backend() == "tensorflow" and replicas > 1:
            strategy = tf.distribute.get_strategy()
            locals_ = [np.asarray(t) for t in strategy.experimental_local_results(v.value)]
            per = BATCH // replicas
            rows = np.zeros((SAMPLES * BATCH, v.shape[1]), "float32")
            for r, local in enumerate(locals_):
                for d in range(SAMPLES):
                    rows[d * BATCH + r * per : d * BATCH + (r + 1) * per] = local[
                        d * per : (d + 1) * per
                    ]
            out.append(rows)
        else:
            out.append(keras.ops.convert_to_numpy(v)[: SAMPLES * BATCH])
    return np.stack(out)


def train(data, parallel):
    backend = get_backend_module()
    losses = Losses()
    if parallel:
        with backend.data_parallel() as replicas:
            assert replicas == 2, replicas
            model = make_model()
            model.fit(data, epochs=1, verbose=0, callbacks=[losses])
            state = carried_state(model, replicas)
    else:
        model = make_model()
        model.fit(data, epochs=1, verbose=0, callbacks=[losses])
        state = carried_state(model, 1)
    weights = [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
    # Evaluation after data-parallel training works outside the scope too.
    logs = model.evaluate(data, verbose=0, return_dict=True)
    return np.asarray(losses.values), weights, state, float(logs["loss"])


def main(path):
    ids = np.random.default_rng(0).integers(0, VOCAB, 1000)
    data = km.data.StreamDataset(ids, BATCH, TIME, max_tokens=BATCH * TIME * STEPS)
    single = train(data, parallel=False)
    parallel = train(data, parallel=True)
    results = {}
    for name, result in (("single", single), ("parallel", parallel)):
        results[f"{name}/losses"] = result[0]
        for i, w in enumerate(result[1]):
            results[f"{name}/weight_{i}"] = w
        results[f"{name}/state"] = result[2]
        results[f"{name}/evaluate"] = np.asarray(result[3])
    np.savez(path, **results)


if __name__ == "__main__":
    main(sys.argv[1])

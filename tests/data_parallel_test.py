"""Data-parallel training of a stateful LanguageModel equals one device.

Runs `data_parallel_worker.py` in a fresh process with two virtual devices
(a backend's device count is fixed once it starts): a few steps of training
with D = 2 samples on one device and data-parallel over two must give the
same losses, the same weights and the same carried state of every stream.
"""

import os
import subprocess
import sys

import keras
import numpy as np

import testing

WORKER = os.path.join(os.path.dirname(__file__), "data_parallel_worker.py")


@testing.backend_specific(
    "tensorflow", "jax",
    reason="Keras has data-parallel `fit` for TensorFlow (MirroredStrategy) "
    "and JAX (keras.distribution), none for PyTorch",
)
def test_data_parallel_training_equals_single_device_training(tmp_path):
    env = dict(
        os.environ,
        KERAS_BACKEND=keras.backend.backend(),
        TF_CPP_MIN_LOG_LEVEL="3",
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
    )
    path = tmp_path / "results.npz"
    done = subprocess.run(
        [sys.executable, WORKER, str(path)], env=env, capture_output=True,
        text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    r = dict(np.load(path))
    assert r["single/losses"].shape == (3,)
    np.testing.assert_allclose(r["parallel/losses"], r["single/losses"], rtol=1e-5)
    weights = sorted(k for k in r if k.startswith("single/weight_"))
    assert len(weights) > 10
    for key in weights:
        np.testing.assert_allclose(
            r[key.replace("single", "parallel")], r[key], rtol=1e-5, atol=1e-6,
            err_msg=key,
        )
    # The carried state of every stream and sample copy, in one layout.
    assert r["single/state"].shape == (4, 8, 8)
    assert np.abs(r["single/state"]).min(axis=(0, 2)).max() > 0  # every row was written
    np.testing.assert_allclose(r["parallel/state"], r["single/state"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r["parallel/evaluate"], r["single/evaluate"], rtol=1e-5)

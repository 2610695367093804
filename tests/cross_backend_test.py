"""The same model computes the same numbers on TensorFlow, JAX and PyTorch.

Each backend runs `cross_backend_worker.py` in a process of its own (a Keras
backend is chosen once per process): the same weights (drawn by path from
NumPy) must give the same logits for every cell kind, with and without the
Dual head, and the same dynamic-evaluation losses; a `.keras` file written on
one backend must load on each other one and predict the same.
"""

import os
import subprocess
import sys

import numpy as np
import pytest


# Every backend's worker runs in its own process: once per suite (on the
# backend scripts/test.sh names; by hand, on any).
pytestmark = pytest.mark.once_per_suite

BACKENDS = ("tensorflow", "jax", "torch")
WORKER = os.path.join(os.path.dirname(__file__), "cross_backend_worker.py")


def _run(backend, *args):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, WORKER, *args], env=env, capture_output=True, text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{backend} worker failed:\n{done.stderr[-4000:]}"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    out = tmp_path_factory.mktemp("cross_backend")
    for backend in BACKENDS:
        _run(backend, "compute", str(out))
    for backend in BACKENDS:
        others = sorted(
            str(out / f) for f in os.listdir(out)
            if f.endswith(".keras") and not f.startswith(backend + "_")
        )
        _run(backend, "load", str(out), *others)
    return out


# The three workers run the three backends themselves: once is enough.
def test_same_weights_give_the_same_logits_and_dynamic_losses(outputs):
    results = {b: dict(np.load(outputs / f"{b}_results.npz")) for b in BACKENDS}
    keys = sorted(results["tensorflow"])
    assert len([k for k in keys if k.startswith("logits/")]) == 8
    for backend in ("jax", "torch"):
        assert sorted(results[backend]) == keys
        for key in keys:
            np.testing.assert_allclose(
                results[backend][key], results["tensorflow"][key],
                rtol=1e-5, atol=1e-6, err_msg=f"{key}: {backend} vs tensorflow",
            )
    # The dynamic evaluation really adapted: after the first segment its
    # losses differ from the static ones.
    dynamic = results["tensorflow"]["dynamic/token_losses"]
    static = results["tensorflow"]["static/token_losses"]
    assert dynamic.shape == static.shape == (1, 30)
    np.testing.assert_allclose(dynamic[:, :5], static[:, :5], rtol=1e-6)
    assert np.abs(dynamic[:, 5:] - static[:, 5:]).max() > 1e-3


def test_keras_files_load_on_every_other_backend_and_predict_the_same(outputs):
    for reader in BACKENDS:
        loaded = dict(np.load(outputs / f"{reader}_loaded.npz"))
        writers = {name.split("_", 1)[0] for name in loaded}
        assert writers == set(BACKENDS) - {reader}
        assert len(loaded) == 16
        for name, predicted in loaded.items():
            writer, model_name = name[: -len(".keras")].split("_", 1)
            expected = np.load(outputs / f"{writer}_results.npz")[f"logits/{model_name}"]
            np.testing.assert_allclose(
                predicted, expected, rtol=1e-5, atol=1e-6,
                err_msg=f"{model_name} written on {writer}, read on {reader}",
            )

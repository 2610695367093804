"""benchmarks/dynamic_floor.py: its bare eager PyTorch loop (the limit issue 43's
PyTorch figures are measured against) is the package's dynamic evaluation."""

import os
import sys

import keras
import numpy as np
import pytest

from testing import load_module

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "torch", reason="a bare PyTorch loop"
)


def test_the_bare_loop_scores_as_the_package_and_restores_the_weights():
    from keras_mogrifier import DynamicEvaluator
    from keras_mogrifier import LanguageModel

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))  # its sibling modules
    floor = load_module(os.path.join(ROOT, "benchmarks", "dynamic_floor.py"), "dynamic_floor")
    keras.utils.set_random_seed(0)
    model = LanguageModel(50, units=8, num_layers=2, batch_size=1, cell="rlstm")
    model.build((1, 5))
    stream = np.random.default_rng(0).integers(0, 50, size=41).astype("int32")
    evaluator = DynamicEvaluator(model, segment_length=5, learning_rate=1e-3)
    evaluator.collect_gradient_statistics(stream, batch_size=1)
    weights = [keras.ops.convert_to_numpy(w) for w in model.weights]

    static = evaluator.evaluate(stream, adapt=False, verbose=0, return_token_losses=True)
    package = evaluator.evaluate(stream, verbose=0, return_token_losses=True)
    bare = floor.bare_adaptation(model, evaluator, stream)

    package = np.ravel(package["token_losses"])
    assert np.max(np.abs(package - np.ravel(static["token_losses"]))) > 1e-3  # it adapts
    np.testing.assert_allclose(bare, package, atol=1e-5)
    for before, after in zip(weights, model.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(after), before)

"""benchmarks/convergence.py's saved model of a row's best seed: a `.keras`
file with float16 weights that `keras.saving.load_model` reads on every
backend into float32 variables."""

import os

import keras
import numpy as np

from keras_mogrifier import LanguageModel
from keras_mogrifier.data import Vocabulary

from testing import load_module

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _convergence():
    return load_module(os.path.join(ROOT, "benchmarks", "convergence.py"), "convergence")


def test_a_float16_keras_file_loads_into_float32_variables(tmp_path):
    keras.utils.set_random_seed(0)
    words = ["<eos>", "<unk>"] + [f"w{i}" for i in range(998)]
    model = LanguageModel(1000, units=64, num_layers=2, cell="mogrifier_rlstm",
                          mogrifier_rank=4, batch_size=2, vocabulary=Vocabulary(words))
    model.build((2, None))
    ids = np.random.default_rng(0).integers(0, 1000, (2, 7)).astype("int32")
    path = str(tmp_path / "best.keras")
    _convergence().save_float16_model(model, path)
    full = str(tmp_path / "full.keras")
    model.save(full)
    assert os.path.getsize(path) < 0.6 * os.path.getsize(full)
    loaded = keras.saving.load_model(path)
    assert len(loaded.weights) == len(model.weights)
    # It carries its vocabulary: `examples/generate.py --model` reads and
    # writes text with it.
    assert list(loaded.vocabulary) == words
    for original, read in zip(model.weights, loaded.weights):
        value = keras.ops.convert_to_numpy(read)
        expected = keras.ops.convert_to_numpy(original)
        assert value.dtype == expected.dtype, original.path
        if expected.dtype == np.float32:
            expected = expected.astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(value, expected, err_msg=original.path)
    # The same model (both from the zero state): its logits within
    # float16's rounding of the weights.
    a = keras.ops.convert_to_numpy(model(ids))
    b = keras.ops.convert_to_numpy(loaded(ids))
    assert a.shape == (2, 7, 1000)
    np.testing.assert_allclose(b, a, atol=0.05)

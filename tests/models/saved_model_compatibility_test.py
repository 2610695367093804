"""Models saved by the previous release load, and compute what they did.

The fixtures were saved by the release before `CellRNN` (the recurrent
layers were `keras.layers.RNN(cell)`) with TensorFlow, together with the
logits they produced for a fixed batch. A `.keras` file stores a model's
list of layers under their class names, so a renamed layer class would
orphan every saved model's recurrent weights.
"""

import io
import os
import zipfile

import h5py
import keras
import numpy as np
import pytest

import keras_mogrifier  # noqa: F401  (registers the classes)
from testing import to_numpy

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures")
X = ((np.arange(12).reshape(2, 6) * 7) % 20).astype("int32")


@pytest.mark.parametrize("name", ["mogrifier_lstm", "rlstm_dual"])
def test_a_model_saved_by_the_previous_release_loads_and_computes_the_same(name):
    model = keras.saving.load_model(os.path.join(FIXTURES, f"release1_{name}.keras"))
    model.reset_states()
    expected = np.load(os.path.join(FIXTURES, f"release1_{name}_logits.npy"))
    np.testing.assert_allclose(to_numpy(model(X)), expected, rtol=1e-5, atol=1e-5)


def test_new_files_keep_the_recurrent_layers_where_old_ones_have_them(tmp_path):
    from keras_mogrifier.models import LanguageModel

    model = LanguageModel(20, units=6, num_layers=2, batch_size=2)
    model(X)
    path = str(tmp_path / "model.keras")
    model.save(path)
    with zipfile.ZipFile(path) as archive:
        store = h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r")
        names = []
        store.visit(names.append)
    assert "layers/rnn/cell/vars" in names and "layers/rnn_1/cell/vars" in names


RELEASE2 = ["plain", "dual", "mos", "samples2", "vocabulary"]


@pytest.mark.parametrize("name", RELEASE2)
def test_a_model_saved_by_release_2_loads_and_computes_the_same(name):
    """Saved by tests/fixtures/save_release2.py (plain, Dual, MoS, D = 2, vocabulary)."""
    model = keras.saving.load_model(os.path.join(FIXTURES, f"release2_{name}.keras"))
    model.reset_states()
    expected = np.load(os.path.join(FIXTURES, f"release2_{name}_logits.npy"))
    np.testing.assert_allclose(to_numpy(model(X)), expected, rtol=1e-5, atol=1e-5)


def test_a_release_2_model_with_its_vocabulary_still_writes_the_same_text():
    model = keras.saving.load_model(os.path.join(FIXTURES, "release2_vocabulary.keras"))
    with open(os.path.join(FIXTURES, "release2_vocabulary_greedy.txt")) as f:
        expected = f.read()
    model.reset_states()
    assert model.generate("w3 w5 w7", max_length=8, sampler="greedy") == expected

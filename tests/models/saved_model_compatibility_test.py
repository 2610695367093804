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


def _rewrite_config(source, target, **changes):
    """A copy of the `.keras` file `source` with its model config changed."""
    import json

    with zipfile.ZipFile(source) as archive, zipfile.ZipFile(target, "w") as out:
        for item in archive.infolist():
            data = archive.read(item.filename)
            if item.filename == "config.json":
                config = json.loads(data)
                config["config"].update(changes)
                data = json.dumps(config).encode()
            out.writestr(item, data)


def test_a_config_that_does_not_match_the_saved_weights_is_refused(tmp_path):
    """A file whose config says K = 0 for a model saved with K = 2 would load
    8 of 11 weights without a word: the file records its weights, and a
    load into another configuration is refused, naming them."""
    from keras_mogrifier.models import LanguageModel

    model = LanguageModel(20, units=6, num_layers=1, batch_size=2, mixture_of_softmaxes=2,
                          mogrifier_rounds=0, cell="lstm")
    model(X)
    path = str(tmp_path / "mos.keras")
    model.save(path)
    # The file as saved loads and computes the same.
    loaded = keras.saving.load_model(path)
    model.reset_states()
    loaded.reset_states()
    np.testing.assert_allclose(to_numpy(loaded(X)), to_numpy(model(X)), atol=1e-6)
    edited = str(tmp_path / "edited.keras")
    _rewrite_config(path, edited, mixture_of_softmaxes=0)
    with pytest.raises(ValueError, match="no place for.*mixture_of_softmaxes/projection_kernel"):
        keras.saving.load_model(edited)
    # Weights saved from another model: refused before any weight moves.
    weights = str(tmp_path / "mos.weights.h5")
    model.save_weights(weights)
    other = LanguageModel(20, units=6, num_layers=1, batch_size=2, mogrifier_rounds=0,
                          cell="lstm")
    other(X)
    before = [to_numpy(v).copy() for v in other.weights]
    with pytest.raises(ValueError, match="Expected the saved weights to be those"):
        other.load_weights(weights)
    for v, b in zip(other.weights, before):
        np.testing.assert_array_equal(to_numpy(v), b)

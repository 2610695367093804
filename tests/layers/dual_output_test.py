import numpy as np
import pytest
import keras

import keras_mogrifier as km

import reference
import testing
from testing import to_numpy

B, T, E, N, D = 3, 5, 6, 8, 6


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(B, T, E)).astype("float32"), rng.normal(size=(B, T, N)).astype("float32")]


def test_matches_numpy_reference():
    e, h = _inputs()
    layer = km.DualOutput(D)
    layer([e, h])
    rng = np.random.default_rng(1)
    w_de, w_dh, b = (rng.normal(size=w.shape) for w in layer.get_weights())
    layer.set_weights([w_de, w_dh, b])
    expected = np.maximum(e @ w_de + h @ w_dh + b, 0.0)
    np.testing.assert_allclose(to_numpy(layer([e, h])), expected, rtol=1e-5, atol=1e-5)
    tanh = km.DualOutput(D, activation="tanh", use_bias=False)
    tanh([e, h])
    tanh.set_weights([w_de, w_dh])
    np.testing.assert_allclose(to_numpy(tanh([e, h])), np.tanh(e @ w_de + h @ w_dh), rtol=1e-5, atol=1e-5)


def test_weights_and_2d_inputs():
    layer = km.DualOutput(D)
    out = layer([np.ones((B, E)), np.ones((B, N))])
    assert tuple(out.shape) == (B, D)
    assert [w.path.split("/")[-1] for w in layer.weights] == ["embedding_kernel", "state_kernel", "bias"]


def test_dropout_only_in_training():
    e, h = _inputs()
    layer = km.DualOutput(D, dropout=0.5, output_dropout=0.5, seed=1)
    ref = to_numpy(layer([e, h]))
    np.testing.assert_array_equal(to_numpy(layer([e, h])), ref)
    a, b = to_numpy(layer([e, h], training=True)), to_numpy(layer([e, h], training=True))
    assert not np.allclose(a, b)
    # Output dropout zeroes whole entries, different at each time step.
    zeros = a == 0
    assert not np.array_equal(zeros[:, 0], zeros[:, 1])


def test_mask_passes_through():
    e, h = _inputs()
    inputs_e, inputs_h = keras.Input((None, E)), keras.Input((None, N))
    masked = keras.layers.Masking(0.0)(inputs_h)
    out = km.DualOutput(D)([inputs_e, masked])
    model = keras.Model([inputs_e, inputs_h], keras.layers.LSTM(4)(out))
    padded = h.copy()
    padded[:, 3:] = 0.0
    # The LSTM after it sees the mask: the result is its state after step 3.
    np.testing.assert_allclose(to_numpy(model([e, padded])), to_numpy(model([e[:, :3], h[:, :3]])), atol=1e-6)


def test_config_saving_mixed_precision(tmp_path):
    layer = km.DualOutput(D, activation="tanh", dropout=0.1, output_dropout=0.2, seed=3)
    testing.assert_config_round_trip(layer)
    ie, ih = keras.Input((T, E)), keras.Input((T, N))
    model = keras.Model([ie, ih], km.DualOutput(D)([ie, ih]))
    path = tmp_path / "d.keras"
    model.save(path)
    np.testing.assert_allclose(to_numpy(keras.saving.load_model(path)(_inputs())), to_numpy(model(_inputs())), atol=1e-6)
    out = km.DualOutput(D, dtype="mixed_bfloat16")(_inputs())
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"


@pytest.mark.parametrize(
    "kwargs, name",
    [({"units": 0}, "units"), ({"dropout": 1.0}, "dropout"), ({"output_dropout": -1}, "output_dropout")],
)
def test_bad_arguments(kwargs, name):
    args = {"units": D}
    args.update(kwargs)
    with pytest.raises(ValueError, match=f"Expected `{name}`.*Received"):
        km.DualOutput(**args)


def test_bad_inputs():
    e, h = _inputs()
    with pytest.raises(ValueError, match="list of two tensors"):
        km.DualOutput(D)(e)
    with pytest.raises(ValueError, match="agree in all but the last"):
        km.DualOutput(D)([e, h[:, :2]])
    with pytest.raises(ValueError, match="both of shape"):
        km.DualOutput(D)([e, h[:, 0]])

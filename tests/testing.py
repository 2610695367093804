"""Shared test helpers: layer checks (a small `run_layer_test`) and callbacks."""

import numpy as np
import keras


def assert_config_round_trip(layer):
    """from_config(get_config()) rebuilds an equivalent layer."""
    config = layer.get_config()
    revived = layer.__class__.from_config(config)
    assert revived.get_config() == config
    assert set(dir(revived)) == set(dir(layer.__class__.from_config(config)))
    fresh = layer.__class__.from_config(config)
    assert set(dir(fresh)) == set(dir(revived))
    return revived


def assert_saved_model_round_trip(model, inputs, tmp_path, atol=1e-6):
    """Saves to `.keras`, loads without custom_objects, compares outputs."""
    path = str(tmp_path / "model.keras")
    expected = keras.ops.convert_to_numpy(model(inputs))
    model.save(path)
    loaded = keras.saving.load_model(path)
    actual = keras.ops.convert_to_numpy(loaded(inputs))
    np.testing.assert_allclose(actual, expected, atol=atol)
    assert len(loaded.weights) == len(model.weights)
    return loaded


def sequence_model(layer, input_shape, output_units=None):
    """A small functional model around a full-sequence layer."""
    inputs = keras.Input(shape=input_shape)
    outputs = layer(inputs)
    if output_units is not None:
        outputs = keras.layers.Dense(output_units)(outputs)
    return keras.Model(inputs, outputs)


def assert_fits(layer, x, y, jit_compile=True):
    """One short `fit` with XLA: finite loss, weights move."""
    model = sequence_model(layer, x.shape[1:], y.shape[-1])
    model.compile(optimizer="adam", loss="mse", jit_compile=jit_compile)
    before = [w.copy() for w in model.get_weights()]
    history = model.fit(x, y, epochs=2, batch_size=len(x), verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses))
    after = model.get_weights()
    assert any(not np.allclose(a, b) for a, b in zip(after, before))
    return losses


class RecordWeights(keras.callbacks.Callback):
    """Keeps a NumPy copy of the trainable weights after every batch."""

    def __init__(self):
        super().__init__()
        self.weights = []

    def on_train_batch_end(self, batch, logs=None):
        self.weights.append(
            [keras.ops.convert_to_numpy(v) for v in self.model.trainable_variables]
        )


class CaptureVariables(keras.callbacks.Callback):
    """Copies `variables` after every test batch (a dynamic-evaluation segment)."""

    def __init__(self, variables):
        super().__init__()
        self.variables = variables
        self.after_segment = []

    def on_test_batch_end(self, batch, logs=None):
        self.after_segment.append(
            [keras.ops.convert_to_numpy(v).copy() for v in self.variables]
        )

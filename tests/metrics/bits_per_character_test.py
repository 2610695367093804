import keras
import numpy as np
import pytest

from keras_mogrifier.metrics import BitsPerCharacter


def test_uniform_model_has_log2_vocab_bits():
    metric = BitsPerCharacter()
    metric.update_state(np.zeros((2, 3), "int32"), np.zeros((2, 3, 8), "float32"))
    metric.update_state(np.ones((1, 5), "int32"), np.zeros((1, 5, 8), "float32"))
    assert float(metric.result()) == pytest.approx(3.0, rel=1e-6)


def test_bits_are_nats_over_ln2_with_weights():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 4, 6)).astype("float32")
    ids = rng.integers(0, 6, size=(3, 4))
    weights = rng.random((3, 4)).astype("float32")
    log_softmax = logits - np.log(
        np.exp(logits.astype(np.float64)).sum(-1, keepdims=True)
    )
    nll = -np.take_along_axis(log_softmax, ids[..., None], -1)[..., 0]
    metric = BitsPerCharacter()
    metric.update_state(ids, logits, sample_weight=weights)
    expected = (nll * weights).sum() / weights.sum() / np.log(2.0)
    assert float(metric.result()) == pytest.approx(expected, rel=1e-5)


def test_name_and_serialization():
    metric = BitsPerCharacter()
    assert metric.name == "bpc"
    serialized = keras.saving.serialize_keras_object(metric)
    assert serialized["registered_name"] == "keras_mogrifier>BitsPerCharacter"
    assert isinstance(
        keras.saving.deserialize_keras_object(serialized), BitsPerCharacter
    )

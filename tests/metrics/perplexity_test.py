import keras
import numpy as np
import pytest
from keras import layers

from keras_mogrifier.data import StreamDataset
from keras_mogrifier.metrics import BitsPerCharacter
from keras_mogrifier.metrics import Perplexity

import reference

np_token_nll = reference.token_nll


def _batches(rng, samples=None):
    """Batches of different shapes, with weights, like a real evaluation."""
    out = []
    for batch, time in ((3, 5), (2, 7), (4, 1)):
        shape = (batch, samples, time, 9) if samples else (batch, time, 9)
        logits = rng.normal(scale=3.0, size=shape).astype("float32")
        ids = rng.integers(0, 9, size=(batch, time))
        weights = rng.integers(0, 3, size=(batch, time)).astype("float32")
        out.append((ids, logits, weights))
    return out


@pytest.mark.parametrize("samples", [None, 1, 4])
def test_accumulates_total_nats_over_total_tokens(samples):
    batches = _batches(np.random.default_rng(0), samples)
    perplexity, bpc = Perplexity(), BitsPerCharacter()
    nats = tokens = 0.0
    for ids, logits, weights in batches:
        perplexity.update_state(ids, logits, sample_weight=weights)
        bpc.update_state(ids, logits, sample_weight=weights)
        nats += (np_token_nll(ids, logits) * weights).sum()
        tokens += weights.sum()
    assert float(perplexity.result()) == pytest.approx(np.exp(nats / tokens), rel=1e-5)
    assert float(bpc.result()) == pytest.approx(nats / tokens / np.log(2), rel=1e-5)


def test_is_token_weighted_not_batch_weighted():
    rng = np.random.default_rng(1)
    metric = Perplexity()
    nats, tokens = [], 0
    for time in (1, 20):
        logits = rng.normal(size=(2, time, 6)).astype("float32")
        ids = rng.integers(0, 6, size=(2, time))
        metric.update_state(ids, logits)
        nats.append(np_token_nll(ids, logits).sum())
        tokens += 2 * time
    assert float(metric.result()) == pytest.approx(np.exp(sum(nats) / tokens), rel=1e-5)


def test_per_sequence_weights_and_reset():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(3, 4, 5)).astype("float32")
    ids = rng.integers(0, 5, size=(3, 4))
    weights = np.array([1.0, 0.0, 2.0], "float32")
    metric = Perplexity()
    metric.update_state(ids, logits, sample_weight=weights)
    nll = np_token_nll(ids, logits)
    expected = (nll * weights[:, None]).sum() / (weights.sum() * 4)
    assert float(metric.result()) == pytest.approx(np.exp(expected), rel=1e-5)
    metric.reset_state()
    with pytest.warns(RuntimeWarning, match="`perplexity` over zero tokens"):
        assert np.isnan(float(metric.result()))  # no tokens: no score, not a perfect one
    metric.update_state(ids[:1], logits[:1])
    assert float(metric.result()) == pytest.approx(np.exp(nll[0].mean()), rel=1e-5)


def test_extreme_logits_are_finite_and_zero_weight_tokens_are_ignored():
    logits = np.array([[[1e4, -1e4, 0.0], [-1e4, 1e4, -1e4]]], "float32")
    ids = np.array([[0, 0]])
    metric = BitsPerCharacter()
    metric.update_state(ids, logits, sample_weight=np.array([[1.0, 0.0]]))
    assert float(metric.result()) == pytest.approx(0.0, abs=1e-6)
    metric.update_state(ids, logits)
    assert np.isfinite(float(metric.result()))
    assert float(metric.result()) == pytest.approx(2e4 / 3 / np.log(2), rel=1e-5)


@pytest.mark.parametrize("metric_class", [Perplexity, BitsPerCharacter])
def test_zero_tokens_say_so_and_negative_weights_are_refused(metric_class):
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(2, 3, 5)).astype("float32")
    ids = rng.integers(0, 5, size=(2, 3))
    metric = metric_class()
    metric.update_state(ids, logits, sample_weight=np.zeros((2, 3), "float32"))
    with pytest.warns(RuntimeWarning, match="over zero tokens: nothing was seen .* every token "
                      "had weight 0"):
        assert np.isnan(float(metric.result()))
    metric.update_state(ids, logits, sample_weight=np.ones(2, "float32"))
    before = [float(v) for v in (metric.total_nats, metric.total_tokens)]
    for weights in (np.array([1.0, -1.0], "float32"), np.array([[1.0, np.nan, 1.0]] * 2)):
        with pytest.raises(ValueError, match="Expected `sample_weight` to be finite and "
                           "non-negative"):
            metric.update_state(ids, logits, sample_weight=weights)
    # Nothing was accumulated by the refused updates.
    assert [float(v) for v in (metric.total_nats, metric.total_tokens)] == before


def test_bad_ids_raise():
    with pytest.raises(ValueError, match="vocab=4"):
        Perplexity().update_state(np.array([[4]]), np.zeros((1, 1, 4)))


def test_config_and_registration():
    metric = Perplexity()
    assert metric.name == "perplexity"
    config = metric.get_config()
    assert Perplexity.from_config(config).get_config() == config
    serialized = keras.saving.serialize_keras_object(Perplexity(name="m"))
    assert serialized["registered_name"] == "keras_mogrifier>Perplexity"
    assert keras.saving.deserialize_keras_object(serialized).name == "m"


def test_fit_and_evaluate_logs_and_exact_values():
    keras.utils.set_random_seed(0)
    vocab, batch, time = 11, 4, 5
    ids = np.random.default_rng(0).integers(0, vocab, size=300)
    train = StreamDataset(ids, batch, time)
    # 8 targets per stream: a full window and one padded with 2 zero weights.
    valid = StreamDataset(ids[:36], batch, time, drop_remainder=False)
    inputs = keras.Input((None,), dtype="int32")
    logits = layers.Dense(vocab)(layers.Embedding(vocab, 8)(inputs))
    model = keras.Model(inputs, logits)
    model.compile(
        optimizer=keras.optimizers.Adam(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        # Keras gives sample weights to `weighted_metrics` only.
        weighted_metrics=[Perplexity(), BitsPerCharacter()],
        metrics=[Perplexity(name="unweighted_perplexity")],
    )
    history = model.fit(
        train, validation_data=valid, epochs=2, shuffle=False, verbose=0
    )
    for key in ("perplexity", "bpc", "val_perplexity", "val_bpc"):
        assert key in history.history
    results = model.evaluate(valid, verbose=0, return_dict=True)
    nats = tokens = all_nats = 0.0
    for k in range(len(valid)):
        x, y, w = valid[k]
        nll = np_token_nll(y, model.predict_on_batch(x))
        nats += (nll * w).sum()
        tokens += w.sum()
        all_nats += nll.sum()
    assert tokens == valid.num_tokens == 4 * 8
    assert results["perplexity"] == pytest.approx(np.exp(nats / tokens), rel=1e-5)
    assert results["bpc"] == pytest.approx(nats / tokens / np.log(2), rel=1e-5)
    assert history.history["val_perplexity"][-1] == pytest.approx(
        results["perplexity"], rel=1e-5
    )
    # `metrics=` sees the padding too: that is why the weighted form is used.
    unweighted = np.exp(all_nats / (4 * 10))
    assert results["unweighted_perplexity"] == pytest.approx(unweighted, rel=1e-5)
    assert abs(unweighted / results["perplexity"] - 1) > 1e-2

"""DynamicEvaluator on the package's LanguageModel (capacity-state protocol)."""

import keras
import numpy as np
from testing import to_numpy

from keras_mogrifier.evaluation import DynamicEvaluator
from keras_mogrifier.models import LanguageModel

VOCAB = 13


def small_model(**options):
    keras.utils.set_random_seed(0)
    model = LanguageModel(
        vocabulary_size=VOCAB, units=8, num_layers=2, cell="mogrifier_lstm",
        mogrifier_rounds=2, batch_size=4, **options,
    )
    model(np.zeros((4, 3), "int32"))
    return model


def test_language_model_statistics_at_batch_4_evaluation_at_batch_1():
    model = small_model()
    rng = np.random.default_rng(0)
    for v in model.recurrent_state_variables:
        v.assign(rng.normal(size=v.shape).astype("float32"))
    states = [to_numpy(v).copy() for v in model.recurrent_state_variables]
    weights = [to_numpy(v).copy() for v in model.variables]

    ev = DynamicEvaluator(model, learning_rate=0.0, decay_rate=0.1)
    ev.collect_gradient_statistics(rng.integers(0, VOCAB, 200), batch_size=4, steps=5)
    assert set(ev.gradient_statistics) == {v.path for v in model.trainable_variables}
    stream = rng.integers(0, VOCAB, 18)
    result = ev.evaluate(stream, verbose=0, return_token_losses=True)

    for v, s in zip(model.recurrent_state_variables, states):
        np.testing.assert_array_equal(to_numpy(v), s)
    for v, w in zip(model.variables, weights):
        np.testing.assert_array_equal(to_numpy(v), w)

    model.reset_states()
    logits = to_numpy(model(stream[None, :-1])).astype("float64")[0]
    logits -= logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = -log_probs[np.arange(17), stream[1:]]
    np.testing.assert_allclose(result["token_losses"][0], expected, rtol=1e-5, atol=1e-6)
    # The vocabulary size comes from the model.
    assert ev._vocabulary_limit(model) == VOCAB


def test_language_model_sparse_adapts_only_its_adaptation_matrix():
    model = small_model(adaptation_units=4)
    ev = DynamicEvaluator(model, sparse=True, learning_rate=1e-2, decay_rate=0.01)
    (kernel,) = ev.adapted_variables()
    assert kernel.shape == (4, 4)
    rng = np.random.default_rng(1)
    ev.collect_gradient_statistics(rng.integers(0, VOCAB, 200), batch_size=4, steps=5)
    others = [to_numpy(v).copy() for v in model.variables if v is not kernel]
    text = np.tile(rng.integers(0, VOCAB, 6), 8)
    static = ev.evaluate(text, adapt=False, verbose=0)
    dynamic = ev.evaluate(text, verbose=0)
    assert dynamic["loss"] < static["loss"]
    np.testing.assert_array_equal(to_numpy(kernel), np.zeros((4, 4)))
    for v, w in zip([v for v in model.variables if v is not kernel], others):
        np.testing.assert_array_equal(to_numpy(v), w)

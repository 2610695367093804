"""Dynamic evaluation cannot blow up: no unbounded step, and a divergence guard."""

import itertools

import keras
import numpy as np
import pytest

from keras_mogrifier import DivergenceError
from keras_mogrifier.data import StreamDataset
from keras_mogrifier.evaluation import DynamicEvaluator
from keras_mogrifier.models import LanguageModel
from keras_mogrifier.tuning import DYNAMIC_EVALUATION_SEARCH_SPACE

import testing
from testing import to_numpy

VOCAB = 60


def numpy_losses_and_grads(model, x, y):
    def fn():
        logits = keras.ops.cast(model(x), "float32")
        losses = keras.ops.sparse_categorical_crossentropy(y, logits, from_logits=True)
        return keras.ops.mean(losses), losses

    (_, losses), grads = testing.value_and_gradients(
        fn, model.trainable_variables, model=model, has_aux=True
    )
    return losses, [g.astype("float64") for g in grads]


def small_lm(batch=1, seed=0):
    model = LanguageModel(VOCAB, units=8, num_layers=1, cell="lstm", batch_size=batch)
    model.build((batch, None))
    rng = np.random.default_rng(seed)
    for v in model.trainable_variables:
        v.assign(rng.uniform(-0.3, 0.3, v.shape).astype("float32"))
    return model


def test_elements_without_statistics_take_their_tensors_mean_rms():
    """One segment by hand: zero-statistics elements use the tensor's mean RMS.

    Everywhere else (and in the normaliser) the rule is SPEC §5's, unchanged.
    """
    model = small_lm()
    variables = model.trainable_variables
    rng = np.random.default_rng(2)
    statistics = {}
    for v in variables:
        ms = (10.0 ** rng.uniform(-3, -1, size=v.shape)) ** 2
        if v.path.endswith("embeddings"):
            ms[VOCAB // 2 :] = 0.0  # the second half of the words: never seen
        statistics[v.path] = ms
    lr, lam, eps = 1e-2, 0.3, 1e-3
    evaluator = DynamicEvaluator(
        model, learning_rate=lr, decay_rate=lam, epsilon=eps, segment_length=4,
        normalizer="global_mean",
    )
    evaluator.gradient_statistics = statistics
    stream = np.array([VOCAB - 1, VOCAB - 2, 1, VOCAB - 3, 2], "int32")  # unseen words
    capture = testing.CaptureVariables(variables)
    evaluator.evaluate(stream, verbose=0, callbacks=[capture])

    model.reset_states()
    theta = [to_numpy(v).astype("float64") for v in variables]
    _, grads = numpy_losses_and_grads(model, stream[None, :-1], stream[None, 1:])
    raw = [np.sqrt(statistics[v.path]) for v in variables]
    normaliser = sum(r.sum() for r in raw) / sum(r.size for r in raw)
    for v, t, g, r, after in zip(variables, theta, grads, raw, capture.after_segment[0]):
        filled = np.where(r > 0, r, r[r > 0].mean())
        decay = np.minimum(1.0, lam * filled / normaliser)
        expected = t - lr * g / (filled + eps)  # θ = θ_g: no decay term yet
        np.testing.assert_allclose(after, expected, rtol=1e-4, atol=1e-7, err_msg=v.path)
        if v.path.endswith("embeddings"):
            # The unseen rows moved by a bounded step, not by η·g/ε.
            unbounded = t - lr * g / eps
            moved = np.abs(after - t)[VOCAB // 2 :].max()
            assert 0 < moved < 0.05 * np.abs(unbounded - t)[VOCAB // 2 :].max()
            assert np.all(decay[VOCAB // 2 :] > 0)


@pytest.fixture(scope="module")
def trained_on_half_the_vocabulary():
    """A small LM trained on text of the first half of the vocabulary only."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    train = np.tile(rng.integers(0, VOCAB // 2, 60), 40)
    model = LanguageModel(VOCAB, units=16, num_layers=1, cell="lstm", batch_size=4)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
    model.fit(StreamDataset(train, 4, 20), epochs=4, verbose=0)
    return model.with_options(batch_size=1), train


SPACE = DYNAMIC_EVALUATION_SEARCH_SPACE
CORNERS = [
    dict(learning_rate=lr, decay_rate=lam, epsilon=eps, segment_length=n)
    for lr, lam, eps, n in itertools.product(
        (SPACE["learning_rate"]["min"], SPACE["learning_rate"]["max"]),
        (SPACE["decay_rate"]["min"], SPACE["decay_rate"]["max"]),
        (SPACE["epsilon"]["min"], SPACE["epsilon"]["max"]),
        (SPACE["segment_length"]["min"], SPACE["segment_length"]["max"]),
    )
]


@pytest.mark.compiled  # faster compiled than op by op (tests/conftest.py)
def test_a_stream_of_words_missing_from_the_statistics_stays_finite(
    trained_on_half_the_vocabulary,
):
    """Krause's defaults and every corner of the default search space: on a
    stream of words that had no statistics, adaptation stays within a small
    margin of static evaluation (an unbounded step η·g/ε on their embedding
    rows would blow the loss up, or diverge)."""
    model, train = trained_on_half_the_vocabulary
    rng = np.random.default_rng(3)
    unseen = rng.integers(VOCAB // 2, VOCAB, 120)  # only words absent from train
    evaluator = DynamicEvaluator(model)
    static = evaluator.evaluate(unseen, verbose=0, adapt=False)["loss"]
    worst = -np.inf
    # The statistics depend on the segment length only: collected once each.
    statistics = {}
    for settings in [dict(learning_rate=5e-5, decay_rate=2e-3, epsilon=2e-5, segment_length=5)] + CORNERS:
        for name, value in settings.items():
            setattr(evaluator, name, value)
        n = settings["segment_length"]
        if n not in statistics:
            evaluator.collect_gradient_statistics(train[:1000], batch_size=1)
            statistics[n] = evaluator.gradient_statistics
        evaluator.gradient_statistics = statistics[n]
        result = evaluator.evaluate(unseen, verbose=0)  # raises DivergenceError if not
        assert np.isfinite(result["loss"]), settings
        worst = max(worst, result["loss"] - static)
    assert worst < 1.0, worst


def test_adaptation_still_helps_on_repeated_text(trained_on_half_the_vocabulary):
    model, train = trained_on_half_the_vocabulary
    passage = np.random.default_rng(4).integers(0, VOCAB, 10)  # seen and unseen words
    text = np.tile(passage, 25)
    evaluator = DynamicEvaluator(model, learning_rate=1e-2, decay_rate=1e-3, epsilon=1e-3)
    evaluator.collect_gradient_statistics(train[:1000], batch_size=1)
    static = evaluator.evaluate(text, verbose=0, adapt=False)
    dynamic = evaluator.evaluate(text, verbose=0)
    assert dynamic["loss"] < 0.7 * static["loss"]


def test_divergence_stops_at_the_first_non_finite_segment_and_restores(
    trained_on_half_the_vocabulary,
):
    model, train = trained_on_half_the_vocabulary
    weights = [to_numpy(v).copy() for v in model.weights]
    # η/ε so large that the first update overflows float32.
    evaluator = DynamicEvaluator(model, learning_rate=1e37, epsilon=1e-8, segment_length=5)
    evaluator.collect_gradient_statistics(train[:1000], batch_size=1)
    stream = np.random.default_rng(5).integers(0, VOCAB, 400)
    record = testing.CaptureVariables([])
    with pytest.raises(DivergenceError, match="diverged at token") as raised:
        evaluator.evaluate(stream, verbose=0, callbacks=[record])
    error = raised.value
    assert error.stream == 0 and error.settings["learning_rate"] == 1e37
    assert error.segment >= 1 and 5 * error.segment < error.token <= 5 * error.segment + 5
    assert error.tokens_scored == 5 * error.segment
    assert not np.isfinite(error.loss) or error.loss > 709.78
    # Stopped there: far fewer segments than the stream has.
    assert len(record.after_segment) == error.segment < 79
    for v, w in zip(model.weights, weights):
        np.testing.assert_array_equal(to_numpy(v), w)
    # Without the guard the pass runs to the end and reports a non-finite loss.
    result = evaluator.evaluate(stream, verbose=0, stop_on_divergence=False)
    assert not np.isfinite(result["loss"])

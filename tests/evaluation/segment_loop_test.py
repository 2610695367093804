"""Many segments per compiled call: the same numbers as one per call.

Dynamic evaluation, static scoring and the neural cache score `K` segments
per call of one compiled loop (`keras_mogrifier.backend.model_loop`,
`model_adaptation_loop`) when no callback needs to see the model after each
segment, and one segment per call when one does. These tests compare the
two paths with each other and with the independent references of
`dynamic_evaluator_test.py` (eager gradients, float64 NumPy updates) and
`neural_cache_test.py` (eq. 3 in NumPy), with the number of segments per
call set so that a stream takes several calls and the last one is short.
"""

import keras
import numpy as np
import pytest

from keras_mogrifier import NeuralCache
from keras_mogrifier.backend import get_backend_module
from keras_mogrifier.evaluation import DynamicEvaluator
from keras_mogrifier.evaluation import _stream_scoring
from keras_mogrifier.evaluation import dynamic_evaluator
from keras_mogrifier.evaluation import neural_cache

from dynamic_evaluator_test import VOCAB
from dynamic_evaluator_test import assert_same
from dynamic_evaluator_test import lstm_model
from dynamic_evaluator_test import random_statistics
from dynamic_evaluator_test import reference_dynamic_evaluation
from dynamic_evaluator_test import set_random_state
from dynamic_evaluator_test import state_values
from dynamic_evaluator_test import static_one_pass
from dynamic_evaluator_test import weight_values
from neural_cache_test import model_for
from neural_cache_test import numpy_cache_losses
from testing import to_numpy


@pytest.fixture
def per_call(monkeypatch):
    """Sets the segments per call of every test-time method to `k`."""

    def set_to(k):
        for module in (_stream_scoring, dynamic_evaluator, neural_cache):
            monkeypatch.setattr(module, "SEGMENTS_PER_CALL", k)

    return set_to


class CountCalls:
    """Wraps the evaluator's compiled functions and counts their calls."""

    def __init__(self, evaluator):
        self.calls = {}
        original = evaluator._step

        def step(kind, *args, **kwargs):
            built = original(kind, *args, **kwargs)

            def counted(*a, **k):
                self.calls[kind] = self.calls.get(kind, 0) + 1
                return built(*a, **k)

            return counted

        evaluator._step = step


@pytest.mark.parametrize("rule", ["sgd", "rms_global_prior", "rms_rms_prior"])
def test_many_segments_per_call_match_the_reference_and_one_per_call(rule, per_call):
    model = lstm_model()
    set_random_state(model)
    stream = np.random.default_rng(21).integers(0, VOCAB, 33)  # 32 predicted: 6 × 5 + 2
    lr = 0.05 if rule == "sgd" else 1e-4
    ev = DynamicEvaluator(
        model, learning_rate=lr, decay_rate=0.3, epsilon=1e-3, segment_length=5,
        update_rule=rule,
    )
    if rule == "sgd":
        statistics = {v.path: np.ones(v.shape) for v in model.trainable_variables}
    else:
        ev.gradient_statistics = statistics = random_statistics(model.trainable_variables)
    weights, states = weight_values(model), state_values(model)
    per_call(3)  # 7 segments: calls of 3, 3 and 1
    counter = CountCalls(ev)
    chunked = ev.evaluate(stream, verbose=0, return_token_losses=True)
    assert counter.calls == {"adaptation_loop": 3}
    assert_same(weight_values(model), weights)
    assert_same(state_values(model), states)
    one_each = ev.evaluate(
        stream, verbose=0, return_token_losses=True, callbacks=[keras.callbacks.Callback()]
    )
    assert counter.calls == {"adaptation_loop": 3 + 7}
    np.testing.assert_allclose(
        chunked["token_losses"], one_each["token_losses"], rtol=1e-6, atol=1e-7
    )
    expected, _, _ = reference_dynamic_evaluation(
        model, stream, 5, statistics, lr, 0.3, 1e-3, "tensor_mean", rule=rule
    )
    np.testing.assert_allclose(chunked["token_losses"][0], expected, rtol=1e-5)
    # The adaptation matters: the static losses are elsewhere.
    static = ev.evaluate(stream, verbose=0, adapt=False, return_token_losses=True)
    assert not np.allclose(static["token_losses"][0][10:], expected[10:], rtol=1e-4)


def test_static_scoring_in_calls_of_several_segments_is_one_pass(per_call):
    model = lstm_model()
    stream = np.random.default_rng(22).integers(0, VOCAB, 24)  # 23 predicted
    ev = DynamicEvaluator(model, segment_length=4)
    per_call(2)  # 6 segments: calls of 2
    counter = CountCalls(ev)
    result = ev.evaluate(stream, adapt=False, verbose=0, return_token_losses=True)
    assert counter.calls == {"forward_loop": 3}
    np.testing.assert_allclose(
        result["token_losses"][0], static_one_pass(model, stream), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("decay_rate", [0.0, 0.3])
def test_zero_learning_rate_is_static_in_calls_of_several_segments(
    decay_rate, per_call
):
    model = lstm_model()
    stream = np.random.default_rng(23).integers(0, VOCAB, 30)
    ev = DynamicEvaluator(model, learning_rate=0.0, decay_rate=decay_rate, segment_length=3)
    ev.gradient_statistics = random_statistics(model.trainable_variables)
    per_call(4)  # 10 segments: calls of 4, 4 and 2
    dynamic = ev.evaluate(stream, verbose=0, return_token_losses=True)
    static = ev.evaluate(stream, verbose=0, adapt=False, return_token_losses=True)
    # Different compiled programmes: XLA may round them apart by an ulp.
    np.testing.assert_allclose(
        dynamic["token_losses"], static["token_losses"], rtol=1e-6, atol=0
    )


def test_streams_in_calls_of_several_segments_each_start_from_the_trained_weights(per_call):
    model = lstm_model()
    rng = np.random.default_rng(24)
    streams = rng.integers(0, VOCAB, (2, 21))
    ev = DynamicEvaluator(model, learning_rate=3e-4, decay_rate=0.1)
    ev.gradient_statistics = statistics = random_statistics(model.trainable_variables)
    per_call(3)  # 4 segments per stream: calls of 3 and 1
    result = ev.evaluate(streams, verbose=0, return_token_losses=True)
    for row in range(2):
        expected, _, _ = reference_dynamic_evaluation(
            model, streams[row], 5, statistics, 3e-4, 0.1, 2e-5, "tensor_mean"
        )
        np.testing.assert_allclose(result["token_losses"][row], expected, rtol=1e-5)


def test_adapt_to_in_calls_of_several_segments_holds_the_adapted_weights(per_call):
    model = lstm_model()
    document = np.random.default_rng(25).integers(0, VOCAB, 27)
    ev = DynamicEvaluator(model, learning_rate=1e-3, decay_rate=0.05)
    ev.gradient_statistics = statistics = random_statistics(model.trainable_variables)
    trained = weight_values(model)
    per_call(2)  # 6 segments: calls of 2
    with ev.adapt_to(document) as adapted:
        inside = [to_numpy(v).copy() for v in adapted.trainable_variables]
    _, expected_weights, _ = reference_dynamic_evaluation(
        model, document, 5, statistics, 1e-3, 0.05, 2e-5, "tensor_mean"
    )
    for actual, expected in zip(inside, expected_weights[-1]):
        np.testing.assert_allclose(actual, expected, rtol=2e-5, atol=2e-6)
    assert not np.allclose(inside[1], to_numpy(model.trainable_variables[1]))
    assert_same(weight_values(model), trained)


class NanAt(keras.layers.Layer):
    """Turns the embedding of token `bad` into NaN: a segment that diverges."""

    def __init__(self, bad, **kwargs):
        super().__init__(**kwargs)
        self.bad = bad

    def call(self, inputs):
        ids, embedded = inputs
        hit = keras.ops.expand_dims(keras.ops.equal(ids, self.bad), -1)
        return keras.ops.where(hit, keras.ops.full_like(embedded, np.nan), embedded)


def test_divergence_in_a_call_of_several_segments_names_the_first_bad_segment(per_call):
    from keras_mogrifier.evaluation import DivergenceError

    ids = keras.Input(batch_shape=(1, None), dtype="int32")
    embedded = keras.layers.Embedding(VOCAB, 5)(ids)
    hidden = keras.layers.LSTM(6, stateful=True, return_sequences=True)(
        NanAt(VOCAB - 1)([ids, embedded])
    )
    model = keras.Model(ids, keras.layers.Dense(VOCAB)(hidden))
    stream = np.random.default_rng(26).integers(0, VOCAB - 1, 31)
    stream[17] = VOCAB - 1  # read as input at segment 3 (tokens 16-20)
    weights = weight_values(model)
    ev = DynamicEvaluator(model, learning_rate=1e-3, decay_rate=0.0, update_rule="sgd")
    per_call(6)
    with pytest.raises(DivergenceError) as chunked:
        ev.evaluate(stream, verbose=0)
    assert_same(weight_values(model), weights)
    with pytest.raises(DivergenceError) as one_each:
        ev.evaluate(stream, verbose=0, callbacks=[keras.callbacks.Callback()])
    assert str(chunked.value) == str(one_each.value)
    assert "segment 3" in str(chunked.value)


@pytest.mark.parametrize("cell", ["lstm", "mogrifier_rlstm"])
def test_neural_cache_in_calls_of_several_segments_matches_numpy_eq_3(cell, per_call):
    model = model_for(cell)
    stream = np.tile(np.random.default_rng(27).integers(0, V_CACHE, 7), 5)[:31]
    cache = NeuralCache(model, cache_size=9, interpolation=0.3, flatness=0.7, segment_length=4)
    per_call(3)  # 8 segments: calls of 3, 3 and 2
    result = cache.evaluate(stream, verbose=0, return_token_losses=True)
    expected = numpy_cache_losses(model, stream, 9, 0.3, 0.7)
    np.testing.assert_allclose(result["token_losses"][0], expected, rtol=1e-4, atol=1e-5)
    one_each = cache.evaluate(
        stream, verbose=0, return_token_losses=True, callbacks=[keras.callbacks.Callback()]
    )
    np.testing.assert_allclose(
        result["token_losses"], one_each["token_losses"], rtol=1e-6, atol=1e-6
    )
    search = cache.search(stream, interpolations=[0.3], flatnesses=[0.7], apply=False)
    np.testing.assert_allclose(search["loss"], expected.mean(), rtol=1e-5)


V_CACHE = 17  # neural_cache_test's vocabulary


# === The seam's loops ===


class Accumulator(keras.Model):
    """A linear map that adds each output to a state variable."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2, use_bias=False)

    def build(self, input_shape):
        self.dense.build(input_shape)
        self.total = self.add_weight(shape=(2,), initializer="zeros", trainable=False)

    def call(self, x):
        out = self.dense(x)
        self.total.assign(self.total + out[0])
        return out


def test_model_loop_carries_the_models_state_and_the_carry():
    """Each iteration sees what the previous one assigned and returned."""
    seam = get_backend_module()
    model = Accumulator()
    model.build((1, 2))
    model.dense.kernel.assign(2 * np.eye(2, dtype="float32"))

    def fn(carry, constants, x):
        model(x[None])
        return carry + constants, keras.ops.copy(model.total)

    run = seam.model_loop(model, fn, jit_compile=False)
    xs = np.arange(6, dtype="float32").reshape(3, 2)
    one = keras.ops.convert_to_tensor(1.0)
    carry, outputs = run(keras.ops.zeros(()), one, xs)
    np.testing.assert_allclose(to_numpy(carry), 3.0)
    np.testing.assert_allclose(to_numpy(outputs), 2 * np.cumsum(xs, axis=0))
    np.testing.assert_allclose(to_numpy(model.total), 2 * xs.sum(axis=0))
    # A shorter call after a longer one changes only its own steps.
    carry, outputs = run(keras.ops.zeros(()), one, xs[:1])
    np.testing.assert_allclose(to_numpy(carry), 1.0)
    np.testing.assert_allclose(to_numpy(outputs), [2 * xs.sum(axis=0) + 2 * xs[0]])
    np.testing.assert_allclose(to_numpy(model.total), 2 * xs.sum(axis=0) + 2 * xs[0])


def test_model_adaptation_loop_updates_from_each_iterations_gradient_in_order():
    seam = get_backend_module()
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
    kernel = model.layers[0].kernel
    kernel.assign(np.ones((1, 1), "float32"))

    def objective(x, y):
        error = model(x[None])[0, 0] - y
        return error * error, error

    def update(values, gradients, rate):
        return [v - rate * g for v, g in zip(values, gradients)]

    run = seam.model_adaptation_loop(model, [kernel], objective, update, jit_compile=False)
    xs = np.array([[1.0], [2.0], [0.5]], "float32")
    ys = np.array([0.0, 1.0, 2.0], "float32")
    errors = to_numpy(run((keras.ops.convert_to_tensor(0.1),), xs, ys))
    w, expected = 1.0, []
    for x, y in zip(xs[:, 0], ys):  # by hand: gradient of (w x − y)² is 2 (w x − y) x
        error = w * x - y
        expected.append(error)
        w -= 0.1 * 2 * error * x
    np.testing.assert_allclose(errors, expected, rtol=1e-6)
    np.testing.assert_allclose(to_numpy(kernel)[0, 0], w, rtol=1e-6)


@pytest.mark.parametrize("adapt", [False, True])
def test_a_new_segment_length_scores_like_a_fresh_evaluator(adapt):
    """An evaluator whose `segment_length` changes (as a tuner's trials do)
    scores the next stream as a new evaluator of that length would.

    On TensorFlow the compiled loop is traced again for the new length with
    the time axis relaxed to unknown; the package's recurrent layer then
    has to tell Keras's time loop the length (it once ran as many steps as
    the batch has rows: one per segment here).
    """
    from keras_mogrifier import LanguageModel

    def model():
        keras.utils.set_random_seed(0)
        lm = LanguageModel(VOCAB, units=6, num_layers=2, cell="rlstm", batch_size=1)
        lm(np.zeros((1, 3), "int32"))
        return lm

    stream = np.random.default_rng(7).integers(0, VOCAB, 41)
    reused_model = model()
    reused = DynamicEvaluator(reused_model, segment_length=7, learning_rate=1e-2,
                              update_rule="sgd")
    reused.evaluate(stream, adapt=adapt, verbose=0)
    reused.segment_length = 3
    got = reused.evaluate(stream, adapt=adapt, verbose=0, return_token_losses=True)
    fresh = DynamicEvaluator(model(), segment_length=3, learning_rate=1e-2, update_rule="sgd")
    expected = fresh.evaluate(stream, adapt=adapt, verbose=0, return_token_losses=True)
    np.testing.assert_allclose(got["token_losses"], expected["token_losses"], rtol=1e-5, atol=1e-6)

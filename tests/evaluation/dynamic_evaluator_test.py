"""Tests of DynamicEvaluator against independent hand computations.

The references here take eager gradients with the backend's own autodiff
(`testing.value_and_gradients`, independent of the library's backend seam)
and do NumPy arithmetic in float64, never the evaluator's compiled steps.
"""

import math

import keras
import numpy as np
import pytest

from keras_mogrifier.evaluation import DynamicEvaluator

import testing
from testing import to_numpy

VOCAB = 12


def lstm_model(batch=1, stateful=True, units=6, seed=0, unroll=False, dropout=0.0):
    """A small stateful LSTM LM with the same weights on every backend.

    With `dropout`, every kind: on the embeddings, the LSTM's input and
    state (variational), and its output.
    """
    model = keras.Sequential(
        [
            keras.Input(batch_shape=(batch, None), dtype="int32"),
            keras.layers.Embedding(VOCAB, 5),
            keras.layers.Dropout(dropout, seed=1),
            keras.layers.LSTM(
                units, stateful=stateful, return_sequences=True, unroll=unroll,
                dropout=dropout, recurrent_dropout=dropout, seed=2,
            ),
            keras.layers.Dropout(dropout, seed=3),
            keras.layers.Dense(VOCAB),
        ]
    )
    rng = np.random.default_rng(seed)
    for v in model.trainable_variables:
        v.assign(rng.uniform(-0.4, 0.4, size=v.shape).astype("float32"))
    return model


class CapacityStateModel(keras.Model):
    """Keeps its own state of a capacity batch; a batch b uses the first b rows.

    The protocol of the package's LanguageModel (`recurrent_state_variables`).
    """

    def __init__(self, capacity=4, units=6, **kwargs):
        super().__init__(**kwargs)
        self.capacity = capacity
        self.units = units
        self.embedding = keras.layers.Embedding(VOCAB, 5)
        self.rnn = keras.layers.LSTM(units, return_sequences=True, return_state=True)
        self.head = keras.layers.Dense(VOCAB)

    def build(self, input_shape):
        self.h = self.add_weight(
            shape=(self.capacity, self.units), initializer="zeros", trainable=False, name="h"
        )
        self.c = self.add_weight(
            shape=(self.capacity, self.units), initializer="zeros", trainable=False, name="c"
        )
        self.recurrent_state_variables = [self.h, self.c]

    def call(self, x, training=False):
        b = x.shape[0]
        e = self.embedding(x)
        # Copies of the rows in use (the variables are written again below).
        h0, c0 = (keras.ops.copy(keras.ops.convert_to_tensor(v)[:b]) for v in (self.h, self.c))
        out, h, c = self.rnn(e, initial_state=[h0, c0], training=training)
        for v, new in ((self.h, h), (self.c, c)):
            new = keras.ops.stop_gradient(new)
            v.assign(keras.ops.slice_update(keras.ops.convert_to_tensor(v), (0, 0), new))
        return self.head(out)


def state_values(model):
    out = []
    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.RNN) and layer.stateful:
            out += [to_numpy(v).copy() for v in layer.states]
    for v in getattr(model, "recurrent_state_variables", []):
        out.append(to_numpy(v).copy())
    return out


def set_random_state(model, seed=1):
    rng = np.random.default_rng(seed)
    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.RNN) and layer.stateful:
            for v in layer.states:
                v.assign(rng.normal(size=v.shape).astype("float32"))
    for v in getattr(model, "recurrent_state_variables", []):
        v.assign(rng.normal(size=v.shape).astype("float32"))


def reset_state(model):
    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.RNN) and layer.stateful:
            layer.reset_state()
    for v in getattr(model, "recurrent_state_variables", []):
        v.assign(np.zeros(v.shape, "float32"))


def weight_values(model):
    return [to_numpy(v).copy() for v in model.variables]


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def numpy_token_losses(logits, targets):
    logits = np.asarray(logits, "float64")
    logits = logits - logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]


def static_one_pass(model, stream):
    """Whole stream in one call from a zero state: the static reference."""
    reset_state(model)
    logits = to_numpy(model(stream[None, :-1]))
    reset_state(model)
    return numpy_token_losses(logits, stream[None, 1:])[0]


def losses_and_gradients(model, x, y, w=None, variables=None):
    """`((mean loss, token losses), gradients)` by the backend's autodiff, float64.

    The loss is the (weighted) mean sparse cross-entropy of `model(x)`; the
    model's carried state advances as in an eager call.
    """
    variables = model.trainable_variables if variables is None else variables

    def fn():
        logits = keras.ops.cast(model(x), "float32")
        losses = keras.ops.sparse_categorical_crossentropy(y, logits, from_logits=True)
        if w is None:
            return keras.ops.mean(losses), losses
        weights = keras.ops.convert_to_tensor(np.asarray(w, "float32"))
        return keras.ops.sum(losses * weights) / float(np.sum(w)), losses

    (loss, losses), grads = testing.value_and_gradients(
        fn, variables, model=model, has_aux=True
    )
    return (float(loss), losses), [g.astype("float64") for g in grads]


def random_statistics(variables, seed=3):
    """MS_g spanning four orders of magnitude of RMS, so the clip is active."""
    rng = np.random.default_rng(seed)
    return {
        v.path: (10.0 ** rng.uniform(-4, 0, size=v.shape)) ** 2 for v in variables
    }


class RaiseAt(keras.callbacks.Callback):
    def __init__(self, at, error):
        super().__init__()
        self.at = at
        self.error = error

    def on_test_batch_end(self, batch, logs=None):
        if batch == self.at:
            raise self.error


def reference_dynamic_evaluation(
    model, stream, n, statistics, lr, lam, eps, normalizer, rule="rms_rms_prior"
):
    """Krause's rules by hand: eager gradients, float64 NumPy update.

    eq. 8 `rms_rms_prior`: θ − η g/(RMS+ε) + min(1, λ RMS/mean RMS)(θ_g − θ);
    eq. 6 `rms_global_prior`: θ − η g/(RMS+ε) + λ (θ_g − θ);
    eq. 4 `sgd`: θ − η g + λ (θ_g − θ).
    """
    variables = model.trainable_variables
    theta_g = [to_numpy(v).astype("float64") for v in variables]
    rms = [np.sqrt(statistics[v.path].astype("float64")) for v in variables]
    if normalizer == "tensor_mean":
        mean_rms = np.mean([r.mean() for r in rms])
    else:
        mean_rms = np.concatenate([r.ravel() for r in rms]).mean()
    if rule == "rms_rms_prior":
        decay = [np.minimum(1.0, lam * r / mean_rms) for r in rms]
    else:
        decay = [np.full(r.shape, lam) for r in rms]
    if rule == "sgd":
        rms, eps = [np.ones(r.shape) for r in rms], 0.0  # g / (1 + 0) = g
    reset_state(model)
    x, y = stream[:-1], stream[1:]
    token_losses, weights_after = [], []
    for start in range(0, len(x), n):
        xs, ys = x[None, start : start + n], y[None, start : start + n]
        (_, losses), grads = losses_and_gradients(model, xs, ys, variables=variables)
        token_losses.append(losses[0])
        for v, g, tg, r, d in zip(variables, grads, theta_g, rms, decay):
            theta = to_numpy(v).astype("float64")
            v.assign((theta - lr * g / (r + eps) + d * (tg - theta)).astype("float32"))
        weights_after.append([to_numpy(v).copy() for v in variables])
    for v, tg in zip(variables, theta_g):
        v.assign(tg.astype("float32"))
    reset_state(model)
    return np.concatenate(token_losses), weights_after, decay


# === The update rule ===


@pytest.mark.parametrize("rule", ["sgd", "rms_global_prior", "rms_rms_prior"])
def test_each_update_rule_matches_its_equation_over_several_segments(rule):
    model = lstm_model()
    stream = np.random.default_rng(11).integers(0, VOCAB, 16)  # 15 predicted: 5, 5, 5
    lr = 0.05 if rule == "sgd" else 1e-4
    ev = DynamicEvaluator(
        model, learning_rate=lr, decay_rate=0.3, epsilon=1e-3, segment_length=5,
        update_rule=rule,
    )
    if rule == "sgd":
        statistics = {v.path: np.ones(v.shape) for v in model.trainable_variables}
    else:
        ev.gradient_statistics = statistics = random_statistics(model.trainable_variables)
    before = weight_values(model)
    capture = testing.CaptureVariables(model.trainable_variables)
    result = ev.evaluate(stream, callbacks=[capture], verbose=0, return_token_losses=True)
    assert_same(weight_values(model), before)  # trained weights restored
    expected_losses, expected_weights, _ = reference_dynamic_evaluation(
        model, stream, 5, statistics, lr, 0.3, 1e-3, "tensor_mean", rule=rule
    )
    for actual, expected in zip(capture.after_segment, expected_weights):
        for a, e in zip(actual, expected):
            np.testing.assert_allclose(a, e, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(result["token_losses"][0], expected_losses, rtol=1e-5)
    # The rules differ: the same setting under another rule moves elsewhere.
    other = "rms_rms_prior" if rule != "rms_rms_prior" else "rms_global_prior"
    _, other_weights, _ = reference_dynamic_evaluation(
        model, stream, 5, statistics, lr, 0.3, 1e-3, "tensor_mean", rule=other
    )
    assert not all(
        np.allclose(a, e, rtol=2e-5, atol=2e-6)
        for a, e in zip(capture.after_segment[-1], other_weights[-1])
    )


@pytest.mark.parametrize("rule", ["sgd", "rms_global_prior", "rms_rms_prior"])
def test_zero_learning_rate_is_static_for_every_rule(rule):
    model = lstm_model()
    stream = np.random.default_rng(12).integers(0, VOCAB, 18)
    ev = DynamicEvaluator(model, learning_rate=0.0, decay_rate=0.5, update_rule=rule)
    if rule != "sgd":
        ev.gradient_statistics = random_statistics(model.trainable_variables)
    dynamic = ev.evaluate(stream, verbose=0, return_token_losses=True)
    static = ev.evaluate(stream, verbose=0, adapt=False, return_token_losses=True)
    # Different compiled programmes (the adapting and the static loop):
    # XLA may round them apart by an ulp.
    np.testing.assert_allclose(
        dynamic["token_losses"], static["token_losses"], rtol=1e-6, atol=0
    )


def test_sgd_needs_no_statistics_and_the_rms_rules_do():
    model = lstm_model()
    stream = np.random.default_rng(13).integers(0, VOCAB, 12)
    ev = DynamicEvaluator(model, learning_rate=0.1, update_rule="sgd")
    assert np.isfinite(ev.evaluate(stream, verbose=0)["loss"])
    ev.update_rule = "rms_global_prior"
    with pytest.raises(ValueError, match="update_rule='rms_global_prior'.*collect_gradient_statistics"):
        ev.evaluate(stream, verbose=0)
    with pytest.raises(ValueError, match="update_rule"):
        DynamicEvaluator(model, update_rule="adam")


@pytest.mark.parametrize(
    "decay_rate, normalizer, dropout",
    [
        (0.0, "tensor_mean", 0.0),
        (0.5, "tensor_mean", 0.0),
        (0.5, "global_mean", 0.0),
        (0.5, "tensor_mean", 0.5),
    ],
)
def test_update_rule_matches_hand_computation(decay_rate, normalizer, dropout):
    """Krause et al. eq. 8; benkrause/dynamic-evaluation `dynamiceval.py`
    210-211 (the update) and 185 (`model.eval()` before every segment: a
    model trained with dropout is scored and adapted with dropout off; the
    reference calls the model in inference mode)."""
    model = lstm_model(dropout=dropout)
    stream = np.random.default_rng(0).integers(0, VOCAB, 15)  # 14 predicted: 5, 5, 4
    ev = DynamicEvaluator(
        model, learning_rate=1e-4, decay_rate=decay_rate, epsilon=1e-3,
        segment_length=5, normalizer=normalizer,
    )
    ev.gradient_statistics = statistics = random_statistics(model.trainable_variables)
    capture = testing.CaptureVariables(model.trainable_variables)
    result = ev.evaluate(stream, callbacks=[capture], verbose=0, return_token_losses=True)

    expected_losses, expected_weights, decay = reference_dynamic_evaluation(
        model, stream, 5, statistics, 1e-4, decay_rate, 1e-3, normalizer
    )
    if decay_rate > 0:  # the clip min(1, ·) is active on some elements only
        factors = np.concatenate([d.ravel() for d in decay])
        assert np.any(factors == 1.0) and np.any((factors > 0) & (factors < 1))
    assert len(capture.after_segment) == 3
    for actual, expected in zip(capture.after_segment, expected_weights):
        for a, e in zip(actual, expected):
            np.testing.assert_allclose(a, e, rtol=2e-5, atol=2e-6)
    # The weights moved: the test would notice a missing update.
    assert not np.allclose(expected_weights[0][1], to_numpy(model.trainable_variables[1]))
    np.testing.assert_allclose(result["token_losses"][0], expected_losses, rtol=1e-5)
    loss = expected_losses.mean()
    assert result["num_tokens"] == 14
    np.testing.assert_allclose(result["loss"], loss, rtol=1e-5)
    np.testing.assert_allclose(result["perplexity"], np.exp(loss), rtol=1e-5)
    np.testing.assert_allclose(result["bits_per_token"], loss / np.log(2), rtol=1e-5)


class Perturb(keras.callbacks.Callback):
    """Moves the weights away from θ_g once, after the first segment."""

    def __init__(self, variables, offsets):
        super().__init__()
        self.variables, self.offsets = variables, offsets

    def on_test_batch_end(self, batch, logs=None):
        if batch == 0:
            for v, offset in zip(self.variables, self.offsets):
                v.assign(to_numpy(v) + offset)


@pytest.mark.parametrize("normalizer", ["tensor_mean", "global_mean"])
def test_decay_only_pulls_back_to_trained_weights(normalizer):
    """η = 0, λ > 0: from θ = θ_g nothing moves (the result is static); moved
    away from θ_g, every element returns by its eq. 8 fraction
    min(1, λ RMS / mean(RMS)) per segment, to θ_g and nowhere else."""
    model = lstm_model()
    stream = np.random.default_rng(1).integers(0, VOCAB, 16)  # 3 segments of 5
    variables = model.trainable_variables
    statistics = random_statistics(variables)
    ev = DynamicEvaluator(model, learning_rate=0.0, decay_rate=0.9, normalizer=normalizer)
    ev.gradient_statistics = statistics
    before = [to_numpy(v).copy() for v in variables]
    capture = testing.CaptureVariables(variables)
    ev.evaluate(stream, callbacks=[capture], verbose=0)
    for after in capture.after_segment:
        assert_same(after, before)
    rng = np.random.default_rng(5)
    offsets = [rng.normal(size=v.shape).astype("float32") for v in variables]
    capture = testing.CaptureVariables(variables)
    ev.evaluate(stream, callbacks=[Perturb(variables, offsets), capture], verbose=0)
    rms = [np.sqrt(statistics[v.path]) for v in variables]
    if normalizer == "tensor_mean":
        mean_rms = np.mean([r.mean() for r in rms])
    else:
        mean_rms = sum(r.sum() for r in rms) / sum(r.size for r in rms)
    fractions = [np.minimum(1.0, 0.9 * r / mean_rms) for r in rms]
    assert any(np.any(f == 1.0) for f in fractions)
    assert any(np.any((f > 0) & (f < 1)) for f in fractions)
    deviation = offsets
    for after in capture.after_segment[1:]:  # segments 2 and 3 decay
        deviation = [d * (1.0 - f) for d, f in zip(deviation, fractions)]
        for a, theta_g, d in zip(after, before, deviation):
            np.testing.assert_allclose(a, theta_g + d, rtol=1e-5, atol=1e-6)
    assert not np.allclose(capture.after_segment[-1][0], before[0] + offsets[0])
    # Restored afterwards, as always.
    for v, b in zip(variables, before):
        np.testing.assert_array_equal(to_numpy(v), b)


@testing.backend_specific(
    "tensorflow",
    reason="jit_compile chooses between graph and XLA on TensorFlow; JAX always "
    "compiles with XLA and PyTorch runs eagerly",
)
@pytest.mark.compiled
def test_xla_step_matches_graph_step():
    # Unrolled (segments have a static length) so that XLA compiles quickly.
    model = lstm_model(unroll=True)
    stream = np.random.default_rng(2).integers(0, VOCAB, 13)
    results = []
    for jit in (False, True):
        ev = DynamicEvaluator(model, learning_rate=1e-3, decay_rate=0.1, jit_compile=jit)
        ev.gradient_statistics = random_statistics(model.trainable_variables)
        results.append(ev.evaluate(stream, verbose=0, return_token_losses=True))
    np.testing.assert_allclose(
        results[0]["token_losses"], results[1]["token_losses"], rtol=1e-5, atol=1e-6
    )


# === Gradient statistics ===


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_gradient_statistics_from_stream_match_hand_computation(dropout):
    """Krause's `dynamiceval.py` `gradstat` 99-135: the mean over training
    batches of the squared gradient of each batch's mean loss, with
    `model.eval()` (line 105: dropout off)."""
    batch, n = 3, 4
    model = lstm_model(batch=batch, dropout=dropout)
    set_random_state(model)
    state_before = state_values(model)
    stream = np.random.default_rng(4).integers(0, VOCAB, 40)
    ev = DynamicEvaluator(model, segment_length=n)
    logs = ev.collect_gradient_statistics(stream, batch_size=batch)
    assert_same(state_values(model), state_before)

    # By hand: 3 contiguous streams of 13 tokens, windows of 4 (3 of them).
    streams = stream[:39].reshape(batch, 13)
    variables = model.trainable_variables
    squares = [np.zeros(v.shape) for v in variables]
    reset_state(model)
    losses = []
    for i in range(3):
        x, y = streams[:, i * n : (i + 1) * n], streams[:, i * n + 1 : (i + 1) * n + 1]
        (loss, _), grads = losses_and_gradients(model, x, y)
        for s, g in zip(squares, grads):
            s += g**2
        losses.append(loss)
    assert logs["num_batches"] == 3
    np.testing.assert_allclose(logs["loss"], np.mean(losses), rtol=1e-5)
    statistics = ev.gradient_statistics
    for v, s in zip(variables, squares):
        np.testing.assert_allclose(statistics[v.path], s / 3, rtol=1e-4, atol=1e-12)
    # Weights untouched.
    assert all(np.all(np.isfinite(statistics[v.path])) for v in variables)


def test_gradient_statistics_from_batches_with_steps():
    model = lstm_model(batch=2, stateful=False)
    rng = np.random.default_rng(5)
    batches = [(rng.integers(0, VOCAB, (2, 6)), rng.integers(0, VOCAB, (2, 6))) for _ in range(4)]
    ev = DynamicEvaluator(model)
    weights = weight_values(model)
    logs = ev.collect_gradient_statistics(iter(batches), steps=3)
    assert logs["num_batches"] == 3
    assert_same(weight_values(model), weights)
    variables = model.trainable_variables
    squares = [np.zeros(v.shape) for v in variables]
    for x, y in batches[:3]:
        for s, g in zip(squares, losses_and_gradients(model, x, y)[1]):
            s += g**2
    for v, s in zip(variables, squares):
        np.testing.assert_allclose(ev.gradient_statistics[v.path], s / 3, rtol=1e-4, atol=1e-12)


def test_gradient_statistics_from_weighted_batches():
    """`(x, y, sample_weight)` batches: the gradient of the weighted mean loss."""
    model = lstm_model(batch=2, stateful=False)
    rng = np.random.default_rng(15)
    batches = [
        (
            rng.integers(0, VOCAB, (2, 5)),
            rng.integers(0, VOCAB, (2, 5)),
            (rng.uniform(size=(2, 5)) > 0.3).astype("float32"),
        )
        for _ in range(2)
    ]
    ev = DynamicEvaluator(model)
    ev.collect_gradient_statistics(batches)
    variables = model.trainable_variables
    squares = [np.zeros(v.shape) for v in variables]
    for x, y, w in batches:
        for s, g in zip(squares, losses_and_gradients(model, x, y, w)[1]):
            s += g**2
    for v, s in zip(variables, squares):
        np.testing.assert_allclose(ev.gradient_statistics[v.path], s / 2, rtol=1e-4, atol=1e-12)


def test_gradient_statistics_from_stream_dataset():
    from keras_mogrifier.data import StreamDataset

    model = lstm_model(batch=2)
    data = StreamDataset(np.arange(50) % VOCAB, batch_size=2, sequence_length=5,
                         drop_remainder=False)
    logs = DynamicEvaluator(model).collect_gradient_statistics(data)
    assert logs["num_batches"] == len(data)


# === Static equivalence and state ===


@pytest.mark.parametrize("decay_rate", [0.0, 0.3])
def test_zero_learning_rate_is_static_evaluation_in_one_pass(decay_rate):
    model = lstm_model()
    stream = np.random.default_rng(6).integers(0, VOCAB, 23)  # 22 predicted: 4 × 5 + 2
    ev = DynamicEvaluator(model, learning_rate=0.0, decay_rate=decay_rate)
    ev.gradient_statistics = random_statistics(model.trainable_variables)
    dynamic = ev.evaluate(stream, verbose=0, return_token_losses=True)
    static = ev.evaluate(stream, verbose=0, adapt=False, return_token_losses=True)
    # Different compiled programmes (the adapting and the static loop):
    # XLA may round them apart by an ulp.
    np.testing.assert_allclose(
        dynamic["token_losses"], static["token_losses"], rtol=1e-6, atol=0
    )
    assert dynamic["loss"] == static["loss"]
    expected = static_one_pass(model, stream)
    np.testing.assert_allclose(dynamic["token_losses"][0], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dynamic["loss"], expected.mean(), rtol=1e-6)
    assert dynamic["num_tokens"] == 22


def test_capacity_state_protocol_carries_and_restores_state():
    model = CapacityStateModel(capacity=4)
    model(np.zeros((4, 3), "int32"))
    set_random_state(model)
    before = state_values(model)
    stream = np.random.default_rng(7).integers(0, VOCAB, 17)
    ev = DynamicEvaluator(model, learning_rate=0.0)
    ev.gradient_statistics = random_statistics(model.trainable_variables)
    result = ev.evaluate(stream, verbose=0, return_token_losses=True)
    assert_same(state_values(model), before)
    np.testing.assert_allclose(
        result["token_losses"][0], static_one_pass(model, stream), rtol=1e-5, atol=1e-6
    )


def test_model_without_state_scores_each_segment_from_zero_state():
    model = lstm_model(stateful=False)
    stream = np.random.default_rng(8).integers(0, VOCAB, 11)
    ev = DynamicEvaluator(model, segment_length=4)
    result = ev.evaluate(stream, adapt=False, verbose=0, return_token_losses=True)
    expected = np.concatenate(
        [static_one_pass(model, stream[s : s + 5]) for s in (0, 4, 8)]
    )
    np.testing.assert_allclose(result["token_losses"][0], expected, rtol=1e-5, atol=1e-6)


def test_streams_are_adapted_independently_from_trained_weights():
    model = lstm_model()
    streams = np.random.default_rng(9).integers(0, VOCAB, (3, 12))
    ev = DynamicEvaluator(model, learning_rate=1e-3, decay_rate=0.05)
    ev.gradient_statistics = random_statistics(model.trainable_variables)
    together = ev.evaluate(streams, verbose=0, return_token_losses=True)
    alone = [ev.evaluate(s, verbose=0, return_token_losses=True) for s in streams]
    np.testing.assert_allclose(
        together["token_losses"], np.concatenate([a["token_losses"] for a in alone]), rtol=1e-6
    )
    assert together["num_tokens"] == 33
    np.testing.assert_allclose(together["loss"], np.mean([a["loss"] for a in alone]), rtol=1e-6)


def test_adaptation_lowers_the_loss_on_repeating_text():
    model = lstm_model(units=16)
    rng = np.random.default_rng(10)
    ev = DynamicEvaluator(model, learning_rate=3e-3, decay_rate=1e-3, segment_length=5)
    ev.collect_gradient_statistics(rng.integers(0, VOCAB, 400), batch_size=1, steps=40)
    text = np.tile(rng.integers(0, VOCAB, 9), 25)
    static = ev.evaluate(text, adapt=False, verbose=0)
    dynamic = ev.evaluate(text, verbose=0)
    assert dynamic["loss"] < 0.9 * static["loss"]


# === Restoring weights and state ===


@pytest.mark.parametrize("error", [None, RuntimeError("boom"), KeyboardInterrupt()])
def test_weights_and_state_restored(error):
    model = lstm_model()
    set_random_state(model)
    weights, states = weight_values(model), state_values(model)
    ev = DynamicEvaluator(model, learning_rate=1e-2, decay_rate=0.01)
    ev.gradient_statistics = random_statistics(model.trainable_variables)
    stream = np.random.default_rng(11).integers(0, VOCAB, 30)
    capture = testing.CaptureVariables(model.trainable_variables)
    callbacks = [capture] + ([] if error is None else [RaiseAt(2, error)])
    if error is None:
        ev.evaluate(stream, callbacks=callbacks, verbose=0)
    else:
        with pytest.raises(type(error)):
            ev.evaluate(stream, callbacks=callbacks, verbose=0)
        assert len(capture.after_segment) == 3
    # The weights did change during evaluation, and are back exactly.
    assert not np.array_equal(capture.after_segment[-1][1], weights[1])
    assert_same(weight_values(model), weights)
    assert_same(state_values(model), states)


def test_state_restored_after_interrupted_statistics():
    model = lstm_model()
    set_random_state(model)
    states = state_values(model)

    def batches():
        rng = np.random.default_rng(12)
        for _ in range(2):
            yield rng.integers(0, VOCAB, (1, 5)), rng.integers(0, VOCAB, (1, 5))
        raise KeyboardInterrupt

    ev = DynamicEvaluator(model)
    with pytest.raises(KeyboardInterrupt):
        ev.collect_gradient_statistics(batches())
    assert_same(state_values(model), states)
    assert ev.gradient_statistics is None


# === Progress, callbacks and fit ===


def test_progress_logs_running_loss(capsys):
    model = lstm_model()
    stream = np.random.default_rng(13).integers(0, VOCAB, 16)
    records = []

    class Record(keras.callbacks.Callback):
        def on_test_batch_end(self, batch, logs=None):
            records.append(dict(logs))

    ev = DynamicEvaluator(model)
    result = ev.evaluate(stream, adapt=False, verbose=1, callbacks=[Record()],
                         return_token_losses=True)
    assert len(records) == 3
    token_losses = result["token_losses"][0]
    for i, entry in enumerate(records):
        expected = token_losses[: min(5 * (i + 1), 15)].mean()
        np.testing.assert_allclose(entry["loss"], expected, rtol=1e-6)
        np.testing.assert_allclose(entry["perplexity"], math.exp(expected), rtol=1e-6)
    assert "perplexity" in capsys.readouterr().out


def test_callback_adds_keys_to_fit_logs():
    model = lstm_model(batch=None, stateful=False)
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    rng = np.random.default_rng(14)
    train = rng.integers(0, VOCAB, 200)
    valid = rng.integers(0, VOCAB, 21)
    ev = DynamicEvaluator(
        learning_rate=1e-3, validation_data=valid, gradient_data=train,
        gradient_batch_size=4,
    )
    x = train[:160].reshape(16, 10)
    history = model.fit(x[:, :-1], x[:, 1:], epochs=2, batch_size=8, verbose=0, callbacks=[ev])
    # Only the last epoch is evaluated dynamically.
    assert len(history.history["loss"]) == 2
    assert len(history.history["val_dynamic_loss"]) == 1
    assert len(history.history["val_dynamic_perplexity"]) == 1
    after = DynamicEvaluator(model, learning_rate=1e-3)
    after.collect_gradient_statistics(train, batch_size=4)
    expected = after.evaluate(valid, verbose=0)
    np.testing.assert_allclose(history.history["val_dynamic_loss"][-1], expected["loss"], rtol=1e-6)
    np.testing.assert_allclose(
        history.history["val_dynamic_perplexity"][-1], expected["perplexity"], rtol=1e-6
    )


@pytest.mark.parametrize(
    "frequency, epochs, evaluated",
    [(None, 5, [4]), (2, 5, [1, 3, 4]), (1, 3, [0, 1, 2]), (3, 3, [2])],
)
def test_callback_evaluates_at_the_last_epoch_and_every_frequency(frequency, epochs, evaluated):
    calls = []

    class Recording(DynamicEvaluator):
        def collect_gradient_statistics(self, data, steps=None, batch_size=100):
            calls.append(("statistics", data, steps, batch_size))

        def evaluate(self, x, batch_size=None, verbose=0):
            calls.append(("evaluate", x, batch_size, verbose))
            return {"loss": 2.0, "perplexity": math.exp(2.0)}

    ev = Recording(validation_data=[1, 2, 3], gradient_data="train", gradient_steps=7,
                   gradient_batch_size=9, validation_batch_size=1, frequency=frequency)
    ev.set_params({"epochs": epochs, "verbose": 0, "steps": 1})
    done = []
    for epoch in range(epochs):
        logs = {"loss": 1.0}
        ev.on_epoch_end(epoch, logs)
        if "val_dynamic_loss" in logs:
            done.append(epoch)
            assert logs["val_dynamic_perplexity"] == math.exp(2.0)
    assert done == evaluated
    assert calls[:2] == [("statistics", "train", 7, 9), ("evaluate", [1, 2, 3], 1, 0)]


def test_callback_hooks_epoch_events_only():
    for hook in ("on_train_batch_begin", "on_train_batch_end", "on_batch_end",
                 "on_test_batch_end", "on_predict_batch_end"):
        assert getattr(DynamicEvaluator, hook) is getattr(keras.callbacks.Callback, hook)


# === Bad input ===


def trained_evaluator():
    model = lstm_model()
    ev = DynamicEvaluator(model)
    ev.gradient_statistics = random_statistics(model.trainable_variables)
    return model, ev


BAD_EVALUATE = {
    "id_too_large": (dict(x=np.array([1, 2, VOCAB])), r"token ids in \[0, "),
    "negative_id": (dict(x=np.array([1, -1, 2])), r"token ids in \[0, .*an id -1"),
    "one_token": (dict(x=np.array([3])), "at least 2 tokens"),
    "float_ids": (dict(x=np.array([1.0, 2.0, 3.0])), "integer token ids"),
    "three_dims": (dict(x=np.zeros((1, 2, 3), "int32")), "1-D"),
    "batch_for_shared_weights": (dict(x=np.zeros((2, 5), "int32"), batch_size=2), "batch_size=1"),
    "bad_verbose": (dict(x=np.zeros(5, "int32"), verbose=3), "verbose"),
    "bad_callbacks": (dict(x=np.zeros(5, "int32"), callbacks="progbar"), "callbacks"),
}


@pytest.mark.parametrize("case", sorted(BAD_EVALUATE))
def test_bad_evaluate_input_raises_before_anything_changes(case):
    kwargs, message = BAD_EVALUATE[case]
    model, ev = trained_evaluator()
    set_random_state(model)
    weights, states = weight_values(model), state_values(model)
    with pytest.raises(ValueError, match=message):
        ev.evaluate(**kwargs)
    assert_same(weight_values(model), weights)
    assert_same(state_values(model), states)


def test_evaluate_before_statistics_raises():
    model = lstm_model()
    weights = weight_values(model)
    with pytest.raises(ValueError, match="collect_gradient_statistics"):
        DynamicEvaluator(model).evaluate(np.arange(6))
    assert_same(weight_values(model), weights)


def test_stateful_batch_mismatch_raises():
    model = lstm_model(batch=2)
    with pytest.raises(ValueError, match="batch size of the model's stateful"):
        DynamicEvaluator(model).evaluate(np.arange(6), adapt=False)
    with pytest.raises(ValueError, match="batch size of the model's stateful"):
        DynamicEvaluator(model).collect_gradient_statistics(np.arange(60) % VOCAB, batch_size=3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(segment_length=0), "segment_length"),
        (dict(learning_rate=-1e-3), "learning_rate"),
        (dict(decay_rate=-0.1), "decay_rate"),
        (dict(epsilon=0.0), "epsilon"),
        (dict(learning_rate=float("nan")), "learning_rate"),
        (dict(normalizer="median"), "normalizer"),
        (dict(jit_compile="yes"), "jit_compile"),
        (dict(sparse=True, variables=[]), "at most one"),
        (dict(variables=3), "variables"),
        (dict(validation_data=np.arange(5)), "gradient_data"),
        (dict(validation_data=np.array([1]), gradient_data=np.arange(9)), "at least 2"),
        (dict(frequency=0), "frequency"),
        (dict(model="model"), "model"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DynamicEvaluator(**kwargs)


def test_bad_hyperparameter_assignment_raises_and_keeps_value():
    ev = DynamicEvaluator()
    with pytest.raises(ValueError, match="learning_rate"):
        ev.learning_rate = -1.0
    assert ev.learning_rate == 5e-5


def test_other_model_problems_raise():
    with pytest.raises(ValueError, match="Expected a model"):
        DynamicEvaluator().evaluate(np.arange(5))
    unbuilt = keras.Sequential([keras.layers.Embedding(VOCAB, 4), keras.layers.Dense(VOCAB)])
    with pytest.raises(ValueError, match="built"):
        DynamicEvaluator(unbuilt).evaluate(np.arange(5))
    model = lstm_model()
    other = lstm_model()
    with pytest.raises(ValueError, match="variable of the model"):
        DynamicEvaluator(model, variables=other.trainable_variables).adapted_variables()
    with pytest.raises(ValueError, match="adaptation_kernel"):
        DynamicEvaluator(model, sparse=True).adapted_variables()
    with pytest.raises(ValueError, match="at least one variable"):
        DynamicEvaluator(model, variables=lambda v: False).adapted_variables()


def test_bad_gradient_data_raises():
    model, ev = trained_evaluator()
    statistics = ev.gradient_statistics
    with pytest.raises(ValueError, match="at least"):
        ev.collect_gradient_statistics(np.arange(5), batch_size=1)
    with pytest.raises(ValueError, match=r"token ids in \[0, "):
        ev.collect_gradient_statistics(np.arange(40), batch_size=1)
    with pytest.raises(ValueError, match="1-D stream"):
        ev.collect_gradient_statistics(np.zeros((4, 4), "int32"))
    with pytest.raises(ValueError, match="same shape"):
        ev.collect_gradient_statistics([(np.zeros((1, 4), "int32"), np.zeros((1, 3), "int32"))])
    with pytest.raises(ValueError, match="at least one batch"):
        ev.collect_gradient_statistics(iter([]))
    with pytest.raises(ValueError, match="batch_size"):
        ev.collect_gradient_statistics(np.arange(10), batch_size=0)
    # The earlier statistics survive every failed collection.
    for key, value in statistics.items():
        np.testing.assert_array_equal(ev.gradient_statistics[key], value)


def test_bad_statistics_assignment_raises():
    model, ev = trained_evaluator()
    v = model.trainable_variables[0]
    with pytest.raises(ValueError, match="dict"):
        ev.gradient_statistics = [1.0]
    good = random_statistics(model.trainable_variables)
    with pytest.raises(ValueError, match="shape"):
        ev.gradient_statistics = {**good, v.path: np.ones((2, 2))}
    with pytest.raises(ValueError, match="to hold"):
        ev.gradient_statistics = {k: good[k] for k in list(good)[1:]}


def test_all_zero_statistics_raise():
    model = lstm_model()
    ev = DynamicEvaluator(model)
    ev.gradient_statistics = {v.path: np.zeros(v.shape) for v in model.trainable_variables}
    with pytest.raises(ValueError, match="non-zero mean RMS"):
        ev.evaluate(np.arange(6))


def test_backend_without_gradients_raises(monkeypatch):
    monkeypatch.setattr(keras.backend, "backend", lambda: "numpy")
    with pytest.raises(ValueError, match="tensorflow.*jax.*torch.*Received: 'numpy'"):
        DynamicEvaluator()


def test_a_huge_finite_loss_is_a_divergence_not_a_number():
    """SGD at η = 1e20 gave a loss of about 4e19 and perplexity inf, reported
    as a result: a token loss no float's exp can hold is a divergence."""
    from keras_mogrifier.evaluation import DivergenceError

    model = lstm_model()
    stream = np.random.default_rng(1).integers(0, VOCAB, 16)
    set_random_state(model)
    weights, states = weight_values(model), state_values(model)
    ev = DynamicEvaluator(model, update_rule="sgd", learning_rate=1e20, decay_rate=0.0)
    with pytest.raises(DivergenceError, match="diverged at token") as caught:
        ev.evaluate(stream, verbose=0)
    assert np.isnan(caught.value.loss) or caught.value.loss > 709.78
    assert_same(weight_values(model), weights)
    assert_same(state_values(model), states)
    # Without stopping, the numbers are what they are (asked for).
    result = ev.evaluate(stream, verbose=0, stop_on_divergence=False)
    assert not np.isfinite(result["perplexity"])
    assert_same(weight_values(model), weights)


def test_a_vocabulary_size_larger_than_the_models_is_refused():
    model = lstm_model()
    with pytest.raises(ValueError, match=r"Expected `vocabulary_size` to be at most the "
                       rf"model's vocabulary \({VOCAB} ids.*vocabulary_size={VOCAB + 5}"):
        DynamicEvaluator(model, vocabulary_size=VOCAB + 5)
    # Set afterwards, it is refused before any step.
    ev = DynamicEvaluator(model, vocabulary_size=VOCAB - 1)
    ev.vocabulary_size = VOCAB + 1
    weights = weight_values(model)
    with pytest.raises(ValueError, match="Expected `vocabulary_size` to be at most"):
        ev.evaluate(np.array([1, VOCAB, 2]), adapt=False, verbose=0)
    assert_same(weight_values(model), weights)
    # A smaller one is a stricter check, as documented.
    with pytest.raises(ValueError, match=rf"token ids in \[0, {VOCAB - 1}\)"):
        DynamicEvaluator(model, vocabulary_size=VOCAB - 1).evaluate(
            np.array([1, VOCAB - 1, 2]), adapt=False, verbose=0)

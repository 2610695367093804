"""The Mogrifier authors' dynamic evaluation, transcribed, equals ours converted.

deepmind/lamb adapts on the cross-entropy *summed* over the n steps of a
segment (`lamb/lm.py` `_build_loss`: `xe_loss = tf.reduce_sum(xe_losses,
axis=0)`, then the mean over the batch) and gathers its RMS from the
gradients of that same summed loss over training windows of the same length;
its update (`lamb/dyneval.py` `Dyneval._make_update`) is

    ms = sqrt(sum_squared_grads / num_squared_grads)
    gsum = mean of ms over all elements
    var += -lr * grad / (ms + epsilon) + min(1, decay_rate * ms / gsum) * (save - var)

Transcribed below in NumPy (gradients from the backend's autodiff), it must
match `DynamicEvaluator` run with the settings `DynamicEvaluationTuner`
derives from lamb's (`loss_reduction="sum"`: η and λ as given, ε / n).
"""

import keras
import numpy as np
import pytest

from keras_mogrifier.evaluation import DynamicEvaluator
from keras_mogrifier.tuning import DynamicEvaluationTuner

import testing
from testing import to_numpy

VOCAB, N, BATCH = 9, 4, 3


def tiny_model(batch):
    model = keras.Sequential([
        keras.Input(batch_shape=(batch, None), dtype="int32"),
        keras.layers.Embedding(VOCAB, 5),
        keras.layers.LSTM(6, stateful=True, return_sequences=True),
        keras.layers.Dense(VOCAB),
    ])
    rng = np.random.default_rng(0)
    for v in model.trainable_variables:
        v.assign(rng.uniform(-0.5, 0.5, v.shape).astype("float32"))
    return model


def reset(model):
    for layer in model.layers:
        if isinstance(layer, keras.layers.RNN):
            layer.reset_state()


def summed_loss_gradients(model, x, y):
    """lamb's gradient: of Σ_t mean_batch CE_t, and the token losses."""

    def fn():
        logits = model(x)
        losses = keras.ops.sparse_categorical_crossentropy(y, logits, from_logits=True)
        return keras.ops.sum(keras.ops.mean(losses, axis=0)), losses

    (_, losses), grads = testing.value_and_gradients(
        fn, model.trainable_variables, model=model, has_aux=True
    )
    return losses, [g.astype("float64") for g in grads]


def lamb_dynamic_evaluation(train, test, lr, decay_rate, epsilon):
    # Statistics: windows of N tokens over BATCH contiguous streams.
    model = tiny_model(BATCH)
    length = len(train) // BATCH
    streams = train[: length * BATCH].reshape(BATCH, length)
    sum_squared = [np.zeros(v.shape) for v in model.trainable_variables]
    count = 0
    reset(model)
    for i in range((length - 1) // N):
        x = streams[:, i * N : (i + 1) * N]
        y = streams[:, i * N + 1 : (i + 1) * N + 1]
        _, grads = summed_loss_gradients(model, x, y)
        for s, g in zip(sum_squared, grads):
            s += g**2
        count += 1
    ms = [np.sqrt(s / count) for s in sum_squared]
    gsum = sum(m.sum() for m in ms) / sum(m.size for m in ms)

    # Evaluation: one stream, segments of N, score then update.
    model = tiny_model(1)
    variables = model.trainable_variables
    save = [to_numpy(v).astype("float64") for v in variables]
    reset(model)
    token_losses = []
    for start in range(0, len(test) - 1, N):
        x, y = test[None, start : start + N], test[None, start + 1 : start + N + 1]
        x, y = x[:, : y.shape[1]], y
        losses, grads = summed_loss_gradients(model, x, y)
        token_losses.append(losses[0])
        for v, grad, s, m in zip(variables, grads, save, ms):
            var = to_numpy(v).astype("float64")
            decay = np.minimum(1.0, decay_rate * (m / gsum))
            delta = -lr * grad / (m + epsilon) + decay * (s - var)
            v.assign((var + delta).astype("float32"))
    return np.concatenate(token_losses), [to_numpy(v) for v in variables]


@pytest.mark.parametrize(
    "lamb_setting",
    [(1e-4, 2e-3, 1e-5), (3e-4, 1e-3, 1e-6), (3e-3, 2e-3, 1e-2)],
)
def test_lamb_update_equals_the_library_with_converted_settings(tmp_path, lamb_setting):
    lr, decay_rate, epsilon = lamb_setting
    rng = np.random.default_rng(1)
    train = np.concatenate([np.arange(VOCAB), rng.integers(0, VOCAB, 40)])
    test = rng.integers(0, VOCAB, 3 * N + 1)  # 3 segments
    expected_losses, expected_weights = lamb_dynamic_evaluation(
        train, test, lr, decay_rate, epsilon
    )

    tuner = DynamicEvaluationTuner(
        tiny_model(BATCH), train, loss_reduction="sum", fixed={"segment_length": N},
        statistics_batch_size=BATCH, directory=str(tmp_path),
    )
    settings = tuner.evaluator_settings(
        {"learning_rate": lr, "decay_rate": decay_rate, "epsilon": epsilon}
    )
    assert settings["epsilon"] == pytest.approx(epsilon / N)
    assert settings["learning_rate"] == lr and settings["decay_rate"] == decay_rate

    # Statistics on a batch of BATCH streams, evaluation on one stream (a
    # stateful Keras LSTM runs at the batch size it was built with).
    statistics_model = tiny_model(BATCH)
    gathering = DynamicEvaluator(statistics_model, segment_length=N)
    gathering.collect_gradient_statistics(train, batch_size=BATCH)
    evaluation_model = tiny_model(1)
    evaluator = DynamicEvaluator(evaluation_model, normalizer="global_mean", **settings)
    evaluator.gradient_statistics = {
        v.path: gathering.gradient_statistics[w.path]
        for v, w in zip(evaluation_model.trainable_variables, statistics_model.trainable_variables)
    }
    capture = testing.CaptureVariables(evaluation_model.trainable_variables)
    result = evaluator.evaluate(
        test, verbose=0, return_token_losses=True, callbacks=[capture]
    )
    np.testing.assert_allclose(result["token_losses"][0], expected_losses, rtol=1e-5)
    # The weights after the last update (the evaluator restores them after).
    for actual, expected in zip(capture.after_segment[-1], expected_weights):
        np.testing.assert_allclose(actual, expected, rtol=2e-4, atol=2e-6)
    # The adaptation was not negligible: the last segment's weights moved.
    moved = max(
        np.abs(a - to_numpy(v)).max()
        for a, v in zip(capture.after_segment[-1], evaluation_model.trainable_variables)
    )
    assert moved > 1e-5

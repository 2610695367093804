"""Sparse dynamic evaluation: only the cells' `adaptation_kernel` adapts."""

import keras
import numpy as np
import pytest

from keras_mogrifier.evaluation import DynamicEvaluator
from keras_mogrifier.layers import MogrifierLSTMCell

import reference
import testing
from testing import to_numpy

VOCAB = 11
UNITS = 6
H = 4


def sparse_model(batch, streams=None, seed=0):
    keras.utils.set_random_seed(seed)
    cell = MogrifierLSTMCell(
        UNITS, mogrifier_rounds=2, adaptation_units=H, adaptation_streams=streams
    )
    return keras.Sequential(
        [
            keras.Input(batch_shape=(batch, None), dtype="int32"),
            keras.layers.Embedding(VOCAB, 5),
            keras.layers.RNN(cell, stateful=True, return_sequences=True),
            keras.layers.Dense(VOCAB),
        ]
    )


def kernel_of(model):
    (kernel,) = [v for v in model.variables if v.name == "adaptation_kernel"]
    return kernel


def copy_weights(source, target):
    """Same architecture; the adaptation kernels (zero) may differ in shape."""
    for a, b in zip(source.variables, target.variables):
        if a.name != "adaptation_kernel":
            b.assign(a)


def test_sparse_mode_adapts_only_the_adaptation_matrix():
    model = sparse_model(batch=1)
    kernel = kernel_of(model)
    ev = DynamicEvaluator(model, sparse=True, learning_rate=1e-2, decay_rate=0.01)
    assert ev.adapted_variables() == [kernel]
    rng = np.random.default_rng(0)
    ev.collect_gradient_statistics(rng.integers(0, VOCAB, 200), batch_size=1, steps=20)
    statistics = ev.gradient_statistics
    assert list(statistics) == [kernel.path]
    assert np.all(statistics[kernel.path] > 0)

    before = [to_numpy(v).copy() for v in model.variables]
    capture = testing.CaptureVariables(model.variables)
    text = np.tile(rng.integers(0, VOCAB, 7), 12)
    static = ev.evaluate(text, adapt=False, verbose=0)
    dynamic = ev.evaluate(text, callbacks=[capture], verbose=0)
    index = [i for i, v in enumerate(model.variables) if v is kernel][0]
    for after in capture.after_segment:
        for i, (a, b) in enumerate(zip(after, before)):
            if i == index:
                assert np.any(a != 0)
            else:
                np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(to_numpy(kernel), np.zeros((H, H)))
    assert dynamic["loss"] < static["loss"]


def test_zero_learning_rate_sparse_is_static():
    model = sparse_model(batch=1)
    ev = DynamicEvaluator(model, sparse=True, learning_rate=0.0, decay_rate=0.5)
    ev.collect_gradient_statistics(np.arange(120) % VOCAB, batch_size=1, steps=5)
    stream = np.random.default_rng(1).integers(0, VOCAB, 17)
    dynamic = ev.evaluate(stream, verbose=0, return_token_losses=True)
    static = ev.evaluate(stream, adapt=False, verbose=0, return_token_losses=True)
    # Different compiled programmes: XLA may round them apart by an ulp.
    np.testing.assert_allclose(
        dynamic["token_losses"], static["token_losses"], rtol=1e-6, atol=0
    )


def test_per_stream_statistics_equal_shared_matrix_statistics():
    shared = sparse_model(batch=3)
    per_stream = sparse_model(batch=3, streams=3)
    copy_weights(shared, per_stream)
    data = np.random.default_rng(2).integers(0, VOCAB, 90)
    a = DynamicEvaluator(shared, sparse=True)
    a.collect_gradient_statistics(data, batch_size=3)
    b = DynamicEvaluator(per_stream, sparse=True)
    b.collect_gradient_statistics(data, batch_size=3)
    ms_shared = a.gradient_statistics[kernel_of(shared).path]
    ms_streams = b.gradient_statistics[kernel_of(per_stream).path]
    assert ms_streams.shape == (3, H, H)
    for s in range(3):
        np.testing.assert_allclose(ms_streams[s], ms_shared, rtol=1e-5, atol=1e-12)
    with pytest.raises(ValueError, match="exactly 3 streams"):
        b.collect_gradient_statistics(
            [(np.zeros((2, 4), "int32"), np.zeros((2, 4), "int32"))]
        )


def test_per_stream_matrices_adapt_streams_in_parallel_like_one_at_a_time():
    per_stream = sparse_model(batch=3, streams=3)
    single = sparse_model(batch=1)
    copy_weights(per_stream, single)
    rng = np.random.default_rng(3)
    ms = (10.0 ** rng.uniform(-3, -1, (H, H))) ** 2
    batched = DynamicEvaluator(per_stream, sparse=True, learning_rate=1e-2, decay_rate=0.2)
    batched.gradient_statistics = {
        kernel_of(per_stream).path: np.broadcast_to(ms, (3, H, H))
    }
    one = DynamicEvaluator(single, sparse=True, learning_rate=1e-2, decay_rate=0.2)
    one.gradient_statistics = {kernel_of(single).path: ms}

    streams = np.tile(rng.integers(0, VOCAB, (5, 6)), 3)  # 5 streams: groups of 3 + 2
    together = batched.evaluate(streams, verbose=0, return_token_losses=True)
    alone = [one.evaluate(s, verbose=0, return_token_losses=True) for s in streams]
    np.testing.assert_allclose(
        together["token_losses"],
        np.concatenate([r["token_losses"] for r in alone]),
        rtol=1e-5,
        atol=1e-6,
    )
    assert together["num_tokens"] == 5 * 17
    np.testing.assert_array_equal(to_numpy(kernel_of(per_stream)), np.zeros((3, H, H)))
    static = batched.evaluate(streams, adapt=False, verbose=0)
    assert together["loss"] < static["loss"]


def test_per_stream_batch_size_must_match():
    model = sparse_model(batch=3, streams=3)
    ev = DynamicEvaluator(model, sparse=True)
    ev.gradient_statistics = {kernel_of(model).path: np.ones((3, H, H))}
    with pytest.raises(ValueError, match="per-stream adaptation matrices"):
        ev.evaluate(np.zeros((3, 6), "int32"), batch_size=1)


@pytest.mark.parametrize("rule, lr", [("sgd", 0.5), ("rms_global_prior", 1e-2)])
def test_every_update_rule_works_sparse(rule, lr):
    """The simpler rules adapt the adaptation matrix alone too, by their equation."""
    model = sparse_model(batch=1)
    kernel = kernel_of(model)
    ev = DynamicEvaluator(model, sparse=True, learning_rate=lr, decay_rate=0.01,
                          update_rule=rule, segment_length=4)
    rng = np.random.default_rng(1)
    if rule != "sgd":
        ev.collect_gradient_statistics(rng.integers(0, VOCAB, 200), batch_size=1, steps=20)
    others = [to_numpy(v).copy() for v in model.variables if v is not kernel]
    capture = testing.CaptureVariables([kernel])
    text = np.tile(rng.integers(0, VOCAB, 7), 12)
    static = ev.evaluate(text, adapt=False, verbose=0)
    dynamic = ev.evaluate(text, callbacks=[capture], verbose=0)
    assert dynamic["loss"] < static["loss"]
    # The first update from M = 0 is −η g (sgd) or −η g/(RMS+ε) (eq. 6): by hand.
    for layer in model.layers:
        if isinstance(layer, keras.layers.RNN):
            layer.reset_state()

    def loss():
        logits = model(text[None, :4])
        return keras.ops.mean(keras.ops.sparse_categorical_crossentropy(
            text[None, 1:5], logits, from_logits=True))

    _, (g,) = testing.value_and_gradients(loss, [kernel], model=model)
    for layer in model.layers:
        if isinstance(layer, keras.layers.RNN):
            layer.reset_state()
    if rule == "sgd":
        expected = -lr * g
    else:
        rms = np.sqrt(ev.gradient_statistics[kernel.path])
        expected = -lr * g / (rms + ev.epsilon)
    np.testing.assert_allclose(capture.after_segment[0][0], expected, rtol=1e-4, atol=1e-7)
    for v, before in zip([v for v in model.variables if v is not kernel], others):
        np.testing.assert_array_equal(to_numpy(v), before)


def _numpy_segment(params, ids, h, c, adaptation):
    """One segment in float64 from the carried `(h, c)`: logits, new state.

    Krause et al. §6 (seed `003_e9e25d7415956102.txt`, lines 99-105):
    `h' = h + M h` on a subset of H units replaces `h` "throughout the
    network via both recurrent and feed-forward connections" (row vectors
    here: `h'[:H] = h[:H] + h[:H] @ M`).
    """
    logits = []
    for token in ids:
        x = params["embedding"][token][None]
        x, h_in = reference.mogrify(x, h, params["rounds"])
        h, c = reference.lstm_step(
            x, h_in, c, params["kernel"], params["recurrent_kernel"], params["bias"]
        )
        h = h.copy()
        h[:, :H] = h[:, :H] + h[:, :H] @ adaptation
        logits.append(h @ params["dense"] + params["dense_bias"])
    return np.concatenate(logits), h, c


def _mean_loss(logits, targets):
    m = logits.max(-1)
    log_z = m + np.log(np.exp(logits - m[:, None]).sum(-1))
    losses = log_z - logits[np.arange(len(targets)), targets]
    return losses.mean(), losses


def test_sparse_update_is_krauses_rule_on_the_adaptation_matrix_by_hand():
    """Sparse dynamic evaluation transcribed in NumPy: each segment is scored
    with the current M from the carried state, then M takes Krause's eq. 8
    step (benkrause/dynamic-evaluation `dynamiceval.py` 210-211: `dW =
    lamb·decrate·(data0 − data) − lr·grad/(MS + ε)`, θ_g = 0 for M, decay
    clipped at 1 as in lines 160-171) with the gradient of the segment's
    mean loss, taken by central finite differences in float64 through the
    forward pass above — nothing of the library's forward or autodiff."""
    model = sparse_model(batch=1)
    kernel = kernel_of(model)
    cell = model.layers[1].cell
    mw = [w.astype("float64") for w in cell.mogrifier.get_weights()]
    dense = model.layers[2]
    params = {
        "embedding": to_numpy(model.layers[0].embeddings).astype("float64"),
        "rounds": [([mw[0]], mw[1]), ([mw[2]], mw[3])],
        "kernel": to_numpy(cell.kernel).astype("float64"),
        "recurrent_kernel": to_numpy(cell.recurrent_kernel).astype("float64"),
        "bias": to_numpy(cell.bias).astype("float64"),
        "dense": to_numpy(dense.kernel).astype("float64"),
        "dense_bias": to_numpy(dense.bias).astype("float64"),
    }
    rng = np.random.default_rng(5)
    ms = (10.0 ** rng.uniform(-3, -1, (H, H))) ** 2
    lr, lam, eps, n = 0.05, 0.3, 1e-3, 4
    ev = DynamicEvaluator(model, sparse=True, learning_rate=lr, decay_rate=lam,
                          epsilon=eps, segment_length=n)
    ev.gradient_statistics = {kernel.path: ms}
    capture = testing.CaptureVariables([kernel])
    stream = np.tile(rng.integers(0, VOCAB, 5), 3)[:14]  # 13 predicted: 4, 4, 4, 1
    result = ev.evaluate(stream, callbacks=[capture], verbose=0, return_token_losses=True)

    rms = np.sqrt(ms)
    decay = np.minimum(1.0, lam * rms / rms.mean())
    assert np.any(decay == 1.0) and np.any(decay < 1.0)
    adaptation = np.zeros((H, H))
    h, c = np.zeros((1, UNITS)), np.zeros((1, UNITS))
    x, y = stream[:-1], stream[1:]
    expected_losses, expected_kernels = [], []
    for start in range(0, len(x), n):
        xs, ys = x[start : start + n], y[start : start + n]
        logits, h_next, c_next = _numpy_segment(params, xs, h, c, adaptation)
        _, losses = _mean_loss(logits, ys)
        expected_losses.append(losses)
        gradient = np.zeros((H, H))
        for i in range(H):
            for j in range(H):
                step = np.zeros((H, H))
                step[i, j] = 1e-6
                up = _mean_loss(_numpy_segment(params, xs, h, c, adaptation + step)[0], ys)[0]
                down = _mean_loss(_numpy_segment(params, xs, h, c, adaptation - step)[0], ys)[0]
                gradient[i, j] = (up - down) / 2e-6
        adaptation = adaptation - lr * gradient / (rms + eps) + decay * (0.0 - adaptation)
        expected_kernels.append(adaptation.copy())
        h, c = h_next, c_next

    assert len(capture.after_segment) == 4
    for (actual,), expected in zip(capture.after_segment, expected_kernels):
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-6)
    assert np.abs(expected_kernels[0]).max() > 1e-3  # M really moves
    np.testing.assert_allclose(
        result["token_losses"][0], np.concatenate(expected_losses), rtol=1e-5, atol=1e-6
    )

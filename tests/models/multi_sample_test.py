"""Training with D dropout samples per sequence, and the chunked softmax."""

import numpy as np
import pytest
import keras

from keras_mogrifier.losses import IWAEDropoutLoss
from keras_mogrifier.metrics import Perplexity
from keras_mogrifier.models import LanguageModel

from testing import JIT_COMPILE
from testing import to_numpy
from testing import value_and_gradients

V, B, T, N = 29, 3, 6, 8
DROPOUT = dict(input_dropout=0.3, cell_output_dropout=0.2, state_dropout=0.3, output_dropout=0.3)


def _ids(seed=0, batch=B, time=T):
    return np.random.default_rng(seed).integers(0, V, size=(batch, time)).astype("int32")


def _randomize(model, seed=1, scale=0.4):
    rng = np.random.default_rng(seed)
    for w in model.trainable_weights:
        w.assign(rng.normal(scale=scale, size=w.shape))


def _softmax(logits):
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def test_copies_have_their_own_masks_and_state_rows():
    model = LanguageModel(V, units=N, samples=4, batch_size=B, seed=3, **DROPOUT)
    out = to_numpy(model(_ids(), training=True))
    assert out.shape == (B, 4, T, V)
    for d in range(4):
        for e in range(d + 1, 4):
            assert not np.allclose(out[:, d], out[:, e])
    # Every copy wrote its own final state: rows d·B … (d+1)·B − 1.
    state = to_numpy(model.recurrent_state_variables[0]).reshape(4, B, N)
    for d in range(1, 4):
        assert not np.allclose(state[0], state[d])


def test_each_copy_continues_from_its_own_state():
    """Copy d reads state rows d·B … (d+1)·B − 1 and writes them back."""
    model = LanguageModel(V, units=N, num_layers=2, samples=3, batch_size=B)
    ids = _ids()
    model.build((B, None))
    _randomize(model)
    rng = np.random.default_rng(7)
    starts = [rng.normal(size=v.shape).astype("float32") for v in model.recurrent_state_variables]
    for v, s in zip(model.recurrent_state_variables, starts):
        v.assign(s)
    out = to_numpy(model(ids, training=True))  # no dropout: copies differ by state only
    ends = [to_numpy(v) for v in model.recurrent_state_variables]
    single = model.with_options(samples=1)
    for d in range(3):
        rows = slice(d * B, (d + 1) * B)
        for v, s in zip(single.recurrent_state_variables, starts):
            v.assign(s[rows])
        np.testing.assert_allclose(out[:, d], to_numpy(single(ids, training=True)), atol=1e-5)
        for v, e in zip(single.recurrent_state_variables, ends):
            np.testing.assert_allclose(to_numpy(v)[:B], e[rows], atol=1e-5)


def test_copies_are_identical_without_dropout_and_one_is_computed_at_evaluation():
    model = LanguageModel(V, units=N, samples=3, batch_size=B, seed=0, **DROPOUT)
    ids = _ids()
    model.build((B, None))
    _randomize(model)
    single = model.with_options(samples=1)
    evaluated = to_numpy(model(ids))
    assert evaluated.shape == (B, T, V)
    np.testing.assert_allclose(evaluated, to_numpy(single(ids)), atol=1e-6)
    model.reset_states()
    np.testing.assert_allclose(to_numpy(model(ids)), evaluated, atol=1e-6)  # deterministic
    # With every dropout rate 0 the D training copies coincide.
    plain = model.with_options(**{k: 0.0 for k in DROPOUT})
    out = to_numpy(plain(ids, training=True))
    for d in range(3):
        np.testing.assert_allclose(out[:, d], evaluated, atol=1e-5)


def _next_token_data(windows=20, seed=0):
    # B streams with w_{t+1} = w_t + 1 (mod V), learnable from the current
    # token, cut into consecutive windows: batch k is rows k·B … (k+1)·B − 1.
    start = np.random.default_rng(seed).integers(0, V, size=(B, 1))
    stream = ((start + np.arange(windows * T + 1)) % V).astype("int32")
    x = stream[:, :-1].reshape(B, windows, T).transpose(1, 0, 2).reshape(-1, T)
    y = stream[:, 1:].reshape(B, windows, T).transpose(1, 0, 2).reshape(-1, T)
    return x, y


@pytest.mark.parametrize("chunk", [None, 7])
@pytest.mark.compiled  # faster compiled than op by op (tests/conftest.py)
def test_short_fit_with_two_samples_decreases_the_loss(chunk):
    keras.utils.set_random_seed(0)
    x, y = _next_token_data()
    model = LanguageModel(V, units=16, num_layers=1, samples=2, batch_size=B,
                          softmax_chunk_size=chunk, seed=0, **DROPOUT)
    model.compile(keras.optimizers.Adam(0.03), IWAEDropoutLoss(),
                  weighted_metrics=[Perplexity()])
    history = model.fit(x, y, batch_size=B, epochs=3, verbose=0).history
    # About 0.45 to 0.57 of the first epoch's loss, depending on the initial
    # weights and dropout masks (each backend has its own random streams).
    assert history["loss"][-1] < 0.6 * history["loss"][0]
    # Training perplexity is exp of the multi-sample objective (no l2 here).
    np.testing.assert_allclose(np.log(history["perplexity"]), history["loss"], rtol=1e-3)
    logs = model.evaluate(x, y, batch_size=B, verbose=0, return_dict=True)
    assert logs["perplexity"] < 0.5 * np.exp(history["loss"][0])


CONFIGS = [
    dict(samples=3),
    dict(samples=1, tie_embeddings=False, dual=True, l2=1e-3),
    dict(samples=2, embedding_dim=5, cell="mogrifier_rlstm", mogrifier_rounds=2),
]


@pytest.mark.parametrize("config", CONFIGS)
def test_chunked_loss_and_gradients_equal_the_unchunked_ones(config):
    model = LanguageModel(V, units=N, batch_size=B, seed=5, **DROPOUT, **config)
    model.build((B, None))
    _randomize(model)
    chunked = model.with_options(softmax_chunk_size=4)  # 4 does not divide B·D·T
    x, y = _ids(1), _ids(2)
    weights = np.ones((B, T), "float32")
    weights[0, 2:] = 0.0  # padding
    results = []
    for m in (model.with_options(), chunked):  # same seed: same masks
        m.compile("sgd", IWAEDropoutLoss(), weighted_metrics=[Perplexity()])

        def loss_fn(m=m):
            out = m(x, training=True)
            return m.compute_loss(x, y, out, weights, training=True), tuple(out.shape)

        (loss, shape), grads = value_and_gradients(
            loss_fn, m.trainable_weights, model=m, has_aux=True
        )
        results.append((float(loss), grads, shape))
    (loss, grads, shape), (c_loss, c_grads, c_shape) = results
    width = 5 if "embedding_dim" in config else N
    assert shape[-1] == V and c_shape == shape[:-1] + (width,)
    assert c_loss == pytest.approx(loss, rel=1e-6)
    for g, c in zip(grads, c_grads):
        np.testing.assert_allclose(c, g, rtol=1e-4, atol=1e-6)
    # The objective itself, against NumPy: softmax of the unchunked logits.
    m = model.with_options()
    logits = to_numpy(m(x, training=True)).astype("float64")
    if logits.ndim == 3:
        logits = logits[:, None]
    p = _softmax(logits)
    target = np.take_along_axis(p, y[:, None, :, None], -1)[..., 0].mean(1)
    penalty = sum(float(to_numpy(l).sum()) for l in m.losses)
    expected = -(np.log(target) * weights).sum() / weights.sum() + penalty
    assert loss == pytest.approx(expected, rel=1e-5)


def test_chunked_train_step_under_xla_equals_the_unchunked_one():
    # The chunked step compiled with XLA, the reference without (no dropout:
    # XLA draws other random numbers than the TensorFlow kernels). On PyTorch
    # both run eagerly (`JIT_COMPILE`: torch.compile of this model takes
    # over a minute on CPU).
    model = LanguageModel(V, units=N, samples=2, batch_size=B, l2=1e-3)
    model.build((B, None))
    _randomize(model)
    x, y = _ids(3), _ids(4)
    runs = []
    for chunk in (None, 5):
        m = model.with_options(softmax_chunk_size=chunk)
        m.compile(keras.optimizers.SGD(0.5), IWAEDropoutLoss(),
                  weighted_metrics=[Perplexity()],
                  jit_compile=JIT_COMPILE if chunk is not None else False)
        logs = [m.train_on_batch(x, y, return_dict=True) for _ in range(2)]
        runs.append((logs, [to_numpy(w) for w in m.trainable_weights]))
    (logs, weights), (c_logs, c_weights) = runs
    for a, b in zip(logs, c_logs):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["perplexity"] == pytest.approx(a["perplexity"], rel=1e-5)
    for w, c in zip(weights, c_weights):
        np.testing.assert_allclose(c, w, rtol=1e-4, atol=1e-6)


def test_chunked_model_predicts_and_evaluates_logits(tmp_path):
    model = LanguageModel(V, units=N, samples=2, batch_size=B, softmax_chunk_size=8, **DROPOUT)
    model.compile("adam", IWAEDropoutLoss(), weighted_metrics=[Perplexity()])
    x, y = _ids(5), _ids(6)
    model.build((B, None))
    _randomize(model)
    assert model.predict(x, batch_size=B, verbose=0).shape == (B, T, V)
    reference_model = model.with_options(softmax_chunk_size=None)
    reference_model.compile(loss=IWAEDropoutLoss(), weighted_metrics=[Perplexity()])
    expected = reference_model.evaluate(x, y, batch_size=B, verbose=0, return_dict=True)
    logs = model.evaluate(x, y, batch_size=B, verbose=0, return_dict=True)
    assert logs == pytest.approx(expected, rel=1e-6)
    assert model.get_config()["softmax_chunk_size"] == 8
    path = tmp_path / "chunked.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.softmax_chunk_size == 8 and isinstance(loaded.loss, IWAEDropoutLoss)


def test_target_log_probabilities_match_the_logits():
    model = LanguageModel(V, units=N, samples=3, batch_size=B, softmax_chunk_size=5,
                          embedding_dim=6, seed=1, **DROPOUT)
    model.build((B, None))
    _randomize(model)
    x, y = _ids(8), _ids(9)
    features = model(x, training=True)
    logits = to_numpy(model.with_options(softmax_chunk_size=None)(x, training=True)).astype("float64")
    expected = np.log(np.take_along_axis(_softmax(logits), np.broadcast_to(
        y[:, None, :, None], logits.shape[:-1] + (1,)), -1)[..., 0])
    np.testing.assert_allclose(to_numpy(model.target_log_probabilities(features, y)), expected, atol=1e-5)
    with pytest.raises(ValueError, match=r"Expected features of shape"):
        model.target_log_probabilities(features[:, 0, 0], y)


@pytest.mark.parametrize("value", [0, -3, 2.5, True])
def test_bad_chunk_size(value):
    with pytest.raises(ValueError, match="Expected `softmax_chunk_size`.*Received"):
        LanguageModel(V, units=N, softmax_chunk_size=value)


def test_chunking_needs_features_narrower_or_wider_than_the_vocabulary():
    with pytest.raises(ValueError, match="softmax input width to differ"):
        LanguageModel(N, units=N, softmax_chunk_size=4, stateful=False).build((B, None))


@pytest.mark.parametrize("chunk", [None, 4])
def test_sample_axis_missing_or_of_the_wrong_size_raises(chunk):
    x, y = _ids(), _ids(1)
    model = LanguageModel(V, units=N, batch_size=B, softmax_chunk_size=chunk)
    with pytest.raises(ValueError, match="2 samples.*samples=1"):
        model.compile("sgd", IWAEDropoutLoss(samples=2))
    model = LanguageModel(V, units=N, batch_size=B, samples=2, softmax_chunk_size=chunk)
    with pytest.raises(ValueError, match="3 samples.*samples=2"):
        model.compile("sgd", IWAEDropoutLoss(samples=3))
    # The matching D trains (D samples) and evaluates (one sample) alike.
    model.compile("sgd", IWAEDropoutLoss(samples=2))
    model.fit(x, y, batch_size=B, verbose=0)
    assert np.isfinite(model.evaluate(x, y, batch_size=B, verbose=0))


def test_chunking_needs_the_iwae_loss_and_probability_metrics():
    x, y = _ids(), _ids(1)
    model = LanguageModel(V, units=N, batch_size=B, samples=2, softmax_chunk_size=4)
    # Refused at compile, before any step could change a weight.
    with pytest.raises(ValueError, match=r"compile\(loss=IWAEDropoutLoss\(\)\)"):
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match="Expected training metrics.*accuracy"):
        model.compile("sgd", IWAEDropoutLoss(), metrics=["accuracy"])
    with pytest.raises(ValueError, match="Expected training metrics"):
        model.compile("sgd", IWAEDropoutLoss(), weighted_metrics=[keras.metrics.SparseCategoricalAccuracy()])
    model.compile("sgd", IWAEDropoutLoss(), weighted_metrics=[Perplexity()])
    model.fit(x, y, batch_size=B, verbose=0)

"""Mixture of Softmaxes: the layer, the LanguageModel with K > 0, and every
consumer of its outputs (normalised log-probabilities), against NumPy.

The reference is lamb's log-domain mixture (deepmind/lamb `utils.py`
`mixture_of_softmaxes`): `c_k = tanh(h W_p + b_p)`, `log π = log_softmax(h W_π)`,
`log p = logsumexp_k(log π_k + log_softmax(τ (c_k E_outᵀ + b)))`.
"""

import keras
import numpy as np
import pytest

import keras_mogrifier as km
from keras_mogrifier.evaluation import DynamicEvaluator
from keras_mogrifier.evaluation import _dynamic_pass
from keras_mogrifier.evaluation import NeuralCache
from keras_mogrifier.evaluation import evaluate_stream
from keras_mogrifier.evaluation import mc_dropout_evaluate
from keras_mogrifier.evaluation.temperature import search_temperature
from keras_mogrifier.layers import MixtureOfSoftmaxes
from keras_mogrifier.losses import IWAEDropoutLoss
from keras_mogrifier.metrics import Perplexity
from keras_mogrifier.models import LanguageModel

import reference
from testing import assert_saved_model_round_trip
from testing import to_numpy

V = 23


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _logsumexp(z, axis):
    m = z.max(axis, keepdims=True)
    return np.squeeze(m, axis) + np.log(np.exp(z - m).sum(axis))


def _weights(model):
    return {v.path.split("/", 1)[-1]: to_numpy(v).astype("float64") for v in model.weights}


def reference_log_probs(model, features, temperature):
    """The mixture from the model's weights, in float64."""
    w = _weights(model)
    k = model.mixture_of_softmaxes
    h = np.asarray(features, "float64")
    contexts = np.tanh(
        h @ w["mixture_of_softmaxes/projection_kernel"]
        + w["mixture_of_softmaxes/projection_bias"]
    )
    contexts = contexts.reshape(h.shape[:-1] + (k, -1))
    log_pi = _log_softmax(h @ w["mixture_of_softmaxes/weights_kernel"])
    if model.tie_embeddings:
        logits = contexts @ w["embedding/embeddings"].T + w["output_bias"]
    else:
        logits = contexts @ w["output/kernel"] + w["output/bias"]
    return _logsumexp(log_pi[..., None] + _log_softmax(temperature * logits), axis=-2)


def make_model(k=2, scale=0.5, seed=0, **kwargs):
    options = dict(units=8, num_layers=2, cell="mogrifier_lstm", mogrifier_rounds=2,
                   batch_size=2, seed=seed)
    options.update(kwargs)
    model = LanguageModel(V, mixture_of_softmaxes=k, **options)
    model.build((options["batch_size"], None))
    rng = np.random.default_rng(seed)
    for v in model.trainable_weights:
        v.assign(rng.normal(scale=scale, size=v.shape))
    return model


def ids(shape, seed=1):
    return np.random.default_rng(seed).integers(0, V, shape).astype("int32")


# === The layer ===


def test_layer_matches_numpy_and_mixes_to_a_distribution():
    layer = MixtureOfSoftmaxes(3, 4)
    h = np.random.default_rng(0).normal(size=(2, 5, 6)).astype("float32")
    contexts, log_w = layer(h)
    wp, bp, wpi = (to_numpy(v) for v in (layer.projection_kernel, layer.projection_bias,
                                        layer.weights_kernel))
    np.testing.assert_allclose(to_numpy(contexts),
                               np.tanh(h @ wp + bp).reshape(2, 5, 3, 4), atol=1e-5)
    np.testing.assert_allclose(to_numpy(log_w), _log_softmax(h @ wpi), atol=1e-5)
    z = np.random.default_rng(1).normal(size=(2, 5, 3, 9)).astype("float32")
    mixed = to_numpy(layer.mix(z, log_w))
    expected = np.log((np.exp(to_numpy(log_w))[..., None]
                       * np.exp(_log_softmax(z))).sum(-2))
    np.testing.assert_allclose(mixed, expected, atol=1e-5)
    revived = MixtureOfSoftmaxes.from_config(layer.get_config())
    assert (revived.components, revived.context_units) == (3, 4)


def test_layer_drops_out_the_contexts_in_training_only():
    """Yang et al.'s `dropoutl` (zihangdai/mos model.py 96-97): the contexts
    c_k are dropped out (kept ones scaled by 1/(1 − rate)); π is not."""
    layer = MixtureOfSoftmaxes(2, 4, dropout=0.5, seed=3)
    h = np.random.default_rng(0).normal(size=(3, 5, 6)).astype("float32")
    contexts, log_w = (to_numpy(t) for t in layer(h))
    dropped, dropped_log_w = (to_numpy(t) for t in layer(h, training=True))
    kept = dropped != 0
    assert 0.3 < kept.mean() < 0.7
    np.testing.assert_allclose(dropped[kept], 2.0 * contexts[kept], rtol=1e-5)
    np.testing.assert_allclose(dropped_log_w, log_w, atol=1e-6)
    revived = MixtureOfSoftmaxes.from_config(layer.get_config())
    assert (revived.dropout, revived.seed) == (0.5, 3)
    with pytest.raises(ValueError, match=r"Expected `dropout` to be a float in \[0, 1\)"):
        MixtureOfSoftmaxes(2, 4, dropout=1.0)


def test_mixture_dropout_defaults_to_the_inter_layer_rate_as_the_reference():
    # zihangdai/mos main.py 49, 87-88: dropoutl < 0 (the default) → dropouth.
    model = LanguageModel(V, units=8, mixture_of_softmaxes=2, cell_output_dropout=0.3)
    assert model.mixture_dropout is None
    assert model.effective_mixture_dropout == model.mixture.dropout == 0.3
    revived = LanguageModel.from_config(model.get_config())
    assert revived.mixture_dropout is None and revived.mixture.dropout == 0.3
    explicit = LanguageModel(V, units=8, mixture_of_softmaxes=2, mixture_dropout=0.1)
    assert explicit.mixture.dropout == 0.1
    assert explicit.with_options(mixture_dropout=0.2).mixture.dropout == 0.2
    # A file saved before the option was trained without it, and loads so.
    old = {k: v for k, v in model.get_config().items() if k != "mixture_dropout"}
    assert LanguageModel.from_config(old).mixture.dropout == 0.0
    with pytest.raises(ValueError, match="Expected `mixture_dropout` only with a mixture"):
        LanguageModel(V, units=8, mixture_dropout=0.2)
    with pytest.raises(ValueError, match="Expected `mixture_dropout` to be a float"):
        LanguageModel(V, units=8, mixture_of_softmaxes=2, mixture_dropout=1.5)


def test_training_drops_the_mixtures_contexts_and_inference_does_not():
    x = ids((2, 6))
    plain = make_model(mixture_dropout=0.0)
    features, log_p = plain.features_and_logits(x, training=True)
    np.testing.assert_allclose(to_numpy(log_p), reference_log_probs(
        plain, to_numpy(features), 1.0), atol=2e-5)
    dropped = make_model(mixture_dropout=0.5)  # the same weights, no other dropout
    features, log_p = dropped.features_and_logits(x, training=True)
    assert not np.allclose(to_numpy(log_p), reference_log_probs(
        dropped, to_numpy(features), 1.0), atol=1e-3)
    np.testing.assert_allclose(np.exp(to_numpy(log_p)).sum(-1), 1.0, atol=1e-5)
    dropped.reset_states()
    features, log_p = dropped.features_and_logits(x)
    np.testing.assert_allclose(to_numpy(log_p), reference_log_probs(
        dropped, to_numpy(features), 1.0), atol=2e-5)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2", None])
def test_bad_k_is_refused_saying_expected_and_received(bad):
    with pytest.raises(ValueError, match="Expected `mixture_of_softmaxes`.*Received"):
        LanguageModel(V, mixture_of_softmaxes=bad)
    with pytest.raises(ValueError, match="Expected `components`.*Received"):
        MixtureOfSoftmaxes(bad, 4)
    with pytest.raises(ValueError, match="Expected `components`"):
        MixtureOfSoftmaxes(0, 4)


# === The model ===


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"k": 1},
        {"k": 3, "embedding_dim": 5},  # no projection: W_p maps to the width
        {"tie_embeddings": False},
        {"dual": True, "dual_units": 6},
    ],
)
def test_model_output_is_the_mixture_of_its_weights(options):
    options = dict(options)
    model = make_model(k=options.pop("k", 2), temperature=0.8, **options)
    assert model.projection is None
    features, log_p = model.features_and_logits(ids((2, 6)))
    log_p = to_numpy(log_p)
    np.testing.assert_allclose(np.exp(log_p).sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(
        log_p, reference_log_probs(model, to_numpy(features), 0.8), atol=2e-5
    )


def test_k_zero_is_the_single_softmax_exactly():
    x = ids((2, 7))
    models = []
    for extra in ({}, {"mixture_of_softmaxes": 0}):
        keras.utils.set_random_seed(3)
        model = LanguageModel(V, units=8, num_layers=2, batch_size=2, embedding_dim=6,
                              seed=0, name="lm", **extra)
        model.build((2, None))
        models.append(model)
    plain, zero = models
    assert zero.mixture is None and zero.projection is not None
    assert [v.path for v in plain.weights] == [v.path for v in zero.weights]
    for a, b in zip(plain.weights, zero.weights):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    np.testing.assert_array_equal(to_numpy(plain(x)), to_numpy(zero(x)))
    assert zero.get_config()["mixture_of_softmaxes"] == 0


def _centred_rank(log_p):
    log_p = log_p - log_p.mean(-1, keepdims=True)
    s = np.linalg.svd(log_p.astype("float64"), compute_uv=False)
    return int(np.sum(s > 1e-4 * s[0]))


def test_softmax_bottleneck_rank():
    # 200 contexts, softmax input width 4, vocabulary 30.
    width, vocab = 4, 30
    x = np.random.default_rng(5).integers(0, vocab, (20, 10)).astype("int32")
    ranks = {}
    for k in (0, 3):
        model = LanguageModel(vocab, units=width, num_layers=1, cell="lstm",
                              stateful=False, mixture_of_softmaxes=k)
        model.build((None, None))
        rng = np.random.default_rng(0)
        for v in model.trainable_weights:
            v.assign(rng.normal(scale=1.5, size=v.shape))
        log_p = to_numpy(model(x)).reshape(-1, vocab)
        assert log_p.shape == (200, vocab)
        ranks[k] = _centred_rank(log_p)
    assert ranks[0] <= width + 1
    assert ranks[3] > width + 1 + 5


# === Consumers ===


def test_iwae_loss_with_samples_on_mixture_outputs():
    model = make_model(samples=3, output_dropout=0.4, input_dropout=0.3)
    x, y = ids((2, 5)), ids((2, 5), seed=2)
    features, log_p = model.features_and_logits(x, training=True)
    log_p, features = to_numpy(log_p), to_numpy(features)
    assert log_p.shape == (2, 3, 5, V)
    # Training: no temperature; D samples differ (dropout).
    np.testing.assert_allclose(log_p, reference_log_probs(model, features, 1.0), atol=2e-5)
    assert not np.allclose(log_p[:, 0], log_p[:, 1])
    loss = float(to_numpy(IWAEDropoutLoss()(y, log_p)))
    target = np.take_along_axis(log_p, np.broadcast_to(y[:, None, :, None], (2, 3, 5, 1)),
                                -1)[..., 0]
    expected = -np.mean(_logsumexp(target, axis=1) - np.log(3))
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


def test_metrics_on_mixture_outputs():
    model = make_model(temperature=0.9)
    x, y = ids((2, 6)), ids((2, 6), seed=2)
    model.compile(loss=IWAEDropoutLoss(), metrics=[Perplexity()])
    features, _ = model.features_and_logits(x)
    model.reset_states()
    result = model.evaluate(x, y, batch_size=2, verbose=0, return_dict=True)
    log_p = reference_log_probs(model, to_numpy(features), 0.9)
    nll = -np.take_along_axis(log_p, y[..., None], -1).mean()
    np.testing.assert_allclose(result["loss"], nll, rtol=1e-5)
    np.testing.assert_allclose(result["perplexity"], np.exp(nll), rtol=1e-5)


def test_chunked_target_log_probabilities_equal_the_full_mixture():
    model = make_model(embedding_dim=5, temperature=0.7)
    x, y = ids((2, 9)), ids((2, 9), seed=2)
    features, log_p = model.features_and_logits(x)
    full = np.take_along_axis(to_numpy(log_p), y[..., None], -1)[..., 0]
    chunked = model.target_log_probabilities(features, y, chunk_size=4, temperature=0.7)
    np.testing.assert_allclose(to_numpy(chunked), full, atol=2e-5)


def test_chunked_training_equals_unchunked_training():
    # The same step (loss, every gradient, MoS weights included) with and
    # without the chunked softmax: the weights after one SGD step agree.
    # With dropout (the mixture's included), so the two samples differ and
    # the chunked path must draw the masks the unchunked one draws.
    x, y = ids((2, 6)), ids((2, 6), seed=2)
    dropout = dict(input_dropout=0.2, output_dropout=0.3, mixture_dropout=0.4)
    probe = make_model(embedding_dim=5, samples=2, scale=0.3, **dropout)
    _, log_p = probe.features_and_logits(x, training=True)
    assert not np.allclose(to_numpy(log_p)[:, 0], to_numpy(log_p)[:, 1])
    results = []
    for chunk in (None, 4):
        model = make_model(embedding_dim=5, samples=2, softmax_chunk_size=chunk, scale=0.3,
                           **dropout)
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss=IWAEDropoutLoss(),
                      metrics=[Perplexity()])
        history = model.fit(x, y, batch_size=2, epochs=1, verbose=0)
        results.append((history.history, [to_numpy(v) for v in model.trainable_weights]))
    (h0, w0), (h1, w1) = results
    np.testing.assert_allclose(h0["loss"], h1["loss"], rtol=1e-5)
    np.testing.assert_allclose(h0["perplexity"], h1["perplexity"], rtol=1e-5)
    moved = False
    for a, b, before in zip(w0, w1, make_model(embedding_dim=5, samples=2, scale=0.3,
                                              **dropout).trainable_weights):
        np.testing.assert_allclose(a, b, atol=2e-5)
        moved = moved or not np.allclose(a, to_numpy(before))
    assert moved


def _stream_reference(model, stream, temperature):
    # One pass over the whole stream from zero state (one stream).
    model.reset_states()
    features, _ = model.features_and_logits(stream[None, :-1])
    model.reset_states()
    log_p = reference_log_probs(model, to_numpy(features), temperature)[0]
    return -np.take_along_axis(log_p, stream[1:, None], -1)[:, 0]


def test_temperature_search_recomputes_each_component_softmax():
    model = make_model(batch_size=1, scale=0.8)
    stream = ids((40,), seed=4)
    taus = (1.0, 0.8, 0.6)
    result = search_temperature(model, stream, batch_size=1, sequence_length=7,
                                temperatures=taus, apply=False)
    for tau in taus:
        expected = _stream_reference(model, stream, tau).mean()
        np.testing.assert_allclose(result["losses"][tau], expected, rtol=1e-5)
    # Scaling the mixture's log-probabilities after the fact differs.
    model.reset_states()
    log_p = to_numpy(model(stream[None, :-1]))[0].astype("float64")
    scaled = 0.6 * log_p
    posthoc = (_logsumexp(scaled, -1) - np.take_along_axis(scaled, stream[1:, None], -1)[:, 0])
    assert abs(posthoc.mean() - result["losses"][0.6]) > 1e-3
    static = evaluate_stream(model, stream, temperature=0.8, sequence_length=7)
    np.testing.assert_allclose(static["loss"], result["losses"][0.8], rtol=1e-5)


@pytest.mark.parametrize("units", [8, V])  # chunked features; width = vocab: unchunked
def test_mc_dropout_with_temperature_on_a_mixture(units):
    model = make_model(units=units, batch_size=1, scale=0.3)
    stream = ids((30,), seed=6)
    result = mc_dropout_evaluate(model, stream, passes=1, batch_size=1, sequence_length=6,
                                 temperature=0.7, chunk_size=5)
    # No dropout: one pass is the deterministic model at τ = 0.7.
    expected = _stream_reference(model, stream, 0.7).mean()
    np.testing.assert_allclose(result["loss"], expected, rtol=1e-5)


@pytest.mark.parametrize("sparse", [False, True])
def test_dynamic_evaluation_on_a_mixture(sparse, monkeypatch):
    options = {"cell": "mogrifier_lstm"}
    if sparse:
        options["adaptation_units"] = 4
    model = make_model(batch_size=1, scale=0.3, temperature=0.9, **options)
    stream = ids((26,), seed=7)
    ev = DynamicEvaluator(model, sparse=sparse, learning_rate=0.0, decay_rate=0.5,
                          segment_length=5)
    ev.collect_gradient_statistics(ids((120,), seed=8), batch_size=1, steps=4)
    dynamic = ev.evaluate(stream, verbose=0, return_token_losses=True)
    static = ev.evaluate(stream, verbose=0, adapt=False, return_token_losses=True)
    # η = 0 is static scoring segment by segment (to an ulp: under XLA the
    # adapting and the static loop are different compiled programmes);
    # static scoring in windows of many segments (the default) gives it to
    # float rounding.
    np.testing.assert_allclose(
        dynamic["token_losses"], static["token_losses"], rtol=1e-6, atol=1e-6
    )
    with monkeypatch.context() as per_segment:
        per_segment.setattr(_dynamic_pass, "WHOLE_WINDOW", False)
        segments = ev.evaluate(stream, verbose=0, adapt=False, return_token_losses=True)
    np.testing.assert_allclose(
        dynamic["token_losses"], segments["token_losses"], rtol=1e-6, atol=0
    )
    np.testing.assert_allclose(np.ravel(static["token_losses"]),
                               _stream_reference(model, stream, 0.9), rtol=1e-5, atol=1e-6)
    ev = DynamicEvaluator(model, sparse=sparse, learning_rate=3e-2, decay_rate=0.01,
                          segment_length=5)
    ev.collect_gradient_statistics(ids((120,), seed=8), batch_size=1, steps=4)
    adapted = ev.evaluate(stream, verbose=0, return_token_losses=True)
    assert np.all(np.isfinite(adapted["token_losses"]))
    assert not np.allclose(adapted["token_losses"], static["token_losses"])


def test_neural_cache_on_a_mixture():
    # Krause et al.'s eq. 3 with the mixture as p_model, from the model's weights:
    # (1 - λ) p_mix(y) + λ Σ_{past i: y_i = y} softmax_i(θ h_t·h_i), h the mixture's input.
    model = make_model(batch_size=1, scale=0.4, temperature=0.9)
    stream = np.tile(ids((5,), seed=10), 7)[:33]  # period 5, inside the window
    cache = NeuralCache(model, cache_size=7, interpolation=0.3, flatness=0.4,
                        segment_length=5)
    result = cache.evaluate(stream, verbose=0, return_token_losses=True)
    model.reset_states()
    features, _ = model.features_and_logits(stream[None, :-1])
    model.reset_states()
    h = to_numpy(features)[0].astype("float64")
    assert h.shape[-1] == model.softmax_width
    log_p = reference_log_probs(model, h[None], 0.9)[0]
    expected = reference.neural_cache_losses(h, log_p, stream[1:], 7, 0.3, 0.4)
    np.testing.assert_allclose(result["token_losses"][0], expected, rtol=2e-5, atol=2e-6)
    cache.interpolation = 0.0
    static = cache.evaluate(stream, verbose=0)
    np.testing.assert_allclose(static["loss"], _stream_reference(model, stream, 0.9).mean(),
                               rtol=1e-5)
    assert result["loss"] < static["loss"]  # the repeated passage is in the cache


def test_score_and_greedy_generation_on_a_mixture():
    model = make_model(batch_size=1, temperature=0.9)
    text = ids((12,), seed=9)
    scored = model.score(text)
    expected = _stream_reference(model, text, 0.9)
    np.testing.assert_allclose(scored["token_log_probabilities"], -expected, rtol=1e-5,
                               atol=1e-6)
    prompt = text[:4]
    out = np.asarray(model.generate(prompt, max_length=8, stop_token_ids=None))
    # Greedy: each new token is the argmax of the mixture given the prefix.
    for t in range(4, 8):
        model.reset_states()
        features, _ = model.features_and_logits(out[None, :t])
        log_p = reference_log_probs(model, to_numpy(features), 0.9)[0, -1]
        assert out[t] == int(np.argmax(log_p))


def test_save_and_load_round_trip(tmp_path):
    # Not stateful: the call before saving would move the carried state.
    model = make_model(dual=True, embedding_dim=6, temperature=0.85, stateful=False)
    x = ids((2, 5))
    loaded = assert_saved_model_round_trip(model, x, tmp_path, atol=1e-5)
    assert loaded.mixture_of_softmaxes == 2
    assert isinstance(loaded.mixture, MixtureOfSoftmaxes)
    assert km.MixtureOfSoftmaxes is MixtureOfSoftmaxes


def test_with_options_keeps_the_mixture_and_refuses_changing_it():
    model = make_model()
    clone = model.with_options(batch_size=1)
    assert clone.mixture_of_softmaxes == 2
    x = ids((1, 5))
    model.reset_states()
    np.testing.assert_allclose(to_numpy(clone(x)), to_numpy(model(x)), atol=1e-6)
    with pytest.raises(ValueError, match="mixture_of_softmaxes"):
        model.with_options(mixture_of_softmaxes=0)


def test_hypermodel_searches_k():
    keras_tuner = pytest.importorskip("keras_tuner")
    from keras_mogrifier.tuning import LanguageModelHyperModel

    hypermodel = LanguageModelHyperModel(
        V, batch_size=2, sequence_length=5,
        fixed={"units": 8, "num_layers": 1, "jit_compile": False},
    )
    assert hypermodel.search_space["mixture_of_softmaxes"]["values"] == [0, 2]
    hp = keras_tuner.HyperParameters()
    assert hypermodel.build(hp).mixture_of_softmaxes == 0
    hp.values["mixture_of_softmaxes"] = 2
    model = hypermodel.build(hp)
    assert model.mixture_of_softmaxes == 2 and model.mixture is not None
    fixed = LanguageModelHyperModel(
        V, batch_size=2, sequence_length=5,
        fixed={"units": 8, "num_layers": 1, "mixture_of_softmaxes": 2},
    )
    assert "mixture_of_softmaxes" not in fixed.search_space
    with pytest.raises(ValueError, match="mixture_of_softmaxes"):
        LanguageModelHyperModel(V, fixed={"mixture_of_softmaxes": -1})

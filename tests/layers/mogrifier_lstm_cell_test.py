import numpy as np
import pytest
import keras

import keras_mogrifier as km

import reference
from testing import to_numpy

B, T, M, N = 3, 7, 5, 8


def _xs(seed=0, scale=1.0):
    return np.random.default_rng(seed).normal(scale=scale, size=(B, T, M)).astype("float32")


def _run(cell, xs, **kwargs):
    rnn = keras.layers.RNN(cell, return_sequences=True, return_state=True)
    out, h, c = rnn(xs, **kwargs)
    return rnn, to_numpy(out), to_numpy(h), to_numpy(c)


def _randomize(layer, seed=1, scale=0.4):
    rng = np.random.default_rng(seed)
    values = [rng.normal(scale=scale, size=w.shape) for w in layer.get_weights()]
    layer.set_weights(values)
    return values


@pytest.mark.parametrize("rounds, rank", [(0, None), (1, None), (5, 3), (4, None)])
@pytest.mark.parametrize("capped", [True, False])
@pytest.mark.parametrize("use_bias", [True, False])
def test_matches_numpy_reference(rounds, rank, capped, use_bias):
    xs = _xs()
    cell = km.MogrifierLSTMCell(
        N, mogrifier_rounds=rounds, mogrifier_rank=rank,
        capped_input_gate=capped, use_bias=use_bias,
    )
    rnn, _, _, _ = _run(cell, xs)
    _randomize(rnn)
    _, out, h, c = _run(cell, xs)
    weights = {
        "kernel": to_numpy(cell.kernel),
        "recurrent_kernel": to_numpy(cell.recurrent_kernel),
        "bias": None if cell.bias is None else to_numpy(cell.bias),
        "capped": capped,
    }
    rounds_ref = []
    if cell.mogrifier is not None:
        mw = cell.mogrifier.get_weights()
        per = (1 if rank is None else 2) + 1
        rounds_ref = [(mw[i * per : i * per + per - 1], mw[i * per + per - 1]) for i in range(rounds)]
    out_ref, h_ref, c_ref = reference.run_sequence(
        reference.lstm_step, xs, N, rounds=rounds_ref, **weights
    )
    np.testing.assert_allclose(out, out_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(h, h_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(c, c_ref, rtol=1e-4, atol=1e-5)


def test_equals_keras_lstm_cell_with_its_weights():
    xs = _xs(scale=2.0)
    keras_rnn = keras.layers.RNN(keras.layers.LSTMCell(N), return_sequences=True, return_state=True)
    keras_rnn(xs)
    _randomize(keras_rnn, scale=0.6)
    expected = keras_rnn(xs)
    cell = km.MogrifierLSTMCell(N, mogrifier_rounds=0, capped_input_gate=False)
    rnn = keras.layers.RNN(cell, return_sequences=True, return_state=True)
    rnn.build(xs.shape)
    # The layout is Keras's: LSTM weights load straight in.
    cell.kernel.assign(keras_rnn.cell.kernel)
    cell.recurrent_kernel.assign(keras_rnn.cell.recurrent_kernel)
    cell.bias.assign(keras_rnn.cell.bias)
    actual = rnn(xs)
    for a, e in zip(actual, expected):  # outputs, h, c
        np.testing.assert_allclose(to_numpy(a), to_numpy(e), rtol=1e-6, atol=1e-6)


def test_weight_layout_and_mogrifier_sublayer():
    cell = km.MogrifierLSTMCell(N, mogrifier_rounds=3, mogrifier_rank=2)
    cell.build((None, M))
    assert tuple(cell.kernel.shape) == (M, 4 * N)
    assert tuple(cell.recurrent_kernel.shape) == (N, 4 * N)
    assert tuple(cell.bias.shape) == (4 * N,)
    assert isinstance(cell.mogrifier, km.Mogrifier)
    assert cell.mogrifier.rounds == 3 and cell.mogrifier.rank == 2
    assert cell.state_size == [N, N] and cell.output_size == N
    assert km.MogrifierLSTMCell(N, mogrifier_rounds=0).mogrifier is None
    # Defaults of the issue: 5 rounds, capped input gate.
    default = km.MogrifierLSTMCell(N)
    assert default.mogrifier_rounds == 5 and default.capped_input_gate


def test_state_order_is_h_then_c():
    xs = _xs()
    cell = km.MogrifierLSTMCell(N, mogrifier_rounds=2)
    _, out, h, c = _run(cell, xs)
    np.testing.assert_array_equal(out[:, -1], h)
    assert not np.allclose(h, c)


def test_zero_mogrifier_weights_equal_plain_lstm_step():
    xs = _xs()
    mog = km.MogrifierLSTMCell(N, mogrifier_rounds=5, mogrifier_rank=3)
    plain = km.MogrifierLSTMCell(N, mogrifier_rounds=0)
    rnn_m, _, _, _ = _run(mog, xs)
    rnn_p, _, _, _ = _run(plain, xs)
    _randomize(rnn_p)
    mog.kernel.assign(plain.kernel)
    mog.recurrent_kernel.assign(plain.recurrent_kernel)
    mog.bias.assign(plain.bias)
    for w in mog.mogrifier.weights:
        w.assign(np.zeros(w.shape))
    np.testing.assert_allclose(_run(mog, xs)[1], _run(plain, xs)[1], atol=1e-6)


def test_unit_forget_bias_and_chrono():
    cell = km.MogrifierLSTMCell(N, mogrifier_rounds=0)
    cell.build((None, M))
    b = to_numpy(cell.bias)
    np.testing.assert_array_equal(b[N : 2 * N], 1.0)
    np.testing.assert_array_equal(b[:N], 0.0)
    t_max = 60.0
    cell = km.MogrifierLSTMCell(N * 8, mogrifier_rounds=0, chrono_t_max=t_max, seed=2)
    cell.build((None, M))
    n = cell.units
    b = to_numpy(cell.bias)
    forget, inp = b[n : 2 * n], b[:n]
    assert forget.min() >= 0.0 and forget.max() <= np.log(t_max - 1) + 1e-6
    assert forget.std() > 0.3  # spread over the range, not a constant
    np.testing.assert_allclose(inp, -forget)
    np.testing.assert_array_equal(b[2 * n :], 0.0)
    # Forget bias only (Circling Back §3's wording): the input bias stays 0.
    cell = km.MogrifierLSTMCell(
        N * 8, mogrifier_rounds=0, chrono_t_max=t_max, chrono_input_bias=False, seed=2
    )
    cell.build((None, M))
    b = to_numpy(cell.bias)
    np.testing.assert_array_equal(b[:n], 0.0)
    assert b[n : 2 * n].min() >= 0.0 and b[n : 2 * n].std() > 0.3

import numpy as np
import pytest
import keras

import keras_mogrifier as km

import reference
from testing import backend_specific
from testing import to_numpy

B, T, M, N = 3, 7, 5, 8


def _xs(seed=0, scale=1.0, time=T):
    return np.random.default_rng(seed).normal(scale=scale, size=(B, time, M)).astype("float32")


def _randomize(layer, seed=1, scale=0.4):
    rng = np.random.default_rng(seed)
    layer.set_weights([rng.normal(scale=scale, size=w.shape) for w in layer.get_weights()])


def _weights(cell):
    return {
        "kernel": to_numpy(cell.kernel),
        "recurrent_kernel": to_numpy(cell.recurrent_kernel),
        "forget_kernel": to_numpy(cell.forget_kernel),
        "output_kernel": to_numpy(cell.output_kernel),
        "bias": None if cell.bias is None else to_numpy(cell.bias),
    }


def _mogrifier_rounds(cell):
    if cell.mogrifier is None:
        return []
    mw = cell.mogrifier.get_weights()
    per = (1 if cell.mogrifier_rank is None else 2) + 1
    return [(mw[i * per : i * per + per - 1], mw[i * per + per - 1]) for i in range(cell.mogrifier_rounds)]


@pytest.mark.parametrize("rounds, rank", [(0, None), (3, 2), (2, None)])
@pytest.mark.parametrize("use_bias", [True, False])
def test_matches_numpy_reference(rounds, rank, use_bias):
    xs = _xs()
    cell = km.RLSTMCell(N, mogrifier_rounds=rounds, mogrifier_rank=rank, use_bias=use_bias)
    rnn = keras.layers.RNN(cell, return_sequences=True, return_state=True)
    rnn(xs)
    _randomize(rnn)
    out, h, c = (to_numpy(t) for t in rnn(xs))
    out_ref, h_ref, c_ref = reference.run_sequence(
        reference.rlstm_step, xs, N, rounds=_mogrifier_rounds(cell), **_weights(cell)
    )
    np.testing.assert_allclose(out, out_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(h, h_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(c, c_ref, rtol=1e-4, atol=1e-5)


def test_weight_layout():
    cell = km.RLSTMCell(N)
    cell.build((None, M))
    names = [w.path.split("/")[-1] for w in cell.weights]
    assert names == ["kernel", "recurrent_kernel", "forget_kernel", "output_kernel", "bias"]
    assert [tuple(w.shape) for w in cell.weights] == [
        (M, 2 * N), (N, 3 * N), (N, N), (N, N), (4 * N,)
    ]
    assert cell.mogrifier is None
    b = to_numpy(cell.bias)
    np.testing.assert_array_equal(b[2 * N : 3 * N], 1.0)  # unit forget bias (i, j, f, o)
    cell = km.RLSTMCell(N, mogrifier_rounds=4, mogrifier_rank=3)
    assert isinstance(cell.mogrifier, km.Mogrifier)


def test_cell_is_bounded_over_long_sequences_with_large_weights():
    xs = _xs(scale=20.0, time=500)
    cell = km.RLSTMCell(N, mogrifier_rounds=3)
    rnn = keras.layers.RNN(cell, return_sequences=True, return_state=True)
    rnn(xs[:, :2])
    _randomize(rnn, scale=8.0)
    # Drive the forget gate towards 1 and the input gate too: the cap holds.
    bias = to_numpy(cell.bias).copy()
    bias[: 3 * N] = 10.0
    cell.bias.assign(bias)
    c_all = []
    state = None
    for start in range(0, 500, 50):
        outs = rnn(xs[:, start : start + 50], initial_state=state)
        state = list(outs[1:])
        c_all.append(to_numpy(outs[2]))
    assert np.max(np.abs(np.stack(c_all))) <= 1.0
    assert np.all(np.abs(to_numpy(outs[0])) <= 1.0)


def test_state_mask_also_multiplies_c_in_output_gate():
    rng = np.random.default_rng(5)
    cell = km.RLSTMCell(N, mogrifier_rounds=2, dropout=0.3, recurrent_dropout=0.4, seed=1)
    cell.build((None, M))
    _randomize(cell)
    input_mask = (rng.random((B, M)) > 0.3) / 0.7
    state_mask = (rng.random((B, N)) > 0.4) / 0.6
    # The masks the mixin would have drawn for this sequence.
    cell._dropout_mask = keras.ops.convert_to_tensor(input_mask, "float32")
    cell._recurrent_dropout_mask = keras.ops.convert_to_tensor(state_mask, "float32")
    xs = _xs()
    h = np.zeros((B, N), "float32")
    c = np.zeros((B, N), "float32")
    outs = []
    for t in range(T):
        out, (h, c) = cell(xs[:, t], [h, c], training=True)
        outs.append(to_numpy(out))
    out_ref, _, c_ref = reference.run_sequence(
        reference.rlstm_step, xs, N, rounds=_mogrifier_rounds(cell),
        input_mask=input_mask, state_mask=state_mask, **_weights(cell),
    )
    np.testing.assert_allclose(np.stack(outs, 1), out_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(to_numpy(c), c_ref, rtol=1e-4, atol=1e-5)


def test_chrono_like_every_cell_input_bias_is_minus_forget_bias():
    """Chrono (Tallec & Ollivier 2018, arXiv 1804.11188): `b_f ~ log U(1,
    T_max − 1)` and `b_i = −b_f`, as `MogrifierLSTMCell` does and
    `ChronoInitializer`'s docstring says of every cell; Circling Back §3
    (seed 000, line 87) names only the forget gate: `chrono_input_bias=False`.
    Bias blocks of the RLSTM: i, j, f, o."""
    t_max = 40.0
    cell = km.RLSTMCell(64, chrono_t_max=t_max, seed=3)
    cell.build((None, M))
    b = to_numpy(cell.bias)
    forget = b[128:192]
    assert forget.min() >= 0.0 and forget.max() <= np.log(t_max - 1) + 1e-6
    assert forget.std() > 0.3  # spread over the range, not a constant
    np.testing.assert_allclose(b[:64], -forget)
    np.testing.assert_array_equal(b[64:128], 0.0)
    np.testing.assert_array_equal(b[192:], 0.0)

    cell = km.RLSTMCell(64, chrono_t_max=t_max, chrono_input_bias=False, seed=3)
    cell.build((None, M))
    b = to_numpy(cell.bias)
    np.testing.assert_array_equal(b[:128], 0.0)
    assert b[128:192].min() >= 0.0 and b[128:192].std() > 0.3
    assert cell.get_config()["chrono_input_bias"] is False


@backend_specific("torch", reason="torch.compile is PyTorch's compiler")
def test_gate_weights_stay_in_a_torch_compile_graph():
    # The bias's split into the input's (i, j, f) and the output gate's part
    # is a slice: no value read back to the host, no graph break.
    import torch

    cell = km.RLSTMCell(4)
    cell.build((None, 3))
    cell.bias.assign(np.arange(16, dtype="float32"))
    explanation = torch._dynamo.explain(cell.gate_weights)("float32")
    assert explanation.graph_break_count == 0, explanation.break_reasons
    weights = cell.gate_weights("float32")
    np.testing.assert_array_equal(to_numpy(weights["input_bias"]), np.arange(12))
    np.testing.assert_array_equal(to_numpy(weights["output_bias"]), np.arange(12, 16))

"""Properties shared by both cells: dropout masks, adaptation, errors, dtypes."""

import numpy as np
import pytest
import keras

import keras_mogrifier as km

import reference
from testing import JIT_COMPILE
from testing import jit_layer_call
from testing import to_numpy
from testing import value_and_gradients

B, T, M, N = 4, 6, 5, 8
CELLS = [km.MogrifierLSTMCell, km.RLSTMCell]


def _xs(seed=0, time=T):
    return np.random.default_rng(seed).normal(size=(B, time, M)).astype("float32")


def _record_masks(cell):
    """Wraps the mixin's mask factory to record every mask drawn."""
    drawn = []
    original = cell._create_dropout_mask

    def recording(step_input, rate):
        mask = original(step_input, rate)
        drawn.append(mask)
        return mask

    cell._create_dropout_mask = recording
    return drawn


def test_private_dropout_mixin_import():
    # The private path the cells depend on (pinned Keras range).
    from keras.src.layers.rnn.dropout_rnn_cell import DropoutRNNCell

    major, minor = (int(v) for v in keras.__version__.split(".")[:2])
    assert (3, 10) <= (major, minor) < (3, 16)
    for cls in CELLS:
        assert issubclass(cls, DropoutRNNCell)


@pytest.mark.parametrize("cls", CELLS)
def test_masks_are_constant_over_time_within_a_sequence(cls):
    xs = _xs()
    cell = cls(N, mogrifier_rounds=3, dropout=0.4, recurrent_dropout=0.5, seed=7)
    rnn = keras.layers.RNN(cell, return_sequences=True)
    rnn(xs)
    drawn = _record_masks(cell)
    out = to_numpy(rnn(xs, training=True))
    assert len(drawn) == 2  # one input mask, one state mask, for all steps
    input_mask, state_mask = (to_numpy(m) for m in drawn)
    assert input_mask.shape == (B, M) and state_mask.shape == (B, N)
    np.testing.assert_allclose(np.unique(input_mask), [0.0, 1 / 0.6], rtol=1e-6)
    # The reference applies these two masks at every time step.
    step = reference.lstm_step if cls is km.MogrifierLSTMCell else reference.rlstm_step
    per = 2
    mw = cell.mogrifier.get_weights()
    rounds = [(mw[i * per : i * per + 1], mw[i * per + 1]) for i in range(3)]
    weights = {"kernel": to_numpy(cell.kernel), "recurrent_kernel": to_numpy(cell.recurrent_kernel), "bias": to_numpy(cell.bias)}
    if cls is km.RLSTMCell:
        weights.update(forget_kernel=to_numpy(cell.forget_kernel), output_kernel=to_numpy(cell.output_kernel))
    out_ref, _, _ = reference.run_sequence(
        step, xs, N, rounds=rounds, input_mask=input_mask, state_mask=state_mask, **weights
    )
    np.testing.assert_allclose(out, out_ref, rtol=1e-4, atol=1e-5)
    # Masks are released after the call, not reused by the next sequence.
    assert cell._dropout_mask is None and cell._recurrent_dropout_mask is None


@pytest.mark.parametrize("cls", CELLS)
@pytest.mark.compiled
def test_masks_differ_between_sequences_under_jit(cls):
    xs = _xs()
    cell = cls(N, mogrifier_rounds=2, dropout=0.3, recurrent_dropout=0.3)
    rnn = keras.layers.RNN(cell, return_sequences=True)
    rnn(xs)
    # tf.function(jit_compile=True) / jax.jit with the seeds threaded through
    # (eager on PyTorch: see `testing.jit`).
    run = jit_layer_call(rnn)

    a, b = to_numpy(run(xs, True)), to_numpy(run(xs, True))
    assert not np.allclose(a, b)  # new masks for every call (second trace too)
    e1, e2 = to_numpy(run(xs, False)), to_numpy(run(xs, False))
    np.testing.assert_array_equal(e1, e2)  # no dropout at evaluation
    np.testing.assert_allclose(e1, to_numpy(rnn(xs)), atol=1e-5)


@pytest.mark.parametrize("cls", CELLS)
def test_adaptation_matrix(cls):
    xs = _xs()
    plain = cls(N, mogrifier_rounds=2, seed=1)
    adapted = cls(N, mogrifier_rounds=2, adaptation_units=3, seed=1)
    rp = keras.layers.RNN(plain, return_sequences=True)
    ra = keras.layers.RNN(adapted, return_sequences=True)
    rp(xs), ra(xs)
    assert tuple(adapted.adaptation_kernel.shape) == (3, 3)
    assert not adapted.adaptation_kernel.trainable
    assert id(adapted.adaptation_kernel) not in {id(w) for w in ra.trainable_weights}
    for w in plain.weights:
        name = w.path.split("/", 2)[-1]
        next(v for v in adapted.weights if v.path.split("/", 2)[-1] == name).assign(w)
    # Zero matrix: inert.
    np.testing.assert_allclose(to_numpy(ra(xs)), to_numpy(rp(xs)), atol=1e-6)
    # Non-zero: h'[:, :3] = h[:, :3] + h[:, :3] @ M, fed back into the recurrence.
    mat = np.random.default_rng(2).normal(scale=0.5, size=(3, 3)).astype("float32")
    adapted.adaptation_kernel.assign(mat)
    h = np.zeros((B, N), "float32")
    c = np.zeros((B, N), "float32")
    outs = []
    for t in range(T):
        h, (_, c) = plain(xs[:, t], [h, c])
        h = to_numpy(h).copy()
        h[:, :3] += h[:, :3] @ mat
        outs.append(h)
    np.testing.assert_allclose(to_numpy(ra(xs)), np.stack(outs, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls", CELLS)
def test_adaptation_per_stream(cls):
    xs = _xs()
    cell = cls(N, mogrifier_rounds=0, adaptation_units=N, adaptation_streams=B)
    rnn = keras.layers.RNN(cell, return_sequences=True)
    base = to_numpy(rnn(xs))
    assert tuple(cell.adaptation_kernel.shape) == (B, N, N)
    mats = np.zeros((B, N, N), "float32")
    mats[1] = 0.3 * np.eye(N)
    cell.adaptation_kernel.assign(mats)
    out = to_numpy(rnn(xs))
    np.testing.assert_allclose(out[[0, 2, 3]], base[[0, 2, 3]], atol=1e-6)
    assert not np.allclose(out[1], base[1])


@pytest.mark.parametrize("cls", CELLS)
def test_gradients_are_finite(cls):
    xs = _xs() * 10
    rnn = keras.layers.RNN(cls(N, mogrifier_rounds=5, mogrifier_rank=2, dropout=0.1, recurrent_dropout=0.1), return_sequences=True)
    rnn(xs)
    sources = rnn.trainable_weights + [xs]
    loss, grads = value_and_gradients(
        lambda x: keras.ops.sum(rnn(x, training=True) ** 2), sources
    )
    assert np.isfinite(loss)
    assert len(grads) == len(sources)
    assert all(np.all(np.isfinite(g)) and np.any(g != 0) for g in grads)


@pytest.mark.parametrize("cls", CELLS)
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(cls, policy):
    keras.config.set_dtype_policy(policy)
    xs = _xs()
    layer = keras.layers.RNN(cls(N, mogrifier_rounds=3, mogrifier_rank=2, recurrent_dropout=0.2), return_sequences=True)
    out = layer(xs, training=True)
    assert keras.backend.standardize_dtype(out.dtype) == policy.split("_")[1]
    assert all(w.dtype == "float32" for w in layer.weights)
    assert np.all(np.isfinite(keras.ops.convert_to_numpy(keras.ops.cast(out, "float32"))))
    model = keras.Sequential([keras.Input((T, M)), layer, keras.layers.Dense(1, dtype="float32")])
    model.compile("adam", "mse", jit_compile=JIT_COMPILE)
    hist = model.fit(xs, np.ones((B, T, 1)), epochs=2, verbose=0)
    assert np.all(np.isfinite(hist.history["loss"]))


@pytest.mark.parametrize("cls", CELLS)
@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"units": 0}, "units"),
        ({"units": -4}, "units"),
        ({"units": 2.0}, "units"),
        ({"mogrifier_rounds": -1}, "mogrifier_rounds"),
        ({"mogrifier_rank": 0}, "mogrifier_rank"),
        ({"mogrifier_rank": N + 1}, "mogrifier_rank"),
        ({"dropout": 1.0}, "dropout"),
        ({"dropout": -0.1}, "dropout"),
        ({"recurrent_dropout": 1.5}, "recurrent_dropout"),
        ({"chrono_t_max": 1.5}, "t_max"),
        ({"adaptation_units": N + 1}, "adaptation_units"),
        ({"adaptation_streams": 2}, "adaptation_units"),
    ],
)
def test_bad_arguments(cls, kwargs, name):
    args = {"units": N, "mogrifier_rounds": 2}
    args.update(kwargs)
    with pytest.raises(ValueError, match=f"Expected `{name}`.*Received"):
        cls(**args)


@pytest.mark.parametrize("cls", CELLS)
def test_rank_larger_than_input_size(cls):
    cell = cls(N, mogrifier_rounds=2, mogrifier_rank=M + 1)
    with pytest.raises(ValueError, match=r"`mogrifier_rank`.*min\(5, 8\).*Received: mogrifier_rank=6"):
        keras.layers.RNN(cell)(_xs())


@pytest.mark.parametrize("cls", CELLS)
def test_config_round_trip(cls):
    cell = cls(N, mogrifier_rounds=3, mogrifier_rank=2, dropout=0.1, recurrent_dropout=0.2,
               chrono_t_max=30.0, adaptation_units=4, seed=3, kernel_regularizer="l2")
    config = cell.get_config()
    revived = cls.from_config(config)
    assert revived.get_config() == config
    assert set(dir(revived)) == set(dir(cell))

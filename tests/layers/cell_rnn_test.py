"""CellRNN (the fast path) computes what keras.layers.RNN(cell) computes.

`keras.layers.RNN(cell)` is the reference: every test builds both around
cells of the same configuration and seed, gives them the same weights and
compares outputs, states and gradients. Configurations with
`mogrifier_rounds=0` take the hoisted input projection; with rounds > 0 the
input is mogrified and only the weight reads leave the loop.
"""

import numpy as np
import pytest
import keras

import keras_mogrifier as km

from testing import JIT_COMPILE
from testing import jit_layer_call
from testing import to_numpy
from testing import value_and_gradients

B, T, M, N = 4, 6, 5, 8
CELLS = [km.MogrifierLSTMCell, km.RLSTMCell]
# (rounds, rank): hoisted input projection, then mogrified input.
ROUNDS = [(0, None), (3, 2)]


def _xs(seed=0, time=T):
    return np.random.default_rng(seed).normal(size=(B, time, M)).astype("float32")


def _pair(cls, rounds, rank, seed=3, cell_kwargs=None, **rnn_kwargs):
    """`keras.layers.RNN(cell)` and `CellRNN(cell)` with equal weights."""
    kwargs = dict(mogrifier_rounds=rounds, mogrifier_rank=rank, seed=seed)
    kwargs.update(cell_kwargs or {})
    reference = keras.layers.RNN(cls(N, **kwargs), **rnn_kwargs)
    fast = km.CellRNN(cls(N, **kwargs), **rnn_kwargs)
    xs = _xs()
    reference(xs)
    fast(xs)
    rng = np.random.default_rng(1)
    weights = [rng.normal(scale=0.4, size=w.shape) for w in reference.get_weights()]
    reference.set_weights(weights)
    fast.set_weights(weights)
    return reference, fast


def _assert_same(actual, expected, atol=1e-6):
    actual, expected = keras.tree.flatten(actual), keras.tree.flatten(expected)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(to_numpy(a), to_numpy(e), rtol=1e-5, atol=atol)


def _loss_and_gradients(layer, xs, training=False, **call_kwargs):
    def loss(x):
        out = keras.tree.flatten(layer(x, training=training, **call_kwargs))
        return sum(keras.ops.sum(o * o) for o in out)

    return value_and_gradients(loss, layer.trainable_weights + [xs])


def test_private_time_loop_import():
    # Keras's time loop, used by CellRNN (pinned Keras range).
    from keras.src.backend import rnn

    major, minor = (int(v) for v in keras.__version__.split(".")[:2])
    assert (3, 10) <= (major, minor) < (3, 16)
    assert callable(rnn)


@pytest.mark.parametrize("cls", CELLS)
@pytest.mark.parametrize("rounds, rank", ROUNDS)
def test_outputs_states_and_gradients(cls, rounds, rank):
    reference, fast = _pair(cls, rounds, rank, return_sequences=True, return_state=True)
    xs = _xs(2)
    _assert_same(fast(xs), reference(xs))
    loss, grads = _loss_and_gradients(fast, xs)
    loss_ref, grads_ref = _loss_and_gradients(reference, xs)
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-6)
    for g, g_ref in zip(grads, grads_ref):
        np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-5)
    assert all(np.any(g != 0) for g in grads)


@pytest.mark.parametrize("cls", CELLS)
@pytest.mark.parametrize("rounds, rank", ROUNDS)
def test_dropout_with_the_same_seed(cls, rounds, rank):
    reference, fast = _pair(
        cls, rounds, rank, cell_kwargs=dict(dropout=0.3, recurrent_dropout=0.4),
        return_sequences=True, return_state=True,
    )
    xs = _xs(2)
    # Same seeds, same draws: the masks are drawn once per sequence by
    # keras.layers.RNN in both (the fast path applies the input mask to every
    # time step before the hoisted projection).
    out, out_ref = fast(xs, training=True), reference(xs, training=True)
    _assert_same(out, out_ref)
    # (Keras draws the masks at evaluation too: both layers advance alike.)
    _assert_same(fast(xs), reference(xs))
    assert not np.allclose(to_numpy(out[0]), to_numpy(fast(xs)[0]))
    reference(xs)
    loss, grads = _loss_and_gradients(fast, xs, training=True)
    loss_ref, grads_ref = _loss_and_gradients(reference, xs, training=True)
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-6)
    for g, g_ref in zip(grads, grads_ref):
        np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-5)
    # The masks are released after the call, as keras.layers.RNN does.
    assert fast.cell._dropout_mask is None and fast.cell._recurrent_dropout_mask is None


# Keras's loop options against the cells: every two factors' values meet in
# some case (a covering array of strength 2: 5 cases instead of all 16; the
# cell's step and the loop's options are separate code).
MASKING_CASES = [
    (CELLS[0], *ROUNDS[0], False, False),
    (CELLS[0], *ROUNDS[1], True, True),
    (CELLS[1], *ROUNDS[0], True, True),
    (CELLS[1], *ROUNDS[1], False, True),
    (CELLS[1], *ROUNDS[1], True, False),
]


@pytest.mark.parametrize("cls, rounds, rank, go_backwards, zero_output_for_mask", MASKING_CASES)
def test_masking_and_go_backwards(cls, rounds, rank, go_backwards, zero_output_for_mask):
    reference, fast = _pair(
        cls, rounds, rank, return_sequences=True, return_state=True,
        go_backwards=go_backwards, zero_output_for_mask=zero_output_for_mask,
    )
    xs = _xs(2)
    mask = np.ones((B, T), bool)
    mask[0, 4:] = False
    mask[2, 2:] = False
    _assert_same(fast(xs, mask=mask), reference(xs, mask=mask))
    loss, grads = _loss_and_gradients(fast, xs, mask=mask)
    loss_ref, grads_ref = _loss_and_gradients(reference, xs, mask=mask)
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-6)
    for g, g_ref in zip(grads, grads_ref):
        np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls", CELLS)
@pytest.mark.parametrize("rounds, rank", ROUNDS)
def test_last_output_unroll_and_initial_state(cls, rounds, rank):
    reference, fast = _pair(cls, rounds, rank, return_state=True, unroll=True)
    xs = _xs(2)
    rng = np.random.default_rng(5)
    state = [rng.normal(size=(B, N)).astype("float32") for _ in range(2)]
    _assert_same(fast(xs, initial_state=state), reference(xs, initial_state=state))


@pytest.mark.parametrize("cls", CELLS)
@pytest.mark.parametrize("rounds, rank", ROUNDS)
def test_stateful(cls, rounds, rank):
    reference, fast = _pair(cls, rounds, rank, return_sequences=True, stateful=True)
    reference.reset_state()
    fast.reset_state()
    xs = _xs(2)
    for part in (xs[:, :2], xs[:, 2:]):
        _assert_same(fast(part), reference(part))
        _assert_same(fast.states, reference.states)
    # Gradients through a stateful call (on PyTorch the state variables are
    # written after the loop: nothing autograd saved may be written in place).
    loss, grads = value_and_gradients(
        lambda x: keras.ops.sum(fast(x) ** 2), fast.trainable_weights + [xs]
    )
    loss_ref, grads_ref = value_and_gradients(
        lambda x: keras.ops.sum(reference(x) ** 2), reference.trainable_weights + [xs]
    )
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-5)
    for g, g_ref in zip(grads, grads_ref):
        np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cls", CELLS)
@pytest.mark.parametrize("streams", [None, B])
def test_adaptation_matrix(cls, streams):
    reference, fast = _pair(
        cls, 0, None, cell_kwargs=dict(adaptation_units=3, adaptation_streams=streams),
        return_sequences=True,
    )
    shape = (3, 3) if streams is None else (B, 3, 3)
    matrix = np.random.default_rng(4).normal(scale=0.5, size=shape).astype("float32")
    reference.cell.adaptation_kernel.assign(matrix)
    fast.cell.adaptation_kernel.assign(matrix)
    xs = _xs(2)
    _assert_same(fast(xs), reference(xs))
    # Sparse dynamic evaluation differentiates the (non-trainable) matrix.
    (_, [g]), (_, [g_ref]) = (
        value_and_gradients(lambda: keras.ops.sum(layer(xs) ** 2), [layer.cell.adaptation_kernel])
        for layer in (fast, reference)
    )
    np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls", CELLS)
@pytest.mark.parametrize("rounds, rank", ROUNDS)
@pytest.mark.compiled
def test_compiled_calls(cls, rounds, rank):
    reference, fast = _pair(
        cls, rounds, rank, cell_kwargs=dict(dropout=0.2, recurrent_dropout=0.2),
        return_sequences=True,
    )
    xs = _xs(2)
    run, run_ref = jit_layer_call(fast), jit_layer_call(reference)
    _assert_same(run(xs, False), run_ref(xs, False), atol=1e-5)
    _assert_same(run(xs, True), run_ref(xs, True), atol=1e-5)  # same seeds


# Each cell under one of the two policies (each policy once): the compute
# dtype handling is the cells' shared code; the policies differ in width.
@pytest.mark.parametrize(
    "cls, policy", [(CELLS[0], "mixed_float16"), (CELLS[1], "mixed_bfloat16")]
)
def test_mixed_precision(cls, policy):
    keras.config.set_dtype_policy(policy)
    atol = 2e-3 if policy == "mixed_float16" else 2e-2
    for rounds, rank in ROUNDS:
        reference, fast = _pair(
            cls, rounds, rank, cell_kwargs=dict(recurrent_dropout=0.2),
            return_sequences=True, return_state=True,
        )
        xs = _xs(2)
        out, out_ref = fast(xs, training=True), reference(xs, training=True)
        assert keras.backend.standardize_dtype(out[0].dtype) == policy.split("_")[1]
        _assert_same(
            [keras.ops.cast(o, "float32") for o in out],
            [keras.ops.cast(o, "float32") for o in out_ref],
            atol=atol,
        )
    layer = km.CellRNN(cls(N, mogrifier_rounds=0, dropout=0.1), return_sequences=True)
    model = keras.Sequential([keras.Input((T, M)), layer, keras.layers.Dense(1, dtype="float32")])
    model.compile("adam", "mse", jit_compile=JIT_COMPILE)
    history = model.fit(xs, np.ones((B, T, 1)), epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))


@pytest.mark.parametrize("cls", CELLS)
def test_fit_gives_the_same_weights(cls):
    xs, ys = _xs(2), np.random.default_rng(3).normal(size=(B, T, 1)).astype("float32")
    trained = []
    for layer in _pair(cls, 0, None, cell_kwargs=dict(dropout=0.1), return_sequences=True):
        head = keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(0.1))
        model = keras.Sequential([keras.Input((T, M)), layer, head])
        model.compile(keras.optimizers.SGD(0.1), "mse", jit_compile=JIT_COMPILE)
        model.fit(xs, ys, epochs=3, batch_size=B, shuffle=False, verbose=0)
        trained.append(model.get_weights())
    for a, e in zip(*trained):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("make_cell", [
    lambda: keras.layers.LSTMCell(N, dropout=0.2, recurrent_dropout=0.3, seed=5),
    lambda: keras.layers.GRUCell(N, dropout=0.2, seed=5),
], ids=["lstm", "gru"])
def test_other_cells_run_as_in_keras(make_cell):
    """A cell that is not the package's: the same outputs, states and
    gradients as keras.layers.RNN, with a mask, going backwards, from a given
    state, with dropout. Two cells of equal weights (a shared cell would hide
    a layer that changes it)."""
    kwargs = dict(return_sequences=True, return_state=True, go_backwards=True)
    fast, reference = km.CellRNN(make_cell(), **kwargs), keras.layers.RNN(make_cell(), **kwargs)
    xs = _xs()
    mask = np.ones((B, T), bool)
    mask[1, 4:] = False
    mask[3, 2:] = False
    state = [np.random.default_rng(4).normal(size=(B, N)).astype("float32")
             for _ in reference.cell.state_size] if isinstance(
                 reference.cell.state_size, (list, tuple)) else [
                 np.random.default_rng(4).normal(size=(B, N)).astype("float32")]
    reference(xs, mask=mask, initial_state=state)
    fast(xs, mask=mask, initial_state=state)
    fast.set_weights(reference.get_weights())
    for training in (False, True):
        _assert_same(fast(xs, mask=mask, initial_state=state, training=training),
                     reference(xs, mask=mask, initial_state=state, training=training))
    loss_fast = _loss_and_gradients(fast, xs, mask=mask, initial_state=state)
    loss_reference = _loss_and_gradients(reference, xs, mask=mask, initial_state=state)
    _assert_same(loss_fast, loss_reference, atol=1e-5)
    # The masked steps do matter (the test would see a layer ignoring them).
    unmasked = to_numpy(reference(xs, initial_state=state)[0])
    assert not np.allclose(unmasked, to_numpy(reference(xs, mask=mask, initial_state=state)[0]))


def test_config_and_saving_round_trip(tmp_path):
    layer = km.CellRNN(km.RLSTMCell(N, dropout=0.1, seed=2), return_sequences=True, name="fast")
    revived = km.CellRNN.from_config(layer.get_config())
    assert isinstance(revived, km.CellRNN) and isinstance(revived.cell, km.RLSTMCell)
    inputs = keras.Input((T, M))
    model = keras.Model(inputs, layer(inputs))
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.layers[-1], km.CellRNN)
    np.testing.assert_allclose(to_numpy(loaded(_xs())), to_numpy(model(_xs())), atol=1e-6)
    # The weights are those of keras.layers.RNN(cell): they load into it.
    reference = keras.layers.RNN(km.RLSTMCell(N), return_sequences=True)
    reference(_xs())
    reference.set_weights(layer.get_weights())
    np.testing.assert_allclose(to_numpy(reference(_xs())), to_numpy(layer(_xs())), atol=1e-6)

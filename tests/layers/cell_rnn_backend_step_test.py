"""The backend's own time step (PyTorch's fused step) and when it applies.

`tests/layers/cell_rnn_test.py` compares `CellRNN` with `keras.layers.RNN(cell)`
on every backend, so on PyTorch it checks the fused step's numbers and
gradients against the cell's own; here: that the fused step is what runs on
PyTorch (and nothing of the kind elsewhere), that it gives exactly the cell's
own numbers, and that it stands aside where it does not apply.
"""

import keras
import numpy as np
import pytest

import keras_mogrifier as km
from keras_mogrifier import backend

from testing import to_numpy

B, T, M, N = 3, 5, 4, 6
CELLS = [
    lambda: km.RLSTMCell(N, seed=1),
    lambda: km.MogrifierLSTMCell(N, mogrifier_rounds=0, seed=1),
    lambda: km.MogrifierLSTMCell(N, mogrifier_rounds=0, capped_input_gate=False, seed=1),
    # Mogrified input (the projection at every step), low-rank and full rounds.
    lambda: km.RLSTMCell(N, mogrifier_rounds=3, mogrifier_rank=2, seed=1),
    lambda: km.MogrifierLSTMCell(N, mogrifier_rounds=4, seed=1),
    # A state dropout mask (drawn at the first step and reused), with and
    # without the mogrifier; input dropout too.
    lambda: km.RLSTMCell(N, recurrent_dropout=0.3, dropout=0.2, seed=1),
    lambda: km.MogrifierLSTMCell(N, mogrifier_rounds=2, recurrent_dropout=0.3, seed=1),
    lambda: km.RLSTMCell(N, mogrifier_rounds=2, recurrent_dropout=0.3, use_bias=False, seed=1),
]
TORCH = keras.backend.backend() == "torch"


def _layer(make_cell):
    layer = km.CellRNN(make_cell(), return_sequences=True, return_state=True)
    layer.build((B, T, M))
    return layer


def _xs():
    return np.random.default_rng(0).normal(size=(B, T, M)).astype("float32")


@pytest.mark.parametrize("make_cell", CELLS)
def test_the_backend_step_runs_on_pytorch_only_and_changes_no_number(make_cell, monkeypatch):
    used = []
    own = backend.recurrent_step

    def spy(*args):
        step = own(*args)
        used.append(step is not None)
        return step

    monkeypatch.setattr(backend, "recurrent_step", spy)
    for training in (False, True):
        # Two layers built alike: the same weights and the same dropout masks.
        keras.utils.set_random_seed(5)
        fused = [to_numpy(t) for t in _layer(make_cell)(_xs(), training=training)]
        assert used and all(u == TORCH for u in used)
        with monkeypatch.context() as plain_step:
            plain_step.setattr(backend, "recurrent_step", lambda *args: None)
            keras.utils.set_random_seed(5)
            plain = [to_numpy(t) for t in _layer(make_cell)(_xs(), training=training)]
        for a, b in zip(fused, plain):
            np.testing.assert_array_equal(a, b)  # the same operations in the same order


@pytest.mark.parametrize("make_cell", CELLS)
def test_training_gives_the_same_weights_with_and_without_the_backend_step(
    make_cell, monkeypatch
):
    # Gradients: one SGD step through the fused step and through the cell's own.
    results = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(backend, "recurrent_step", lambda *args: None)
        keras.utils.set_random_seed(3)
        model = keras.Sequential([
            keras.Input((T, M)),
            km.CellRNN(make_cell(), return_sequences=True),
            keras.layers.Dense(1),
        ])
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
        model.train_on_batch(_xs(), np.ones((B, T, 1), "float32"))
        results.append([to_numpy(w) for w in model.weights])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


class _OwnStep(km.RLSTMCell):
    def step(self, weights, z_x, h_prev, c_prev, state_mask):
        h, c = super().step(weights, z_x, h_prev, c_prev, state_mask)
        return 2.0 * h, c


class _OwnRecurrentStep(km.MogrifierLSTMCell):
    def recurrent_step(self, weights, x, states, training, projected=False):
        h, states = super().recurrent_step(weights, x, states, training, projected)
        return 2.0 * h, states


@pytest.mark.parametrize("make_cell, training, projected", [
    (lambda: _OwnStep(N), False, True),  # a subclass with its own step
    (lambda: _OwnRecurrentStep(N), False, True),  # ... or its own recurrent step
    (lambda: km.RLSTMCell(N, adaptation_units=3), False, True),  # adaptation
    (lambda: km.MogrifierLSTMCell(N, adaptation_units=2, mogrifier_rounds=2), True, False),
])
def test_the_backend_step_stands_aside(make_cell, training, projected):
    cell = make_cell()
    cell.build((B, M))
    assert backend.recurrent_step(cell, cell.step_weights(True), training, projected) is None


def test_a_subclass_step_is_what_runs():
    layer = _layer(lambda: _OwnStep(N, seed=1))
    reference = keras.layers.RNN(layer.cell, return_sequences=True, return_state=True)
    np.testing.assert_allclose(
        to_numpy(layer(_xs())[0]), to_numpy(reference(_xs())[0]), rtol=1e-6, atol=1e-6
    )


def test_pytorch_fuses_the_cells_and_no_other_backend_has_a_step():
    for make_cell in CELLS:
        cell = make_cell()
        cell.build((B, M))
        step = backend.recurrent_step(
            cell, cell.step_weights(True), True, cell.hoists_input_projection
        )
        assert (step is not None) == TORCH

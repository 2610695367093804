import numpy as np
import pytest
import keras

import keras_mogrifier as km
from keras_mogrifier.models import LanguageModel

import reference
from testing import to_numpy
from testing import value_and_gradients

V, B, T, N = 23, 3, 6, 8


def _ids(seed=0, batch=B, time=T):
    return np.random.default_rng(seed).integers(0, V, size=(batch, time)).astype("int32")


def _randomize(model, seed=1, scale=0.3):
    rng = np.random.default_rng(seed)
    for w in model.trainable_weights:
        w.assign(rng.normal(scale=scale, size=w.shape))


def _softmax_logits(x, table, bias):
    return x @ table.T + bias


@pytest.mark.parametrize("residual", [True, False])
def test_wiring_against_hand_computation(residual):
    model = LanguageModel(V, units=N, num_layers=3, cell="lstm", residual=residual, stateful=False)
    ids = _ids()
    model(ids)
    _randomize(model)
    table = to_numpy(model.embedding.embeddings)
    x = table[ids]
    outputs = []
    for rnn in model.recurrent_layers:
        cell = rnn.cell
        out, _, _ = reference.run_sequence(
            reference.lstm_step, x, N, kernel=to_numpy(cell.kernel),
            recurrent_kernel=to_numpy(cell.recurrent_kernel), bias=to_numpy(cell.bias), capped=True,
        )
        outputs.append(out)
        x = sum(outputs) if residual else out  # the embedding is in no sum
    expected = _softmax_logits(x, table, to_numpy(model.output_bias))
    np.testing.assert_allclose(to_numpy(model(ids)), expected, rtol=1e-4, atol=1e-4)


def test_rlstm_mogrifier_cells_and_dual_head_against_hand_computation():
    model = LanguageModel(V, units=N, num_layers=2, cell="mogrifier_rlstm", mogrifier_rounds=2,
                          dual=True, stateful=False)
    ids = _ids()
    model(ids)
    _randomize(model)
    table = to_numpy(model.embedding.embeddings)
    e = table[ids]
    x, outputs = e, []
    for rnn in model.recurrent_layers:
        cell = rnn.cell
        mw = cell.mogrifier.get_weights()
        out, _, _ = reference.run_sequence(
            reference.rlstm_step, x, N, rounds=[([mw[0]], mw[1]), ([mw[2]], mw[3])],
            kernel=to_numpy(cell.kernel), recurrent_kernel=to_numpy(cell.recurrent_kernel),
            forget_kernel=to_numpy(cell.forget_kernel), output_kernel=to_numpy(cell.output_kernel),
            bias=to_numpy(cell.bias),
        )
        outputs.append(out)
        x = sum(outputs)
    w_de, w_dh, b_d = model.dual_layer.get_weights()
    d = np.maximum(e @ w_de + x @ w_dh + b_d, 0.0)
    expected = _softmax_logits(d, table, to_numpy(model.output_bias))
    np.testing.assert_allclose(to_numpy(model(ids)), expected, rtol=1e-4, atol=1e-4)


def test_cell_choices():
    expected = {
        "lstm": (km.MogrifierLSTMCell, 0),
        "mogrifier_lstm": (km.MogrifierLSTMCell, 4),
        "rlstm": (km.RLSTMCell, 0),
        "mogrifier_rlstm": (km.RLSTMCell, 4),
    }
    for name, (cls, rounds) in expected.items():
        model = LanguageModel(V, units=N, cell=name, mogrifier_rounds=4, state_dropout=0.25)
        for rnn in model.recurrent_layers:
            assert type(rnn.cell) is cls and rnn.cell.mogrifier_rounds == rounds
            assert rnn.cell.recurrent_dropout == 0.25  # the state mask lives in the cells


def test_tied_embeddings_share_one_variable_and_projection():
    model = LanguageModel(V, units=N, embedding_dim=5, stateful=False)
    ids = _ids()
    model(ids)
    assert sum(1 for w in model.weights if tuple(w.shape) == (V, 5)) == 1
    assert model.projection is not None and tuple(model.projection.kernel.shape) == (N, 5)
    _, (grad,) = value_and_gradients(
        lambda: keras.ops.mean(model(ids)[..., 0]), [model.embedding.embeddings]
    )
    # The output loss reaches the embedding through the tied softmax alone too.
    assert np.abs(grad[0]).sum() > 0
    untied = LanguageModel(V, units=N, tie_embeddings=False, stateful=False)
    untied(ids)
    assert untied.output_layer is not None and untied.projection is None


def test_dropout_masks_per_time_step_and_only_in_training():
    model = LanguageModel(V, units=N, input_dropout=0.5, cell_output_dropout=0.3,
                          output_dropout=0.3, state_dropout=0.3, stateful=False, seed=1)
    ids = np.full((B, T), 4, "int32")  # the same token at every step
    model(ids)
    dropped = to_numpy(model.input_dropout_layer(model.embedding(ids), training=True))
    zeros = dropped == 0
    assert not all(np.array_equal(zeros[:, 0], zeros[:, t]) for t in range(1, T))
    np.testing.assert_array_equal(to_numpy(model(ids)), to_numpy(model(ids)))
    assert not np.allclose(
        to_numpy(model(ids, training=True)), to_numpy(model(ids, training=True))
    )


def test_stateful_carries_state_across_windows():
    model = LanguageModel(V, units=N, num_layers=2, cell="mogrifier_lstm", mogrifier_rounds=3)
    ids = _ids(time=12)
    model(ids[:, :1])
    model.reset_states()
    whole = to_numpy(model(ids))
    model.reset_states()
    parts = np.concatenate(
        [to_numpy(model(ids[:, :5])), to_numpy(model(ids[:, 5:]))], axis=1
    )
    np.testing.assert_allclose(parts, whole, atol=1e-5)
    # A smaller batch uses the leading rows of the state.
    model.reset_states()
    np.testing.assert_allclose(to_numpy(model(ids[:1])), whole[:1], atol=1e-5)
    with pytest.raises(Exception):
        model(_ids(batch=B + 1))


def test_fit_resets_state_each_epoch_and_evaluate_resets():
    model = LanguageModel(V, units=N, num_layers=1, batch_size=B)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ids = _ids(time=4)
    model(ids)  # leaves a non-zero state behind
    seen = []

    class Spy(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            seen.append(float(np.abs(to_numpy(model.recurrent_state_variables[0])).sum()))

    model.fit(ids, ids, batch_size=B, epochs=3, verbose=0, callbacks=[Spy()])
    assert seen == [0.0, 0.0, 0.0]
    assert np.abs(to_numpy(model.recurrent_state_variables[0])).sum() > 0
    carried = to_numpy(model.recurrent_state_variables[0]).copy()
    a = model.evaluate(ids, ids, batch_size=B, verbose=0)
    b = model.evaluate(ids, ids, batch_size=B, verbose=0)
    assert a == pytest.approx(b, rel=1e-6)  # each starts from zero state
    # The carried training state is put back (mid-epoch evaluations are safe).
    np.testing.assert_array_equal(to_numpy(model.recurrent_state_variables[0]), carried)


def test_multi_sample_training_output():
    model = LanguageModel(V, units=N, samples=3, batch_size=B, input_dropout=0.3,
                          state_dropout=0.3, seed=2)
    ids = _ids()
    out = to_numpy(model(ids, training=True))
    assert out.shape == (B, 3, T, V)
    assert not np.allclose(out[:, 0], out[:, 1])  # each copy its own masks
    assert tuple(model.recurrent_state_variables[0].shape) == (3 * B, N)
    assert to_numpy(model(ids)).shape == (B, T, V)  # one sample at evaluation


def test_temperature_scales_logits_only_at_evaluation():
    model = LanguageModel(V, units=N, stateful=False, temperature=0.9)
    ids = _ids()
    train = to_numpy(model(ids, training=True))
    np.testing.assert_allclose(to_numpy(model(ids)), 0.9 * train, rtol=1e-6)
    model.set_temperature(1.1)
    np.testing.assert_allclose(to_numpy(model(ids)), 1.1 * train, rtol=1e-6)
    assert model.get_config()["temperature"] == 1.1


def test_saved_model_reloads_with_identical_predictions(tmp_path):
    model = LanguageModel(V, units=N, cell="mogrifier_rlstm", mogrifier_rank=3, dual=True,
                          embedding_dim=6, batch_size=B, temperature=0.95, chrono_t_max=20.0)
    ids = _ids()
    model(ids)
    path = tmp_path / "lm.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    model.reset_states()
    loaded.reset_states()
    np.testing.assert_allclose(to_numpy(loaded(ids)), to_numpy(model(ids)), atol=1e-6)
    assert isinstance(loaded, LanguageModel) and loaded.get_config() == model.get_config()


def test_with_options_copies_weights():
    model = LanguageModel(V, units=N, batch_size=B, samples=2)
    ids = _ids()
    model(ids)
    one = model.with_options(batch_size=1, samples=1)
    model.reset_states()
    np.testing.assert_allclose(to_numpy(one(ids[:1])), to_numpy(model(ids[:1])), atol=1e-6)
    sparse = model.with_options(adaptation_units=4)
    cell = sparse.recurrent_layers[-1].cell
    assert tuple(cell.adaptation_kernel.shape) == (4, 4)
    sparse.reset_states()
    model.reset_states()
    np.testing.assert_allclose(to_numpy(sparse(ids)), to_numpy(model(ids)), atol=1e-6)


def test_with_options_temperature_computes_with_the_new_temperature():
    model = LanguageModel(V, units=N, batch_size=B, temperature=0.9)
    ids = _ids()
    model(ids)  # built: the copies take its weights
    model.reset_states()
    plain = model.with_options(temperature=1.0)
    hot = model.with_options(temperature=0.5)
    same = model.with_options(batch_size=1)
    assert (hot.temperature, same.temperature) == (0.5, 0.9)
    np.testing.assert_allclose(to_numpy(hot.temperature_variable), 0.5)
    np.testing.assert_allclose(to_numpy(same.temperature_variable), 0.9)
    logits = to_numpy(plain(ids))
    np.testing.assert_allclose(to_numpy(hot(ids)), 0.5 * logits, rtol=1e-5, atol=1e-6)
    model.reset_states()
    np.testing.assert_allclose(to_numpy(model(ids)), 0.9 * logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(to_numpy(same(ids[:1])), 0.9 * logits[:1], rtol=1e-5, atol=1e-6)
    # The source model keeps its own.
    assert model.temperature == 0.9
    with pytest.raises(ValueError, match="Expected `temperature`"):
        model.with_options(temperature=-1.0)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"vocabulary_size": 0}, "vocabulary_size"),
        ({"units": -1}, "units"),
        ({"num_layers": 0}, "num_layers"),
        ({"cell": "gru"}, "cell"),
        ({"input_dropout": 1.0}, "input_dropout"),
        ({"state_dropout": -0.5}, "state_dropout"),
        ({"samples": 0}, "samples"),
        ({"temperature": 0.0}, "temperature"),
        ({"l2": -1.0}, "l2"),
        ({"adaptation_layer": 5}, "adaptation_layer"),
    ],
)
def test_bad_arguments(kwargs, name):
    args = {"vocabulary_size": V, "units": N}
    args.update(kwargs)
    with pytest.raises(ValueError, match=f"Expected `{name}`.*Received"):
        LanguageModel(**args)


def test_bad_ids():
    model = LanguageModel(V, units=N, batch_size=B)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ids = _ids()
    weights = [w.copy() for w in model.get_weights()] if model.built else None
    bad = ids.copy()
    bad[0, 0] = V
    with pytest.raises(ValueError, match=r"token ids in \[0, 23\).*Received: an id 23"):
        model.fit(bad, ids, batch_size=B, verbose=0)
    with pytest.raises(ValueError, match="integer token ids"):
        model.evaluate(ids.astype("float32"), ids, verbose=0)
    assert not model.built or weights is None
    with pytest.raises(ValueError, match=r"Expected token ids of shape \(batch, time\)"):
        LanguageModel(V, units=N, stateful=False)(np.zeros((2, 3, 4), "int32"))


def test_drop_state_zeroes_whole_streams_in_training_only():
    """lamb training.py 435-441: one Bernoulli(1 − p) draw per stream (row of
    the batch × samples), multiplying every layer's h and c alike."""
    batch = 16
    model = LanguageModel(V, units=N, num_layers=2, cell="lstm", batch_size=batch,
                          drop_state_probability=0.5, seed=3)
    first = np.random.default_rng(0).integers(0, V, (batch, 5))
    second = np.random.default_rng(1).integers(0, V, (batch, 4))
    model(first)  # a carried state for every stream
    carried = [to_numpy(v).copy() for v in model.recurrent_state_variables]
    # What the second window gives from the carried state and from zero state
    # (no dropout anywhere, so training=True differs only by the dropped state).
    with_state = to_numpy(model(second))
    for v, value in zip(model.recurrent_state_variables, carried):
        v.assign(value)
    model.reset_states()
    from_zero = to_numpy(model(second))
    for v, value in zip(model.recurrent_state_variables, carried):
        v.assign(value)
    dropped = to_numpy(model(second, training=True))
    kept = [np.allclose(dropped[r], with_state[r], atol=1e-6) for r in range(batch)]
    zeroed = [np.allclose(dropped[r], from_zero[r], atol=1e-6) for r in range(batch)]
    assert all(k != z for k, z in zip(kept, zeroed))  # each row one or the other
    assert 2 <= sum(zeroed) <= batch - 2  # p = 0.5 drops some, not all
    # Evaluation never drops: the carried state is used.
    for v, value in zip(model.recurrent_state_variables, carried):
        v.assign(value)
    np.testing.assert_allclose(to_numpy(model(second)), with_state, atol=1e-6)
    with pytest.raises(ValueError, match="drop_state_probability"):
        LanguageModel(V, drop_state_probability=1.5)

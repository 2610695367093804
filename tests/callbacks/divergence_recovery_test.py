import keras
import numpy as np
import pytest
from keras import ops

from keras_mogrifier.callbacks import DivergenceRecovery
from keras_mogrifier.optimizers import RectifiedAdam
from keras_mogrifier.optimizers import TwoTailedAveragingOptimizer

from testing import Poison
from testing import PoisonCalls

LR = 0.05


def _data(seed=0, n=16):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + 0.1).astype("float32")
    return x, y


def _model(poison_calls, value=np.nan, optimizer=None):
    """The model, and the callback (to pass to `fit` first) that poisons it."""
    keras.utils.set_random_seed(0)
    poison = Poison()
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1), poison])
    model.compile(optimizer=optimizer or RectifiedAdam(LR), loss="mse")
    return model, PoisonCalls(poison, poison_calls, value)


def _state(model):
    return (
        [ops.convert_to_numpy(v) for v in model.weights],
        [ops.convert_to_numpy(v) for v in model.optimizer.variables],
    )


class RecordStates(keras.callbacks.Callback):
    """Records the full state at every batch end and epoch end."""

    def __init__(self):
        super().__init__()
        self.batches, self.epochs = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append(_state(self.model))

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(_state(self.model))


class ProbeRecoveries(keras.callbacks.Callback):
    """Placed after DivergenceRecovery: the state right after each recovery."""

    def __init__(self, recovery):
        super().__init__()
        self.recovery = recovery
        self.states, self.learning_rates = [], []

    def on_train_batch_end(self, batch, logs=None):
        if self.recovery.recoveries > len(self.states):
            self.states.append(_state(self.model))
            self.learning_rates.append(
                float(ops.convert_to_numpy(self.model.optimizer.learning_rate))
            )


def _learning_rate_index(model):
    """Where the learning-rate variable is in `optimizer.variables`."""
    lr = model.optimizer.learning_rate
    index = [i for i, v in enumerate(model.optimizer.variables) if v is lr]
    assert len(index) == 1
    return index


def _assert_equal_states(state, checkpoint, skip_optimizer=()):
    weights, optimizer_values = state
    for a, b in zip(weights, checkpoint[0]):
        np.testing.assert_array_equal(a, b)
    assert len(optimizer_values) == len(checkpoint[1])
    for i, (a, b) in enumerate(zip(optimizer_values, checkpoint[1])):
        if i not in skip_optimizer:
            np.testing.assert_array_equal(a, b)


def _all_finite(model):
    return all(np.all(np.isfinite(ops.convert_to_numpy(v))) for v in model.weights)


def test_restores_the_best_checkpoint_and_compounds_the_learning_rate_cut():
    x, y = _data()
    x_val, y_val = _data(seed=1)
    # 4 steps per epoch; training calls 7 and 8 (epoch 1) produce NaN, which
    # also makes the weights NaN after the update.
    model, poison = _model({7, 8}, optimizer=TwoTailedAveragingOptimizer(RectifiedAdam(LR)))
    record = RecordStates()
    recovery = DivergenceRecovery(monitor="val_loss", verbose=0)
    probe = ProbeRecoveries(recovery)
    history = model.fit(
        x, y, batch_size=4, epochs=4, shuffle=False, verbose=0,
        validation_data=(x_val, y_val), callbacks=[poison, record, recovery, probe],
    )

    lr_index = _learning_rate_index(model)
    checkpoint = record.epochs[0]  # the best state after epoch 0
    assert recovery.recoveries == 2
    for state in probe.states:
        # Weights, moments, step counter and both averages are the checkpoint's.
        _assert_equal_states(state, checkpoint, skip_optimizer=lr_index)
    assert probe.learning_rates == pytest.approx([0.9 * LR, 0.81 * LR], rel=1e-6)
    assert [r["learning_rate"] for r in recovery.recoveries_log] == pytest.approx(
        [0.9 * LR, 0.81 * LR], rel=1e-6
    )
    assert [r["checkpoint_epoch"] for r in recovery.recoveries_log] == [1, 1]

    # Training went on from there and ended finite, with the lowered rate.
    assert _all_finite(model)
    assert np.all(np.isfinite(history.history["val_loss"]))
    assert history.history["val_loss"][-1] < history.history["val_loss"][0]
    assert float(ops.convert_to_numpy(model.optimizer.learning_rate)) == (
        pytest.approx(0.81 * LR, rel=1e-6)
    )
    assert recovery.consecutive_recoveries == 0


@pytest.mark.parametrize("monitor", ["val_loss", None])
def test_cuts_compound_once_each_across_a_newer_checkpoint(monitor):
    """Circling Back §5 (seed 000, line 69): "If training diverges, we reset
    the weights and the optimization state to the previous best checkpoint
    and multiply the learning rate by 0.9." Each divergence cuts the rate
    once: after k recoveries it is 0.9ᵏ × the uncut rate, also when the
    second recovery restores a checkpoint saved after the first (whose rate
    already holds one cut): 1.0 → 0.9 → 0.81, not 0.9 → 0.9³ = 0.729.
    """
    x, y = _data()
    x_val, y_val = _data(seed=1)
    # 4 steps per epoch: call 7 (epoch 1) diverges and restores the state
    # of the end of epoch 0; the end of epoch 1 is then a newer checkpoint
    # (its rate is 0.9 × LR); call 11 (epoch 2) diverges and restores it.
    model, poison = _model({7, 11})
    recovery = DivergenceRecovery(monitor=monitor, verbose=0)
    probe = ProbeRecoveries(recovery)
    model.fit(
        x, y, batch_size=4, epochs=4, shuffle=False, verbose=0,
        validation_data=(x_val, y_val), callbacks=[poison, recovery, probe],
    )
    assert recovery.recoveries == 2
    assert [r["checkpoint_epoch"] for r in recovery.recoveries_log] == [1, 2]
    assert probe.learning_rates == pytest.approx([0.9 * LR, 0.81 * LR], rel=1e-6)
    assert [r["learning_rate"] for r in recovery.recoveries_log] == pytest.approx(
        [0.9 * LR, 0.81 * LR], rel=1e-6
    )
    assert float(ops.convert_to_numpy(model.optimizer.learning_rate)) == (
        pytest.approx(0.81 * LR, rel=1e-6)
    )


def test_gives_up_after_too_many_recoveries_in_a_row(tmp_path):
    x, y = _data()
    x_val, y_val = _data(seed=1)
    model, poison = _model(set(range(6, 100)))
    record = RecordStates()
    path = tmp_path / "checkpoint.npz"
    recovery = DivergenceRecovery(
        max_consecutive_recoveries=2, filepath=path, verbose=0
    )
    with pytest.raises(RuntimeError, match="2 recoveries in a row"):
        model.fit(
            x, y, batch_size=4, epochs=3, shuffle=False, verbose=0,
            validation_data=(x_val, y_val), callbacks=[poison, record, recovery],
        )
    assert path.exists()
    assert recovery.recoveries == 2
    # Even when giving up, the model is left with the finite checkpoint.
    _assert_equal_states(_state(model), record.epochs[0])
    assert _all_finite(model)


@pytest.mark.parametrize(
    "monitor, save_freq, poison_call, checkpoint",
    [
        (None, None, 6, ("epoch", 0)),
        # The monitor is missing without validation data: last finite state.
        ("val_loss", None, 6, ("epoch", 0)),
        # Every second batch: the state after training call 6.
        (None, 2, 8, ("batch", 5)),
    ],
)
def test_without_validation_restores_the_last_finite_state(
    monitor, save_freq, poison_call, checkpoint
):
    x, y = _data()
    model, poison = _model({poison_call})
    record = RecordStates()
    recovery = DivergenceRecovery(monitor=monitor, save_freq=save_freq, verbose=0)
    probe = ProbeRecoveries(recovery)
    model.fit(x, y, batch_size=4, epochs=3, shuffle=False, verbose=0,
              callbacks=[poison, record, recovery, probe])
    kind, index = checkpoint
    expected = (record.epochs if kind == "epoch" else record.batches)[index]
    lr_index = _learning_rate_index(model)
    assert recovery.recoveries == 1
    _assert_equal_states(probe.states[0], expected, skip_optimizer=lr_index)
    assert probe.learning_rates == pytest.approx([0.9 * LR])
    assert _all_finite(model)


def test_a_loss_jump_above_factor_times_the_best_is_a_divergence():
    x, y = _data()
    x_val, y_val = _data(seed=1)
    # Call 7 multiplies the output by 100: finite, but far off.
    model, poison = _model({7}, value=100.0)
    recovery = DivergenceRecovery(factor=3.0, verbose=0)
    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0,
              validation_data=(x_val, y_val), callbacks=[poison, recovery])
    assert recovery.recoveries == 1
    assert "above 3.0 x the lowest epoch loss" in recovery.recoveries_log[0]["reason"]

    model, poison = _model({7}, value=100.0)
    recovery = DivergenceRecovery(verbose=0)
    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0,
              validation_data=(x_val, y_val), callbacks=[poison, recovery])
    assert recovery.recoveries == 0


def test_a_learning_rate_schedule_is_rejected():
    x, y = _data()
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, 10, 0.9)
    model, _ = _model(set(), optimizer=RectifiedAdam(schedule))
    with pytest.raises(ValueError, match="LearningRateSchedule"):
        model.fit(x, y, verbose=0, callbacks=[DivergenceRecovery(verbose=0)])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"monitor": 3}, "monitor"),
        ({"mode": "auto"}, "mode"),
        ({"factor": 1.0}, "factor"),
        ({"max_consecutive_recoveries": 0}, "max_consecutive_recoveries"),
        ({"learning_rate_decay": 1.5}, "learning_rate_decay"),
        ({"save_freq": 0}, "save_freq"),
        ({"filepath": "checkpoint.h5"}, "filepath"),
    ],
)
def test_invalid_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DivergenceRecovery(**kwargs)

import keras
import numpy as np
import pytest
from keras import ops

from keras_mogrifier.callbacks import DivergenceRecovery
from keras_mogrifier.callbacks import TwoTailedAveraging
from keras_mogrifier.optimizers import RectifiedAdam
from keras_mogrifier.optimizers import TwoTailedAveragingOptimizer

import testing
from testing import Poison
from testing import PoisonCalls


def _data(seed=0, n=32, noise=0.0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [0.5]]) + 0.1 + noise * rng.normal(size=(n, 1))
    return x, y.astype("float32")


def _model(two_tailed=True, optimizer=None):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    optimizer = optimizer or RectifiedAdam(0.05)
    if two_tailed:
        optimizer = TwoTailedAveragingOptimizer(optimizer)
    model.compile(optimizer=optimizer, loss="mse")
    return model


class RecordStart(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.weights = [
            ops.convert_to_numpy(v) for v in self.model.trainable_variables
        ]


def _mean(recorded, start, stop):
    return [
        np.mean([w[i] for w in recorded[start:stop]], axis=0)
        for i in range(len(recorded[0]))
    ]


def _counts(model):
    optimizer = model.optimizer
    return (
        int(ops.convert_to_numpy(optimizer.short_count)),
        int(ops.convert_to_numpy(optimizer.long_count)),
    )


def test_scripted_losses_drive_the_averages():
    x, y = _data()
    model = _model()
    # The callback asks for the raw, short (when S > 0) and long losses.
    losses = [
        5.0, 6.0, 6.0,  # step 2: the raw weights win -> restart both
        4.0, 3.0, 3.5,  # step 4: the short average wins -> switch
        3.0, 2.95, 2.9,  # step 6: the long average improves -> keep
    ]

    def evaluate_fn(m):
        return losses.pop(0)

    tta = TwoTailedAveraging(
        evaluate_fn=evaluate_fn, evaluation_frequency=2, patience=None, verbose=0
    )
    record = testing.RecordWeights()
    model.fit(x[:24], y[:24], batch_size=4, shuffle=False, verbose=0,
              callbacks=[record, tta])
    actions = [r["action"] for r in tta.evaluations]
    assert actions == ["restart_both", "switch", "keep"]
    assert [r["step"] for r in tta.evaluations] == [2, 4, 6]
    assert [(r["short_length"], r["long_length"]) for r in tta.evaluations] == [
        (2, 2), (2, 2), (2, 4)
    ]
    # After the restart at step 2 both averages cover w3, w4; the switch
    # keeps w3, w4 as the long average; steps 5, 6 join both.
    assert _counts(model) == (2, 4)
    optimizer = model.optimizer
    for average, want in zip(
        optimizer.average_variables("long"), _mean(record.weights, 2, 6)
    ):
        np.testing.assert_allclose(ops.convert_to_numpy(average), want, rtol=1e-5)
    # The end of training leaves the long average in the model; the raw
    # weights come back on request.
    for variable, want in zip(model.trainable_variables, _mean(record.weights, 2, 6)):
        np.testing.assert_allclose(ops.convert_to_numpy(variable), want, rtol=1e-5)
    tta.restore_raw_weights()
    for variable, want in zip(model.trainable_variables, record.weights[-1]):
        np.testing.assert_array_equal(ops.convert_to_numpy(variable), want)
    with pytest.raises(ValueError, match="no raw weights"):
        tta.restore_raw_weights()


def test_evaluates_the_right_weights_and_leaves_training_untouched():
    x, y = _data()
    x_val, y_val = _data(seed=1, n=16)
    baseline = _model(two_tailed=False)
    baseline_history = baseline.fit(
        x, y, batch_size=4, epochs=2, shuffle=False, verbose=0
    )

    model = _model()
    record = testing.RecordWeights()
    tta = TwoTailedAveraging(
        (x_val, y_val), evaluation_frequency=5, patience=None,
        prefer_raw_early=False, verbose=0,
    )
    history = model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0,
                        callbacks=[record, tta])
    # The optimizer's steps (and the logged training loss, whose metric state
    # the evaluations must not disturb) are those of the plain optimizer.
    np.testing.assert_allclose(
        history.history["loss"], baseline_history.history["loss"], rtol=1e-6
    )
    tta.restore_raw_weights()
    for a, b in zip(model.weights, baseline.weights):
        np.testing.assert_allclose(
            ops.convert_to_numpy(a), ops.convert_to_numpy(b), rtol=1e-6
        )

    # Re-evaluate the recorded iterates independently.
    probe = _model(two_tailed=False)

    def loss_of(weights):
        for variable, value in zip(probe.trainable_variables, weights):
            variable.assign(value)
        return probe.evaluate(x_val, y_val, verbose=0)

    first = tta.evaluations[0]  # step 5: S = L = 5, no switch before
    assert first["raw_loss"] == pytest.approx(loss_of(record.weights[4]), rel=1e-5)
    assert first["long_loss"] == pytest.approx(
        loss_of(_mean(record.weights, 0, 5)), rel=1e-5
    )
    assert first["short_loss"] == first["long_loss"]
    assert first["action"] == "switch"
    assert [r["step"] for r in tta.evaluations] == [5, 10, 15]


def test_fit_validation_and_the_end_of_training_use_the_long_average():
    x, y = _data()
    x_val, y_val = _data(seed=1, n=16)
    model = _model()
    tta = TwoTailedAveraging(
        (x_val, y_val), evaluation_frequency=8, prefer_raw_early=False, verbose=0
    )
    history = model.fit(x, y, batch_size=4, epochs=3, shuffle=False, verbose=0,
                        validation_data=(x_val, y_val), callbacks=[tta])
    long = [ops.convert_to_numpy(v) for v in model.optimizer.average_variables("long")]
    for variable, average in zip(model.trainable_variables, long):
        np.testing.assert_array_equal(ops.convert_to_numpy(variable), average)
    # The last validation ran on the same long average, at the same step.
    assert model.evaluate(x_val, y_val, verbose=0) == pytest.approx(
        history.history["val_loss"][-1], rel=1e-6
    )
    assert history.history["tta_long_length"][-1] == _counts(model)[1]
    assert history.history["tta_short_length"][-1] == _counts(model)[0]

    # A second fit starts from the raw weights again.
    raw = tta.raw_weights
    start = RecordStart()
    model.fit(x[:4], y[:4], batch_size=4, verbose=0, callbacks=[tta, start])
    for a, b in zip(start.weights, raw):
        np.testing.assert_array_equal(a, b)


def test_resume_from_a_checkpoint_gives_the_same_averages_and_decisions(tmp_path):
    # Noisy targets and plain SGD: the raw weights win early, then the
    # averages do, so every kind of decision occurs.
    x, y = _data(noise=1.0)
    x_val, y_val = _data(seed=1, n=16, noise=1.0)

    def validation_loss(model):  # a fast exact evaluation of the Dense layer
        kernel, bias = (ops.convert_to_numpy(v) for v in model.trainable_variables)
        return float(np.mean((x_val @ kernel + bias - y_val) ** 2))

    def callback():
        return TwoTailedAveraging(
            evaluate_fn=validation_loss, evaluation_frequency=3, patience=2,
            verbose=0,
        )

    def initialize(model):
        # NumPy initial weights: the same on every backend (Keras's random
        # streams differ), so the same decisions happen everywhere.
        rng = np.random.default_rng(0)
        model.set_weights(
            [rng.normal(size=w.shape).astype("float32") for w in model.get_weights()]
        )
        return model

    straight = initialize(_model(optimizer=keras.optimizers.SGD(0.1)))
    straight_tta = callback()
    straight.fit(x, y, batch_size=4, epochs=4, shuffle=False, verbose=0,
                 callbacks=[straight_tta])

    first = initialize(_model(optimizer=keras.optimizers.SGD(0.1)))
    first_tta = callback()
    first.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0,
              callbacks=[first_tta])
    if first_tta.raw_weights is not None:
        first_tta.restore_raw_weights()  # save the raw weights, to resume
    path = tmp_path / "model.keras"
    first.save(path)
    resumed = keras.saving.load_model(path)
    resumed_tta = callback()
    resumed.fit(x, y, batch_size=4, epochs=4, initial_epoch=2, shuffle=False,
                verbose=0, callbacks=[resumed_tta])

    decisions = [(r["step"], r["action"]) for r in straight_tta.evaluations]
    split = first_tta.evaluations + resumed_tta.evaluations
    assert decisions == [(r["step"], r["action"]) for r in split]
    assert {r["action"] for r in straight_tta.evaluations} >= {
        "restart_both", "switch", "keep"
    }
    assert _counts(straight) == _counts(resumed)
    for which in ("short", "long"):
        for a, b in zip(
            straight.optimizer.average_variables(which),
            resumed.optimizer.average_variables(which),
        ):
            np.testing.assert_allclose(
                ops.convert_to_numpy(a), ops.convert_to_numpy(b), rtol=1e-6
            )
    np.testing.assert_array_equal(
        ops.convert_to_numpy(straight.optimizer.controller_state),
        ops.convert_to_numpy(resumed.optimizer.controller_state),
    )


def test_a_divergence_recovery_rolls_the_averages_back_with_the_step():
    x, y = _data(n=16)
    x_val, y_val = _data(seed=1, n=16)
    keras.utils.set_random_seed(0)
    poison = Poison()
    nan_on_call_seven = PoisonCalls(poison, {7}, np.nan)  # a bad batch, not replayed
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1), poison])
    model.compile(optimizer=TwoTailedAveragingOptimizer(RectifiedAdam(0.05)),
                  loss="mse")
    recovery = DivergenceRecovery(verbose=0)
    tta = TwoTailedAveraging((x_val, y_val), evaluation_frequency=2, verbose=0)
    model.fit(x, y, batch_size=4, epochs=3, shuffle=False, verbose=0,
              validation_data=(x_val, y_val),
              callbacks=[nan_on_call_seven, recovery, tta])
    # 4 steps per epoch, 12 training calls; call 7 diverges and the state
    # goes back to step 4, so step 6 is reached (and evaluated) twice and
    # the run ends at step 9.
    assert recovery.recoveries == 1
    assert [r["step"] for r in tta.evaluations] == [2, 4, 6, 6, 8]
    assert all(np.isfinite(r["long_loss"]) for r in tta.evaluations)
    for average in model.optimizer.average_variables("long"):
        assert np.all(np.isfinite(ops.convert_to_numpy(average)))


def test_requires_the_two_tailed_optimizer():
    x, y = _data()
    model = _model(two_tailed=False)
    tta = TwoTailedAveraging((x, y), evaluation_frequency=2, verbose=0)
    with pytest.raises(ValueError, match="TwoTailedAveragingOptimizer"):
        model.fit(x, y, verbose=0, callbacks=[tta])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({}, "exactly one"),
        ({"validation_data": (1, 2), "evaluate_fn": len}, "exactly one"),
        ({"evaluate_fn": 3}, "exactly one|callable"),
        ({"evaluate_fn": len, "evaluation_frequency": 0}, "evaluation_frequency"),
        ({"evaluate_fn": len, "patience": 0}, "patience"),
    ],
)
def test_invalid_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TwoTailedAveraging(**kwargs)


def test_default_monitor_is_the_validation_loss_without_the_l2_penalty():
    """Circling Back compares the averages by validation quality: the default
    monitor is the compiled loss less the weight penalty `evaluate` adds."""
    x, y = _data()
    x_val, y_val = _data(seed=1, n=16)

    def first_raw_loss(**kwargs):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((3,)),
            # A fixed start (the same on every backend) far from the target
            # weights, so that the penalty is not negligible.
            keras.layers.Dense(1, kernel_regularizer=keras.regularizers.L2(0.5),
                               kernel_initializer=keras.initializers.Constant(1.5)),
        ])
        model.compile(optimizer=TwoTailedAveragingOptimizer(RectifiedAdam(0.05)),
                      loss="mse")
        record = testing.RecordWeights()
        tta = TwoTailedAveraging((x_val, y_val), evaluation_frequency=5, verbose=0,
                                 **kwargs)
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0,
                  callbacks=[record, tta])
        kernel, bias = record.weights[4]  # the raw weights after 5 steps
        mse = float(np.mean((x_val @ kernel + bias - y_val) ** 2))
        return tta, tta.evaluations[0]["raw_loss"], mse, 0.5 * float(np.sum(kernel**2))

    tta, raw_loss, mse, penalty = first_raw_loss()
    assert tta.monitor == "unregularized_loss"
    assert penalty > 0.1 * mse  # the penalty is not negligible here
    assert raw_loss == pytest.approx(mse, rel=1e-4)
    # "loss", the compiled loss with the penalty, is still there to choose.
    _, raw_loss, mse, penalty = first_raw_loss(monitor="loss")
    assert raw_loss == pytest.approx(mse + penalty, rel=1e-4)


def test_default_monitor_refuses_activity_regularizers_before_training():
    x, y = _data()
    model = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(1, activity_regularizer=keras.regularizers.L2(0.1)),
    ])
    model.compile(optimizer=TwoTailedAveragingOptimizer(RectifiedAdam(0.05)), loss="mse")
    before = [ops.convert_to_numpy(v).copy() for v in model.weights]
    tta = TwoTailedAveraging((x, y), evaluation_frequency=2, verbose=0)
    with pytest.raises(ValueError, match="explicit `monitor`.*activity regularizers"):
        model.fit(x, y, verbose=0, callbacks=[tta])
    for v, b in zip(model.weights, before):
        np.testing.assert_array_equal(ops.convert_to_numpy(v), b)
    with pytest.raises(ValueError, match="Expected `monitor`"):
        TwoTailedAveraging((x, y), monitor=3)

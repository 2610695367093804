import keras
import numpy as np
import pytest
from keras import ops

from keras_mogrifier.optimizers import RectifiedAdam
from keras_mogrifier.optimizers import TwoTailedAveragingOptimizer

import testing
from testing import backend_specific


def _data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(32, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + 0.1).astype("float32")
    return x, y


def _model(optimizer, jit_compile=False, steps_per_execution=1):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)]
    )
    model.compile(
        optimizer=optimizer,
        loss="mse",
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return model


def _averages(optimizer, which):
    return [ops.convert_to_numpy(v) for v in optimizer.average_variables(which)]


def _assert_mean(averages, recorded, start, stop):
    for i, average in enumerate(averages):
        expected = np.mean([w[i] for w in recorded[start:stop]], axis=0)
        np.testing.assert_allclose(average, expected, rtol=1e-5, atol=1e-6)


def _counts(optimizer):
    return (
        int(ops.convert_to_numpy(optimizer.short_count)),
        int(ops.convert_to_numpy(optimizer.long_count)),
    )


def test_running_means_follow_switch_and_restarts():
    x, y = _data()
    optimizer = TwoTailedAveragingOptimizer(RectifiedAdam(0.05))
    model = _model(optimizer, jit_compile=testing.JIT_COMPILE)
    record = testing.RecordWeights()

    def fit(steps):
        model.fit(x[: 8 * steps], y[: 8 * steps], batch_size=8, shuffle=False,
                  callbacks=[record], verbose=0)

    fit(4)  # iterates w1..w4
    assert _counts(optimizer) == (4, 4)
    _assert_mean(_averages(optimizer, "short"), record.weights, 0, 4)
    _assert_mean(_averages(optimizer, "long"), record.weights, 0, 4)

    optimizer.switch()
    assert _counts(optimizer) == (0, 4)
    fit(3)  # w5..w7
    assert _counts(optimizer) == (3, 7)
    _assert_mean(_averages(optimizer, "short"), record.weights, 4, 7)
    _assert_mean(_averages(optimizer, "long"), record.weights, 0, 7)

    optimizer.switch()  # the long one becomes w5..w7
    fit(2)  # w8, w9
    assert _counts(optimizer) == (2, 5)
    _assert_mean(_averages(optimizer, "short"), record.weights, 7, 9)
    _assert_mean(_averages(optimizer, "long"), record.weights, 4, 9)

    optimizer.restart_short()
    fit(3)  # w10..w12
    _assert_mean(_averages(optimizer, "short"), record.weights, 9, 12)
    _assert_mean(_averages(optimizer, "long"), record.weights, 4, 12)

    optimizer.restart()
    fit(2)  # w13, w14
    assert _counts(optimizer) == (2, 2)
    _assert_mean(_averages(optimizer, "short"), record.weights, 12, 14)
    _assert_mean(_averages(optimizer, "long"), record.weights, 12, 14)
    assert len(record.weights) == 14


@backend_specific(
    "tensorflow",
    "jax",
    reason="Keras's PyTorch trainer only accepts steps_per_execution=1",
)
def test_steps_per_execution_updates_every_step():
    x, y = _data()
    single = TwoTailedAveragingOptimizer(RectifiedAdam(0.05))
    _model(single).fit(x, y, batch_size=4, shuffle=False, verbose=0)
    grouped = TwoTailedAveragingOptimizer(RectifiedAdam(0.05))
    _model(grouped, steps_per_execution=4).fit(
        x, y, batch_size=4, shuffle=False, verbose=0
    )
    assert _counts(grouped) == _counts(single) == (8, 8)
    for a, b in zip(_averages(single, "long"), _averages(grouped, "long")):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_gradient_accumulation_averages_each_update_once():
    x, y = _data()
    optimizer = TwoTailedAveragingOptimizer(
        RectifiedAdam(0.05, gradient_accumulation_steps=2)
    )
    model = _model(optimizer)
    record = testing.RecordWeights()
    model.fit(x, y, batch_size=4, shuffle=False, callbacks=[record], verbose=0)
    assert _counts(optimizer) == (4, 4)
    updates = record.weights[1::2]  # the weights change every second batch
    _assert_mean(_averages(optimizer, "long"), updates, 0, 4)


def test_mixed_float16_skipped_steps_are_not_averaged():
    keras.config.set_dtype_policy("mixed_float16")
    x, y = _data()
    # A huge initial scale makes the first steps overflow and be skipped.
    model = _model(
        keras.optimizers.LossScaleOptimizer(
            TwoTailedAveragingOptimizer(RectifiedAdam(0.01)), initial_scale=2.0**17
        )
    )
    model.fit(x, y, batch_size=4, epochs=2, verbose=0)
    optimizer = model.optimizer.inner_optimizer
    steps = int(ops.convert_to_numpy(optimizer.iterations))
    assert 0 < steps < 16
    assert _counts(optimizer) == (steps, steps)
    for average in _averages(optimizer, "long"):
        assert np.all(np.isfinite(average))


def test_compile_wraps_it_in_a_loss_scale_optimizer_under_mixed_float16():
    keras.config.set_dtype_policy("mixed_float16")
    model = _model(TwoTailedAveragingOptimizer(RectifiedAdam(0.01)))
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert isinstance(model.optimizer.inner_optimizer, TwoTailedAveragingOptimizer)


def test_learning_rate_and_iterations_are_the_inner_optimizers():
    inner = RectifiedAdam(0.05)
    optimizer = TwoTailedAveragingOptimizer(inner)
    optimizer.learning_rate = 0.02
    assert float(ops.convert_to_numpy(inner.learning_rate)) == pytest.approx(0.02)
    x, y = _data()
    _model(optimizer).fit(x, y, batch_size=8, verbose=0)
    assert int(ops.convert_to_numpy(optimizer.iterations)) == 4
    assert int(ops.convert_to_numpy(inner.iterations)) == 4


def test_save_and_resume_gives_the_same_averages(tmp_path):
    x, y = _data()
    straight = _model(TwoTailedAveragingOptimizer(RectifiedAdam(0.05)))
    straight.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    straight.optimizer.switch()
    straight.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)

    resumed = _model(TwoTailedAveragingOptimizer(RectifiedAdam(0.05)))
    resumed.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    resumed.optimizer.switch()
    resumed.optimizer.controller_state.assign([0.0, 1.5, 2.0, 3.5, 1.0])
    path = tmp_path / "model.keras"
    resumed.save(path)
    resumed = keras.saving.load_model(path)
    optimizer = resumed.optimizer
    assert isinstance(optimizer, TwoTailedAveragingOptimizer)
    assert _counts(optimizer) == (0, 16)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(optimizer.controller_state), [0.0, 1.5, 2.0, 3.5, 1.0]
    )
    resumed.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert _counts(optimizer) == _counts(straight.optimizer) == (8, 24)
    for which in ("short", "long"):
        for a, b in zip(
            _averages(straight.optimizer, which), _averages(optimizer, which)
        ):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_config_round_trip():
    optimizer = TwoTailedAveragingOptimizer(
        RectifiedAdam(0.003, beta_1=0.0, global_clipnorm=10.0), name="tta"
    )
    revived = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(revived, TwoTailedAveragingOptimizer)
    assert isinstance(revived.inner_optimizer, RectifiedAdam)
    assert revived.get_config() == optimizer.get_config()


def test_invalid_inner_optimizer_raises():
    with pytest.raises(ValueError, match="inner_optimizer"):
        TwoTailedAveragingOptimizer("adam")
    with pytest.raises(ValueError, match="LossScaleOptimizer"):
        TwoTailedAveragingOptimizer(
            keras.optimizers.LossScaleOptimizer(RectifiedAdam())
        )
    with pytest.raises(ValueError, match="which"):
        TwoTailedAveragingOptimizer(RectifiedAdam()).average_variables("middle")

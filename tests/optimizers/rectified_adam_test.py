import keras
import numpy as np
import pytest
from keras import ops

from keras_mogrifier.optimizers import RectifiedAdam


class TorchRAdam:
    """torch.optim.RAdam's definition, in float64 NumPy, written from its docs."""

    def __init__(self, lr, beta_1, beta_2, eps, weight_decay=0.0, decoupled=True):
        self.lr, self.beta_1, self.beta_2, self.eps = lr, beta_1, beta_2, eps
        self.weight_decay, self.decoupled = weight_decay, decoupled
        self.rho_inf = 2.0 / (1.0 - beta_2) - 1.0
        self.t = 0
        self.m = self.v = None

    def step(self, params, grads):
        """Returns the new parameters and whether the step was rectified."""
        lr, b1, b2 = self.lr, self.beta_1, self.beta_2
        params = [np.array(p, dtype=np.float64) for p in params]
        if self.m is None:
            self.m = [np.zeros_like(p) for p in params]
            self.v = [np.zeros_like(p) for p in params]
        self.t += 1
        t = self.t
        rho_t = self.rho_inf - 2.0 * t * b2**t / (1.0 - b2**t)
        for i, g in enumerate(grads):
            g = np.array(g, dtype=np.float64)
            if self.weight_decay:
                if self.decoupled:
                    params[i] = params[i] * (1.0 - lr * self.weight_decay)
                else:
                    g = g + self.weight_decay * params[i]
            self.m[i] = b1 * self.m[i] + (1.0 - b1) * g
            self.v[i] = b2 * self.v[i] + (1.0 - b2) * g * g
            m_hat = self.m[i] / (1.0 - b1**t)
            if rho_t > 5.0:
                r_t = np.sqrt(
                    (rho_t - 4) * (rho_t - 2) * self.rho_inf
                    / ((self.rho_inf - 4) * (self.rho_inf - 2) * rho_t)
                )
                l_t = np.sqrt(1.0 - b2**t) / (np.sqrt(self.v[i]) + self.eps)
                params[i] = params[i] - lr * m_hat * r_t * l_t
            else:
                params[i] = params[i] - lr * m_hat
        return params, rho_t > 5.0


def radam_reference(
    params, grads_per_step, lr, beta_1, beta_2, eps, weight_decay=0.0, decoupled=True
):
    """The parameters after every step, and whether each step was rectified."""
    reference = TorchRAdam(lr, beta_1, beta_2, eps, weight_decay, decoupled)
    history, rectified = [], []
    for grads in grads_per_step:
        params, was_rectified = reference.step(params, grads)
        history.append(params)
        rectified.append(was_rectified)
    return history, rectified


def _problem(steps, seed=0):
    rng = np.random.default_rng(seed)
    params = [rng.normal(size=(3, 4)), rng.normal(size=(5,))]
    grads = [
        [rng.normal(size=p.shape) * (1.0 + 0.1 * t) for p in params]
        for t in range(steps)
    ]
    return params, grads


@pytest.mark.parametrize(
    "beta_1, beta_2, weight_decay, decoupled",
    [
        (0.9, 0.999, None, True),
        (0.0, 0.999, None, True),  # β₁ = 0, the Mogrifier paper's choice
        (0.9, 0.9, None, True),
        (0.9, 0.999, 0.1, True),
        (0.9, 0.999, 0.1, False),
        (0.5, 0.7, None, True),  # ρ∞ = 5.67: rectification starts at t = 10
    ],
)
def test_matches_torch_definition_at_every_step(
    beta_1, beta_2, weight_decay, decoupled
):
    steps = 16
    params, grads = _problem(steps)
    lr, eps = 0.01, 1e-8
    expected, rectified = radam_reference(
        params, grads, lr, beta_1, beta_2, eps, weight_decay or 0.0, decoupled
    )
    # The steps cross ρ_t = 5: both kinds of update are exercised.
    assert not rectified[0] and rectified[-1]

    variables = [keras.Variable(p.astype("float32")) for p in params]
    optimizer = RectifiedAdam(
        learning_rate=lr,
        beta_1=beta_1,
        beta_2=beta_2,
        epsilon=eps,
        weight_decay=weight_decay,
        decoupled_weight_decay=decoupled,
    )
    for t in range(steps):
        optimizer.apply([g.astype("float32") for g in grads[t]], variables)
        for variable, want in zip(variables, expected[t]):
            np.testing.assert_allclose(
                ops.convert_to_numpy(variable), want, rtol=2e-6, atol=2e-6,
                err_msg=f"step {t + 1}",
            )


@pytest.mark.parametrize("beta_2", [0.9, 0.99, 0.999, 0.9999, 0.7])
def test_rho_schedule_is_accurate_in_float32(beta_2):
    t = np.arange(1, 20001, dtype=np.float64)
    rho_inf = 2.0 / (1.0 - beta_2) - 1.0
    rho_exact = rho_inf - 2.0 * t * beta_2**t / (1.0 - beta_2**t)
    _, sqrt_bc2, rho, rect = RectifiedAdam(beta_2=beta_2)._step_constants(
        ops.convert_to_tensor(t.astype("float32"))
    )
    rho = ops.convert_to_numpy(rho).astype(np.float64)
    np.testing.assert_allclose(rho, rho_exact, rtol=1e-6)
    np.testing.assert_array_equal(rho > 5.0, rho_exact > 5.0)
    np.testing.assert_allclose(
        ops.convert_to_numpy(sqrt_bc2), np.sqrt(1.0 - beta_2**t), rtol=1e-6
    )
    above = rho_exact > 5.0
    r = rho_exact[above]
    rect_exact = np.sqrt(
        (r - 4) * (r - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * r)
    )
    np.testing.assert_allclose(
        ops.convert_to_numpy(rect)[above], rect_exact, rtol=2e-6
    )


def test_fit_with_jit_compile_and_global_clipnorm_matches_reference():
    # Linear least squares, one full batch per step: the gradient is known.
    rng = np.random.default_rng(1)
    x = rng.normal(size=(16, 3)).astype("float32")
    y = rng.normal(size=(16, 1)).astype("float32")
    w0 = rng.normal(size=(3, 1)).astype("float32")
    steps, lr, clip = 12, 0.05, 1.0

    reference = TorchRAdam(lr, 0.9, 0.999, 1e-8)
    w = w0.astype(np.float64)
    for _ in range(steps):
        g = 2.0 / len(x) * x.T.astype(np.float64) @ (x @ w - y)
        g = g * min(1.0, clip / np.linalg.norm(g))
        [w], _ = reference.step([w], [g])

    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(1, use_bias=False)]
    )
    model.layers[0].kernel.assign(w0)
    model.compile(
        optimizer=RectifiedAdam(lr, global_clipnorm=clip),
        loss="mse",
        jit_compile=True,
    )
    model.fit(x, y, batch_size=16, epochs=steps, shuffle=False, verbose=0)
    np.testing.assert_allclose(
        ops.convert_to_numpy(model.layers[0].kernel), w, rtol=1e-5, atol=1e-6
    )


def test_embedding_gradients_match_dense_reference():
    # Embedding gradients arrive as sparse slices on TensorFlow.
    rng = np.random.default_rng(2)
    table0 = rng.normal(size=(5, 2)).astype("float32")
    ids = np.array([[0], [3], [3], [1]])
    target = rng.normal(size=(4, 2)).astype("float32")
    model = keras.Sequential(
        [keras.Input((1,), dtype="int32"), keras.layers.Embedding(5, 2),
         keras.layers.Flatten()]
    )
    model.layers[0].embeddings.assign(table0)
    model.compile(optimizer=RectifiedAdam(0.1), loss="mse")
    steps = 8
    model.fit(ids, target, batch_size=4, epochs=steps, shuffle=False, verbose=0)

    reference = TorchRAdam(0.1, 0.9, 0.999, 1e-8)
    table = table0.astype(np.float64)
    for _ in range(steps):
        g = np.zeros_like(table)
        for i, row in enumerate(ids[:, 0]):
            g[row] += 2.0 / target.size * (table[row] - target[i])
        [table], _ = reference.step([table], [g])
    np.testing.assert_allclose(
        ops.convert_to_numpy(model.layers[0].embeddings), table, rtol=1e-5,
        atol=1e-6,
    )


def test_ema_averages_the_radam_iterates():
    steps = 8
    params, grads = _problem(steps, seed=3)
    expected, _ = radam_reference(params, grads, 0.01, 0.9, 0.999, 1e-8)
    variables = [keras.Variable(p.astype("float32")) for p in params]
    optimizer = RectifiedAdam(0.01, use_ema=True, ema_momentum=0.8)
    for t in range(steps):
        optimizer.apply([g.astype("float32") for g in grads[t]], variables)
    # Keras's EMA: the first step copies the weights, then 0.8 / 0.2.
    ema = [p.copy() for p in expected[0]]
    for step in expected[1:]:
        ema = [0.8 * a + 0.2 * p for a, p in zip(ema, step)]
    optimizer.finalize_variable_values(variables)
    for variable, want in zip(variables, ema):
        np.testing.assert_allclose(ops.convert_to_numpy(variable), want, rtol=1e-5,
                                   atol=1e-6)


def test_gradient_accumulation_counts_updates():
    params, grads = _problem(12, seed=4)
    # Pairs of gradients are averaged into one update; t counts updates.
    averaged = [
        [(a + b) / 2 for a, b in zip(grads[2 * k], grads[2 * k + 1])]
        for k in range(6)
    ]
    expected, _ = radam_reference(params, averaged, 0.01, 0.9, 0.999, 1e-8)
    variables = [keras.Variable(p.astype("float32")) for p in params]
    optimizer = RectifiedAdam(0.01, gradient_accumulation_steps=2)
    for g in grads:
        optimizer.apply([x.astype("float32") for x in g], variables)
    for variable, want in zip(variables, expected[-1]):
        np.testing.assert_allclose(ops.convert_to_numpy(variable), want, rtol=1e-5,
                                   atol=1e-6)


def test_mixed_float16_fit_uses_loss_scaling():
    keras.config.set_dtype_policy("mixed_float16")
    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)]
    )
    model.compile(optimizer=RectifiedAdam(1e-2), loss="mse")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert isinstance(model.optimizer.inner_optimizer, RectifiedAdam)
    x = np.random.default_rng(5).normal(size=(32, 3)).astype("float32")
    history = model.fit(x, x[:, :1], batch_size=8, epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    assert all(np.all(np.isfinite(ops.convert_to_numpy(w))) for w in model.weights)


def test_config_round_trip_and_resume_after_save(tmp_path):
    optimizer = RectifiedAdam(
        learning_rate=3e-3, beta_1=0.0, beta_2=0.99, epsilon=1e-6,
        weight_decay=0.01, decoupled_weight_decay=False, global_clipnorm=10.0,
    )
    config = optimizer.get_config()
    revived = RectifiedAdam.from_config(config)
    assert revived.get_config() == config
    revived = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(revived, RectifiedAdam)
    assert revived.get_config() == config

    rng = np.random.default_rng(6)
    x = rng.normal(size=(16, 3)).astype("float32")
    y = rng.normal(size=(16, 1)).astype("float32")

    def make_model():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer=RectifiedAdam(0.05), loss="mse")
        return model

    straight = make_model()
    straight.fit(x, y, batch_size=16, epochs=8, shuffle=False, verbose=0)
    resumed = make_model()
    resumed.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0)
    path = tmp_path / "model.keras"
    resumed.save(path)
    resumed = keras.saving.load_model(path)
    assert isinstance(resumed.optimizer, RectifiedAdam)
    resumed.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0)
    for a, b in zip(straight.weights, resumed.weights):
        np.testing.assert_allclose(
            ops.convert_to_numpy(a), ops.convert_to_numpy(b), rtol=1e-6, atol=1e-7
        )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"beta_1": 1.0}, "beta_1"),
        ({"beta_2": -0.1}, "beta_2"),
        ({"epsilon": -1.0}, "epsilon"),
        ({"weight_decay": -0.5}, "weight_decay"),
        ({"decoupled_weight_decay": "yes"}, "decoupled_weight_decay"),
    ],
)
def test_invalid_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RectifiedAdam(**kwargs)

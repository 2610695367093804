"""The update rules of dynamic evaluation, one function per rule, in `keras.ops`.

Krause et al. (2018) build their rule up in steps (§5, Table 1); each step is
one rule here. A rule maps one adapted variable's current value `theta`, the
gradient `gradient` of the segment's mean token loss, the trained value
`theta_g` and the RMS of the gradient statistics `rms` (all of the variable's
shape) to the new value, given `hyperparameters = [η, ε, λ, mean(RMS)]` (a
float32 vector, so that changing a setting recompiles nothing). Both terms of
every rule use θ before the step. The backends compile the rules (see
`keras_mogrifier.backend`); the rules are the same on every backend.

| name | equation (Krause et al.) | statistics |
| --- | --- | --- |
| `"sgd"` | eq. 4: `θ − η g + λ (θ_g − θ)`; λ = 0 is plain SGD, and with segments of one token (n = 1 in eq. 2, their segmentation) Mikolov's "traditional dynamic evaluation", which the paper describes in words (§4-5) without an equation number | not needed |
| `"rms_global_prior"` | eq. 6: `θ − η g / (RMS + ε) + λ (θ_g − θ)` | needed |
| `"rms_rms_prior"` | eq. 8: `θ − η g / (RMS + ε) + min(1, λ RMS / mean(RMS)) (θ_g − θ)` | needed |
"""

from keras import ops

# For each rule: whether it reads the gradient statistics (RMS).
NEEDS_STATISTICS = {
    "sgd": False,
    "rms_global_prior": True,
    "rms_rms_prior": True,
}
UPDATE_RULES = tuple(NEEDS_STATISTICS)


def _terms(theta, gradient, rms, hyperparameters):
    dtype = theta.dtype
    learning_rate, epsilon, decay_rate, mean_rms = (
        ops.cast(hyperparameters[k], dtype) for k in range(4)
    )
    return (
        ops.cast(gradient, dtype),
        ops.cast(rms, dtype),
        learning_rate,
        epsilon,
        decay_rate,
        mean_rms,
    )


def sgd(theta, gradient, theta_g, rms, hyperparameters):
    """Eq. 4 (plain SGD with λ = 0): `θ − η g + λ (θ_g − θ)`; `rms` is unused."""
    g, _, learning_rate, _, decay_rate, _ = _terms(theta, gradient, rms, hyperparameters)
    return theta - learning_rate * g + decay_rate * (theta_g - theta)


def rms_global_prior(theta, gradient, theta_g, rms, hyperparameters):
    """Eq. 6: `θ − η g / (RMS + ε) + λ (θ_g − θ)`, the same decay everywhere."""
    g, r, learning_rate, epsilon, decay_rate, _ = _terms(
        theta, gradient, rms, hyperparameters
    )
    return theta - learning_rate * g / (r + epsilon) + decay_rate * (theta_g - theta)


def rms_rms_prior(theta, gradient, theta_g, rms, hyperparameters):
    """Eq. 8, the default rule.

    ```
    θ ← θ − η · g / (RMS + ε) + min(1, λ · RMS / mean(RMS)) ⊙ (θ_g − θ)
    ```
    """
    g, r, learning_rate, epsilon, decay_rate, mean_rms = _terms(
        theta, gradient, rms, hyperparameters
    )
    decay = ops.minimum(ops.ones((), theta.dtype), decay_rate * r / mean_rms)
    return theta - learning_rate * g / (r + epsilon) + decay * (theta_g - theta)


def get(name):
    """The rule function called `name` (one of `UPDATE_RULES`)."""
    return {
        "sgd": sgd,
        "rms_global_prior": rms_global_prior,
        "rms_rms_prior": rms_rms_prior,
    }[name]

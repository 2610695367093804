"""The update rules of dynamic evaluation, written once in `keras.ops`.

A rule maps one adapted variable's current value `theta`, the gradient
`gradient` of the segment's mean loss, the trained value `theta_g` and the
root mean squared gradient `rms` (all of the variable's shape) to the new
value, given `hyperparameters = [η, ε, λ, mean(RMS)]` (a float32 vector, so
that changing a setting does not recompile anything). The backends compile
the rule (see `keras_mogrifier.backend`); the rule itself is the same on
every backend.
"""

from keras import ops


def rms_rms_prior(theta, gradient, theta_g, rms, hyperparameters):
    """Krause et al. (2018) eq. 8, the default rule.

    ```
    θ ← θ − η · g / (RMS + ε) + min(1, λ · RMS / mean(RMS)) ⊙ (θ_g − θ)
    ```

    Both terms use θ before the step.
    """
    dtype = theta.dtype
    learning_rate, epsilon, decay_rate, mean_rms = (
        ops.cast(hyperparameters[k], dtype) for k in range(4)
    )
    rms = ops.cast(rms, dtype)
    gradient = ops.cast(gradient, dtype)
    decay = ops.minimum(ops.ones((), dtype), decay_rate * rms / mean_rms)
    step = learning_rate * gradient / (rms + epsilon)
    return theta - step + decay * (theta_g - theta)

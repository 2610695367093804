"""Shared accumulator of the token-level metrics: total nats, total tokens."""

import warnings

import keras
import numpy as np
from keras import ops

from keras_mogrifier.losses.token_nll import _concrete_value
from keras_mogrifier.losses.token_nll import get_keras_mask
from keras_mogrifier.losses.token_nll import token_nll


def _broadcast_weights(weights, values):
    weights = ops.cast(ops.convert_to_tensor(weights), values.dtype)
    # Per-sequence weights `(batch,)` (or any prefix of the token axes) are
    # expanded over the trailing token axes.
    while len(weights.shape) < len(values.shape):
        weights = ops.expand_dims(weights, -1)
    return ops.broadcast_to(weights, ops.shape(values))


class TokenNLLMetric(keras.metrics.Metric):
    """Base class: accumulates Σ w·nll and Σ w over batches (see subclasses).

    `result()` is computed by subclasses from `mean_nats()`, the
    token-weighted mean loss in nats over everything seen since the last
    `reset_state()`. Batches of different lengths therefore count by their
    number of tokens, not equally. Over zero tokens (total weight 0) the
    result is NaN, and read eagerly it also warns that there were no tokens
    (a NaN is never mistaken for a score). Sample weights must be finite and
    non-negative: concrete ones (eager calls) are checked, with a
    `ValueError` before anything is accumulated.
    """

    def __init__(self, name, dtype=None):
        super().__init__(name=name, dtype=dtype)
        # Lower is better (read by callbacks such as EarlyStopping).
        self._direction = "down"
        self.total_nats = self.add_variable(
            shape=(), initializer="zeros", dtype=self.dtype, name="total_nats"
        )
        self.total_tokens = self.add_variable(
            shape=(), initializer="zeros", dtype=self.dtype, name="total_tokens"
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        if sample_weight is not None:
            value = _concrete_value(sample_weight)
            if value is not None:
                value = np.asarray(value, "float64")
                bad = ~np.isfinite(value) | (value < 0)
                if bad.any():
                    raise ValueError(
                        "Expected `sample_weight` to be finite and "
                        "non-negative (a token's weight in the mean). "
                        f"Received: {float(value[bad].flat[0])} at index "
                        f"{tuple(int(i) for i in np.argwhere(bad)[0])}"
                    )
        mask = get_keras_mask(y_pred)
        nll = ops.cast(token_nll(y_true, y_pred), self.dtype)
        weights = ops.ones_like(nll)
        if sample_weight is not None:
            weights = weights * _broadcast_weights(sample_weight, nll)
        if mask is not None:
            weights = weights * _broadcast_weights(mask, nll)
        # `where` rather than a product: a token of weight 0 contributes 0
        # even if its loss is infinite.
        contribution = ops.where(
            ops.not_equal(weights, 0), nll * weights, ops.zeros_like(nll)
        )
        self.total_nats.assign_add(ops.sum(contribution))
        self.total_tokens.assign_add(ops.sum(weights))

    def reset_state(self):
        self.total_nats.assign(ops.zeros((), self.total_nats.dtype))
        self.total_tokens.assign(ops.zeros((), self.total_tokens.dtype))

    def mean_nats(self):
        """The token-weighted mean negative log-likelihood (nats).

        NaN over zero tokens (nothing seen, or every weight 0): there is no
        score, and NaN cannot be mistaken for a perfect one. Read eagerly,
        it then warns (`RuntimeWarning`) that there were no tokens.
        """
        tokens = _concrete_value(self.total_tokens.value)
        if tokens is not None and float(tokens) == 0.0:
            warnings.warn(
                f"`{self.name}` over zero tokens: nothing was seen since the "
                "last `reset_state()`, or every token had weight 0. The "
                "result is NaN (there is no score).",
                RuntimeWarning,
                stacklevel=3,
            )
        return ops.divide(self.total_nats, self.total_tokens)

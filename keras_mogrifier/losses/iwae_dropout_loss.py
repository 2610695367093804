"""The multi-sample (IWAE-style) dropout objective of Circling Back §4."""

import keras
from keras import ops

from keras_mogrifier._export import register
from keras_mogrifier._validation import optional_positive_int
from keras_mogrifier.losses.token_nll import token_nll


@register
class IWAEDropoutLoss(keras.losses.Loss):
    """Negative log of the dropout-averaged probability of each target token.

    Each sequence of the batch is run D times with independent dropout masks;
    the loss of token `w_t` averages the D model *probabilities* before the
    log, a per-token log-mean-exp:

    `loss_t = -log((1/D) Σ_d softmax(logits_d)[w_t])
            = -(logsumexp_d log_softmax(logits_d)[w_t] - ln D)`.

    This is a tighter bound on the log-likelihood of the dropout ensemble than
    the mean of the D cross-entropies (which is just dropout with a D times
    larger batch). With D = 1 it is the ordinary sparse categorical
    cross-entropy from logits. The computation uses log-softmax and
    log-sum-exp only, so it is finite for logits of any magnitude.

    The default reduction, `"mean_with_sample_weight"`, returns the weighted
    mean over tokens `Σ w_t loss_t / Σ w_t`, so `exp(loss)` is the perplexity
    of the (unpadded) tokens: a `sample_weight` of 0, or a Keras mask on
    `y_pred`, drops a token from both sums. Without weights or mask it is the
    plain mean over all tokens, identical to
    `keras.losses.SparseCategoricalCrossentropy(from_logits=True)` when D = 1.

    Token ids must be in `[0, vocab)` everywhere, padded positions included.
    Eager calls raise a `ValueError` for any other id; inside a compiled
    train step, where values are unknown while tracing, such a token's loss
    is NaN (never a silently wrong number).

    Args:
        samples: int or `None`. The number D of dropout samples. When set,
            `y_pred` must have a sample axis of exactly this size (D = 1 also
            accepts logits without a sample axis) and a `ValueError` names any
            other shape. `None` accepts both layouts and reads D from
            `y_pred`. Defaults to `None`.
        name: str. Name of the loss. Defaults to `"iwae_dropout_loss"`.
        reduction: str. A Keras loss reduction. Defaults to
            `"mean_with_sample_weight"`.
        dtype: str or `keras.DTypePolicy`. Dtype of the computation; half
            precision logits are promoted to float32. Defaults to `None`
            (`keras.backend.floatx()`).

    Call arguments:
        y_true: int tensor of shape `(batch, time)`: the target ids.
        y_pred: float tensor of logits, `(batch, samples, time, vocab)`, or
            `(batch, time, vocab)` for a single sample.
        sample_weight: optional float tensor, `(batch, time)` or `(batch,)`.

    Example:

    >>> import numpy as np
    >>> loss = IWAEDropoutLoss()
    >>> logits = np.random.default_rng(0).normal(size=(2, 4, 3, 7))
    >>> ids = np.array([[1, 2, 3], [4, 5, 6]])
    >>> float(loss(ids, logits)) > 0
    True

    Reference:
        Melis, G. "Circling Back to Recurrent Models of Language", 2022, §4.
        Burda, Grosse, Salakhutdinov. "Importance Weighted Autoencoders",
        ICLR 2016.
    """

    def __init__(
        self,
        samples=None,
        name="iwae_dropout_loss",
        reduction="mean_with_sample_weight",
        dtype=None,
    ):
        self.samples = optional_positive_int("samples", samples)
        super().__init__(name=name, reduction=reduction, dtype=dtype)

    def __call__(self, y_true, y_pred, sample_weight=None):
        if sample_weight is not None:
            # Per-sequence weights `(batch,)` count once per token, so that
            # the weighted mean divides by the total weight of the tokens.
            ids = ops.convert_to_tensor(y_true)
            sample_weight = ops.convert_to_tensor(sample_weight, self.dtype)
            while len(sample_weight.shape) < len(ids.shape):
                sample_weight = ops.expand_dims(sample_weight, -1)
            sample_weight = ops.broadcast_to(sample_weight, ops.shape(ids))
        return super().__call__(y_true, y_pred, sample_weight=sample_weight)

    def call(self, y_true, y_pred):
        return token_nll(y_true, y_pred, samples=self.samples)

    def get_config(self):
        config = super().get_config()
        config.update({"samples": self.samples, "dtype": self._dtype_policy.name})
        return config

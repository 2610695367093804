"""Perplexity: exp of the token-weighted mean negative log-likelihood."""

from keras import ops

from keras_mogrifier._export import register
from keras_mogrifier.metrics._token_nll_metric import TokenNLLMetric


@register
class Perplexity(TokenNLLMetric):
    """Perplexity of a language model, accumulated over batches.

    Keeps two running sums over every batch since the last reset: the total
    loss in nats `Σ w_t · nll_t` and the total weight of the predicted tokens
    `Σ w_t`, and reports

    `perplexity = exp(Σ w_t · nll_t / Σ w_t)`,

    the perplexity of all tokens seen (not a mean of per-batch perplexities).
    `nll_t` is the negative log-softmax of the target from logits; when the
    logits have a sample axis `(batch, samples, time, vocab)` it is the loss
    of the dropout-averaged probability (log-mean-exp over samples, as in
    `IWAEDropoutLoss`). A Keras mask on `y_pred` and `sample_weight` (per
    token `(batch, time)` or per sequence `(batch,)`) weigh the tokens;
    padded tokens get weight 0. See `keras_mogrifier.losses.token_nll` for
    the id checks. Over zero tokens (nothing seen, or every weight 0) the
    result is NaN, not a perfect score of 1, and reading it eagerly warns
    that there were no tokens. Negative or non-finite sample weights are
    refused (`ValueError`) when their values are known (eager calls).

    Args:
        name: str. Name of the metric, which is also its key in the logs of
            `fit`/`evaluate` (`perplexity`, `val_perplexity`). Defaults to
            `"perplexity"`.
        dtype: str. Dtype of the two accumulators and of the result. Use
            `"float64"` for exact sums over very long evaluations. Defaults to
            `None` (`keras.backend.floatx()`).

    Example:

    >>> import numpy as np
    >>> metric = Perplexity()
    >>> metric.update_state(np.zeros((2, 3), "int32"), np.zeros((2, 3, 10)))
    >>> round(float(metric.result()), 4)   # uniform over 10 tokens
    10.0

    In `compile`: `model.compile(loss=..., weighted_metrics=[Perplexity()])`.
    Keras passes `sample_weight` only to `weighted_metrics` (Keras masks
    reach both lists); `metrics=[Perplexity()]` works too, but counts
    padded tokens whose weight is 0. Without sample weights both lists
    give the same value. The log key is the metric's name either way.

    Reference:
        Jelinek, Mercer, Bahl, Baker. "Perplexity—a measure of the difficulty
        of speech recognition tasks", JASA 1977.
    """

    def __init__(self, name="perplexity", dtype=None):
        super().__init__(name=name, dtype=dtype)

    def result(self):
        return ops.exp(self.mean_nats())

"""Bits per character: the token-weighted mean loss in bits."""

import math

from keras_mogrifier._export import register
from keras_mogrifier.metrics._token_nll_metric import TokenNLLMetric


@register
class BitsPerCharacter(TokenNLLMetric):
    """Bits per character (bpc) of a language model, accumulated over batches.

    Keeps the total loss in nats `Σ w_t · nll_t` and the total token weight
    `Σ w_t` over every batch since the last reset, and reports

    `bpc = Σ w_t · nll_t / Σ w_t / ln 2`.

    `nll_t`, the sample axis, masks and `sample_weight` are handled exactly as
    in `Perplexity` (one token = one character at character level; for word
    tokens the same number is "bits per word"). Over zero tokens (nothing
    seen, or every weight 0) the result is NaN, not a perfect score of 0.

    Args:
        name: str. Name of the metric and its key in the logs of
            `fit`/`evaluate` (`bpc`, `val_bpc`). Defaults to `"bpc"`.
        dtype: str. Dtype of the accumulators and of the result. Defaults to
            `None` (`keras.backend.floatx()`).

    Example:

    >>> import numpy as np
    >>> metric = BitsPerCharacter()
    >>> metric.update_state(np.zeros((2, 3), "int32"), np.zeros((2, 3, 4)))
    >>> round(float(metric.result()), 4)   # uniform over 4 characters
    2.0

    Reference:
        Graves, A. "Generating Sequences With Recurrent Neural Networks",
        arXiv:1308.0850, 2013.
    """

    def __init__(self, name="bpc", dtype=None):
        super().__init__(name=name, dtype=dtype)

    def result(self):
        return self.mean_nats() / math.log(2.0)

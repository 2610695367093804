"""Top-p (nucleus) sampling."""

from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier._export import register
from keras_mogrifier.samplers.sampler import Sampler
from keras_mogrifier.samplers.sampler import sample_from


@register
class TopPSampler(Sampler):
    """Draws the next token from the nucleus of the distribution.

    As `keras_hub.samplers.TopPSampler`: with the (tempered) probabilities
    sorted in decreasing order, the nucleus is the most probable token and
    every following one while the cumulative probability before it is
    below `p` — the smallest set of most probable tokens whose total
    reaches `p`. Its tokens keep their probabilities, renormalised; no
    other token can come out. With `k`, only the `k` most probable tokens
    are considered (and sorted), which is faster for a large vocabulary.

    Args:
        p: float in `(0, 1]`. Defaults to `0.1`.
        k: int or `None`. Defaults to `None` (the whole vocabulary).
        temperature: float. Defaults to `1.0`.

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> logits = np.log(np.array([[0.1, 0.5, 0.15, 0.25]], "float32"))
    >>> ops.convert_to_numpy(TopPSampler(p=0.6)(logits, np.array([0.99], "float32"))).tolist()
    [3]
    """

    def __init__(self, p=0.1, k=None, temperature=1.0):
        super().__init__(temperature=temperature)
        if not (_validation._is_real(p) and 0.0 < p <= 1.0):
            raise ValueError(f"Expected `p` to be a float in (0, 1]. Received: p={p!r}")
        self.p = float(p)
        self.k = _validation.optional_positive_int("k", k)

    def get_next_token(self, probabilities, uniform):
        vocabulary = probabilities.shape[-1]
        k = vocabulary if self.k is None else min(self.k, vocabulary)
        top, indices = ops.top_k(probabilities, k=k, sorted=True)
        # The probability of the tokens before each one: the first is
        # always kept, the others while the nucleus has not reached `p`.
        cumulative = ops.cumsum(top, axis=-1)
        before = ops.concatenate(
            [ops.zeros_like(cumulative[:, :1]), cumulative[:, :-1]], axis=-1
        )
        keep = ops.less(before, self.p)
        position = sample_from(ops.where(keep, top, ops.zeros_like(top)), uniform)
        return ops.take_along_axis(indices, position[:, None], axis=-1)[:, 0]

    def get_config(self):
        return {**super().get_config(), "p": self.p, "k": self.k}

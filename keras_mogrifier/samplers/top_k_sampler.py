"""Top-k sampling."""

from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier._export import register
from keras_mogrifier.samplers.sampler import Sampler
from keras_mogrifier.samplers.sampler import sample_from


@register
class TopKSampler(Sampler):
    """Draws the next token among the `k` most probable ones.

    As `keras_hub.samplers.TopKSampler`: the `k` most probable tokens keep
    their (tempered) probabilities, renormalised; no other token can come
    out. `k` larger than the vocabulary means the whole vocabulary.

    Args:
        k: int. Defaults to `5`.
        temperature: float. Defaults to `1.0`.

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> logits = np.log(np.array([[0.1, 0.5, 0.15, 0.25]], "float32"))
    >>> ops.convert_to_numpy(TopKSampler(k=2)(logits, np.array([0.9], "float32"))).tolist()
    [3]
    """

    def __init__(self, k=5, temperature=1.0):
        super().__init__(temperature=temperature)
        self.k = _validation.positive_int("k", k)

    def get_next_token(self, probabilities, uniform):
        k = min(self.k, probabilities.shape[-1])
        top, indices = ops.top_k(probabilities, k=k, sorted=True)
        position = sample_from(top, uniform)
        return ops.take_along_axis(indices, position[:, None], axis=-1)[:, 0]

    def get_config(self):
        return {**super().get_config(), "k": self.k}
